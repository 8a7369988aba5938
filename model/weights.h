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

struct ModelWeights {
  Tensor embed;         // [vocab, D] (replicated); an F8_E4M3 + scale checkpoint table is dequantized to bf16
  LinearWeight head;    // [vocab rows of this rank, D]
  int64_t head_rows_begin = 0, head_rows_per_rank = 0;  // vocab split: rank r holds rows r*per..
  Tensor norm;
  HcWeights hc_head;
  std::vector<BlockWeights> layers;
  std::vector<MtpWeights> mtp;
  size_t bytes = 0;     // weight bytes held by this rank
  // How the checkpoint stored them (for the load log line and tests).
  std::string embed_storage;  // "BF16", "F8_E4M3 + F32 scale [129280, 1] (dequantized to BF16)", ...
  int head_bits = 0;          // K of an EXL3 head, 0 when dense
  int exl3_linears = 0, dense_linears = 0;
};

// One line: "embedding F8_E4M3 + ... , head EXL3 K6, 243 EXL3 + 10 dense linears, 12.3 MiB on this rank".
std::string DescribeWeights(const ModelWeights& w);

// Tensor-parallel layout derived from the config and the shard.
struct ShardLayout {
  int rank = 0, world = 1;
  int local_groups = 0, local_heads = 0, first_head = 0;
  int64_t local_inter = 0;  // moe_intermediate_size / world
};
ShardLayout MakeShardLayout(const ModelConfig& config, const ShardSpec& shard);

ModelWeights LoadWeights(const Checkpoint& ckpt, const ModelConfig& config, const ShardLayout& layout,
                         Backend& backend);

struct SyntheticSpec;  // model/synthetic.h
// The same weights built from a seed (model/synthetic.h), printing progress per layer on stderr.
ModelWeights LoadSyntheticWeights(const SyntheticSpec& spec, const ModelConfig& config, const ShardLayout& layout,
                                  Backend& backend);

}  // namespace dsmesh
