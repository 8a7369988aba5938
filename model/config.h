// ModelConfig: the DeepSeek-V4 hyper-parameters, parsed from a model directory's config.json through its model
// card (common/model_card.h: the facts every process reads; the rest of the file is parsed here).
// Both spellings found in the wild are accepted and mapped onto one description:
//   - the checkpoint's (compress_ratios, num_hash_layers, qk_rope_head_dim, rope_scaling {type: yarn, ...}),
//   - transformers' (layer_types, mlp_layer_types, partial_rotary_factor, rope_parameters {main, compress},
//     compress_rates).
// Any other model_type is refused by name. Nothing here is V4-Flash specific: every size comes from the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/model_card.h"
#include "common/vision/vision_config.h"

namespace dsmesh {

enum class AttentionKind {
  kSliding,            // compress ratio 0: the sliding window only ("sliding_attention")
  kCompressedSparse,   // CSA: overlapping compressor (ratio 4) + lightning indexer top-k + window
  kHeavilyCompressed,  // HCA: non-overlapping compressor (ratio 128), all entries + window
};
const char* AttentionKindName(AttentionKind kind);

enum class MlpKind {
  kHashMoe,    // experts chosen by tid2eid[token] (the first num_hash_layers layers)
  kRoutedMoe,  // experts chosen by top-k of sqrt(softplus(gate x)) + bias
};

struct YarnScaling {
  bool enabled = false;
  double factor = 1.0;
  double original_max_position = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

struct ModelConfig {
  std::string model_type;       // always "deepseek_v4" after a successful parse
  std::string source;           // path of the config.json it came from (for error messages)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;      // D
  int num_layers = 0;           // main blocks (without MTP)
  int num_mtp_layers = 0;       // num_nextn_predict_layers (MTP blocks, kept for speculative decoding)
  int num_heads = 0;            // H (query heads); the single K=V head is shared
  int head_dim = 0;             // d
  int rope_dim = 0;             // rd: rotary dims, the LAST rd of each head (interleaved pairs)
  int q_lora_rank = 0;
  int o_groups = 0;
  int o_lora_rank = 0;
  int sliding_window = 0;       // W
  std::vector<int> compress_ratios;  // per layer, num_layers + num_mtp_layers entries; 0 = sliding only
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  double rope_theta = 10000.0;            // sliding layers: plain rope
  double compress_rope_theta = 160000.0;  // compressed layers (and their compressor/indexer)
  YarnScaling compress_yarn;              // YaRN for the compressed rope table only, no mscale
  int n_routed_experts = 0;
  int num_experts_per_tok = 0;
  int n_shared_experts = 0;
  int64_t moe_intermediate_size = 0;
  std::string scoring_func = "sqrtsoftplus";
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  int num_hash_layers = 0;
  double swiglu_limit = 0.0;    // 0 = no clamp
  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-6;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;
  bool tie_word_embeddings = false;  // lm_head shares the embedding table (then the head may be absent)
  VisionConfig vision;          // vision_* keys; vision.n_layers 0 (the default) = text only

  AttentionKind attention_kind(int layer) const;  // layer in [0, num_layers + num_mtp_layers)
  MlpKind mlp_kind(int layer) const;
  int compress_ratio(int layer) const { return compress_ratios.at(layer); }

  // Parses config.json text; `source` names the file in error messages. Throws std::runtime_error naming
  // the file and the field for a missing/invalid field, an unsupported value or a model_type other than
  // deepseek_v4.
  static ModelConfig FromJson(const std::string& json_text, const std::string& source);
  static ModelConfig FromDirectory(const std::string& dir);  // reads dir/config.json
  static ModelConfig FromCard(const ModelCard& card);        // the card's facts and its document
};

}  // namespace dsmesh
