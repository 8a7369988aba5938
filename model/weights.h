// The internal description of a DeepSeek-V4 model's weights (one tensor-parallel shard of them), and the
// loader that fills it from a checkpoint in either naming (DeepSeek's `layers.N.attn.wq_a.weight` or
// transformers' `model.layers.N.self_attn.q_a_proj.weight`), dense or EXL3 per linear.
#pragma once

#include <string>
#include <vector>

#include "common/safetensors.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/model.h"

namespace dsmesh {

struct HcWeights {
  Tensor fn, base, scale;  // f32 [(2+hc)*hc, hc*D], [(2+hc)*hc], [3]   (head: [hc, hc*D], [hc], [1])
};

struct CompressorWeights {
  LinearWeight wkv, wgate;  // [c*d_out, D]
  Tensor ape;               // f32 [ratio, c*d_out]
  Tensor norm;              // [d_out]
};

struct AttentionWeights {
  LinearWeight wq_a;    // [q_lora, D]
  Tensor q_norm;        // [q_lora]
  LinearWeight wq_b;    // [local_heads*d, q_lora]          (rank's heads)
  LinearWeight wkv;     // [d, D]
  Tensor kv_norm;       // [d]
  LinearWeight wo_a;    // [local_groups*o_lora, heads_per_group*d] (rank's groups)
  LinearWeight wo_b;    // [D, local_groups*o_lora]          (rank's input columns)
  Tensor sinks;         // f32 [local_heads]
  CompressorWeights compressor;        // ratio > 0
  LinearWeight indexer_wq_b;           // CSA: [index_heads*index_dim, q_lora]
  LinearWeight indexer_weights_proj;   // CSA: [index_heads, D]
  CompressorWeights indexer_compressor;  // CSA
};

struct MoeWeights {
  LinearWeight gate;    // router [E, D]
  Tensor bias;          // f32 [E] (routed layers)
  Tensor bias_vl;       // f32 [E] image rows' router bias, every layer of a vision model (empty otherwise)
  Tensor tid2eid;       // int [vocab, k] (hash layers)
  std::vector<ExpertWeights> experts;  // E experts, rank's slice of the intermediate dim
  ExpertWeights shared;
  bool has_shared = false;
};

struct BlockWeights {
  int layer = 0;
  AttentionKind kind = AttentionKind::kSliding;
  int ratio = 0;
  Tensor attn_norm, ffn_norm;
  HcWeights hc_attn, hc_ffn;
  AttentionWeights attn;
  MoeWeights moe;
};

// MTP block (kept for speculative decoding; not run by Model::Forward yet).
struct MtpWeights {
  LinearWeight e_proj, h_proj;
  Tensor enorm, hnorm, norm;
  HcWeights hc_head;
  BlockWeights block;
};

// DeepSeek-V4-Flash-Vision's ViT block (tensors `vision.blocks.N.*`; vLLM's common/vision.py names), this
// rank's shard of it: with the tower split over `tower_world` ranks (VisionWeights), rank r holds heads
// [r*lh, (r+1)*lh) (lh = n_heads / tower_world) and SwiGLU columns [r*li, (r+1)*li) (li = inter_dim / world).
struct VisionBlockWeights {
  Tensor norm1, norm2;      // f32 [dim]
  LinearWeight wq, wk, wv;  // the rank's heads' rows of the fused attn.wqkv [3dim, dim] + bias: q rows
                            // [h0*hd, h1*hd), k rows dim + those, v rows 2dim + those (column-parallel)
  LinearWeight wo;          // attn.wo [dim, dim]: the rank's heads' input columns (row-parallel); its bias
                            // only on rank 0 of the split, so the all-reduced sum adds it once
  ExpertWeights mlp;        // SwiGLU, no biases: w1/w3 = the rank's gate/up rows of the fused mlp.w1 [2I, dim],
                            // w2 = the matching input columns of mlp.w2 [dim, I] (row-parallel)
};

// The vision tower (ViT + aligner) and the learned embeddings of the image block's sentinel tokens: this
// rank's shard of the ViT blocks and of the aligner (column-parallel first linear, row-parallel second),
// the rest (patch_embed, norms, sentinels) replicated. A world of 1 means that part is whole on every rank.
struct VisionWeights {
  LinearWeight patch_embed;                 // vision.patch_embed.proj [dim, 3*p*p] + bias
  std::vector<VisionBlockWeights> blocks;
  Tensor norm;                              // vision.norm f32 [dim]
  LinearWeight aligner_w1, aligner_w2;      // [hidden, dim*r*r] + bias, [hidden, hidden] + bias
  Tensor image_start, image_pad, image_newline, image_end;  // f32 [hidden]
  int tower_world = 1;    // ranks the ViT blocks are split over (1: replicated)
  int local_heads = 0;    // ViT heads held by this rank (n_heads / tower_world)
  int aligner_world = 1;  // ranks the aligner is split over (1: replicated)
  size_t bytes = 0;       // tower, aligner and sentinel bytes held by this rank
};

struct ModelWeights {
  Tensor embed;         // [vocab, D] (replicated); an F8_E4M3 + scale checkpoint table is dequantized to bf16
  LinearWeight head;    // [vocab rows of this rank, D]
  int64_t head_rows_begin = 0, head_rows_per_rank = 0;  // vocab split: rank r holds rows r*per..
  // The drafts' head (Model::SetDraftVocabulary): head rows [0, draft_rows) whole on every rank, so the MTP
  // passes need no collective; draft_rows 0 when the drafts use the whole head.
  LinearWeight draft_head;
  int64_t draft_rows = 0;
  size_t draft_head_bytes = 0;  // part of `bytes`
  Tensor norm;
  HcWeights hc_head;
  std::vector<BlockWeights> layers;
  std::vector<MtpWeights> mtp;
  VisionWeights vision;  // loaded when config.vision.n_layers > 0
  size_t bytes = 0;     // weight bytes held by this rank
  // How the checkpoint stored them (for the load log line and tests).
  std::string embed_storage;  // "BF16", "F8_E4M3 + F32 scale [129280, 1] (dequantized to BF16)", ...
  int head_bits = 0;          // K of an EXL3 head, 0 when dense
  int exl3_linears = 0, dense_linears = 0;
};

// One line: "embedding F8_E4M3 + ... , head EXL3 K6, 243 EXL3 + 10 dense linears, 12.3 MiB on this rank",
// with a draft head "; draft head: rows [0, 32768) on every rank, 64.0 MiB",
// and for a vision model how its tower is split: "; vision tower 0.5 MiB on this rank (ViT heads 2 of 4,
// split over 2 ranks; aligner split over 2 ranks)".
std::string DescribeWeights(const ModelWeights& w);

// Tensor-parallel layout derived from the config and the shard.
struct ShardLayout {
  int rank = 0, world = 1;
  int local_groups = 0, local_heads = 0, first_head = 0;
  int64_t local_inter = 0;  // moe_intermediate_size / world
  // The vision tower's split (docs/vision.md): the ViT blocks over `world` ranks when vision_n_heads and
  // vision_inter_dim both divide by it, else replicated (vision_world 1); the aligner when hidden_size does.
  int vision_world = 1, vision_rank = 0;
  int aligner_world = 1, aligner_rank = 0;
};
ShardLayout MakeShardLayout(const ModelConfig& config, const ShardSpec& shard);
// Only rank, world and the vision tower's split (no language-model divisibility checks): for tests and
// tools that load the tower alone.
ShardLayout MakeVisionShardLayout(const ModelConfig& config, const ShardSpec& shard);

ModelWeights LoadWeights(const Checkpoint& ckpt, const ModelConfig& config, const ShardLayout& layout,
                         Backend& backend);

// Only the vision tower and sentinel embeddings (config.vision.n_layers > 0), for tests and tools that
// run the tower without the language model: whole, or the shard of `layout` (MakeShardLayout).
VisionWeights LoadVisionWeights(const Checkpoint& ckpt, const ModelConfig& config, Backend& backend);
VisionWeights LoadVisionWeights(const Checkpoint& ckpt, const ModelConfig& config, const ShardLayout& layout,
                                Backend& backend);

// Head rows [0, rows) whole (not split by rank): the drafts' vocabulary (ModelWeights::draft_head), from the
// same tensor as the head (dense, EXL3, or the tied embedding). *bytes: what the copy takes on this rank
// (for an EXL3 head, the 128-row blocks it touches).
LinearWeight LoadHeadRows(const Checkpoint& ckpt, const ModelConfig& config, Backend& backend, int64_t rows,
                          size_t* bytes);

struct SyntheticSpec;  // model/testing/synthetic.h
// The same rows of a synthetic model's head.
LinearWeight LoadSyntheticHeadRows(const SyntheticSpec& spec, const ModelConfig& config, Backend& backend,
                                   int64_t rows, size_t* bytes);
// The same weights built from a seed (model/testing/synthetic.h), printing progress per layer on stderr.
ModelWeights LoadSyntheticWeights(const SyntheticSpec& spec, const ModelConfig& config, const ShardLayout& layout,
                                  Backend& backend);

}  // namespace dsmesh
