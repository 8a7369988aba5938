// A deterministic random DeepSeek-V4 model small enough for CPU tests and the local demo: every attention
// kind (sliding, CSA with indexer, HCA), both MoE kinds (hash, routed), an MTP block, and every parameter
// transformers would initialise to zero or one randomised (sinks, hc base/scale, ape, router bias, tid2eid
// with distinct experts per row), so none of the paths can hide behind a trivial value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsmesh {

struct TinyModelSpec {
  int64_t vocab_size = 129280;  // the real tokenizer's ids all fit
  int64_t hidden_size = 128;
  std::vector<int> compress_ratios = {0, 4, 128, 4};  // per main layer
  int num_mtp_layers = 1;
  int num_heads = 8;
  int head_dim = 64;
  int rope_dim = 16;
  int q_lora_rank = 64;
  int o_groups = 4;  // 2 heads per group; shards at world 1, 2 and 4 (moe_intermediate_size too)
  int o_lora_rank = 32;
  int sliding_window = 32;
  int index_n_heads = 32;
  int index_head_dim = 32;
  int index_topk = 8;
  int n_routed_experts = 8;
  int num_experts_per_tok = 2;
  int64_t moe_intermediate_size = 64;
  int num_hash_layers = 1;
  int hc_mult = 4;
  double routed_scaling_factor = 1.5;
  double swiglu_limit = 10.0;
  bool transformers_naming = false;  // write transformers' names and config spelling instead of DeepSeek's
  // A tiny DeepSeek-V4-Flash-Vision tower (vision.*, aligner.*, image_*; vision_* config keys) after the
  // language model's tensors, which stay the same bytes. Patch size and the preprocessing keys keep the
  // real model's values, so real images go through the real preprocessing; only the tower is small.
  bool vision = false;
  int vision_n_layers = 2;
  int vision_dim = 64;
  int vision_n_heads = 4;
  int vision_inter_dim = 96;
};

// The config.json that WriteTinyModel writes for `spec` (checkpoint or transformers spelling).
nlohmann::ordered_json TinyModelConfig(const TinyModelSpec& spec);

// Writes config.json and model.safetensors (bf16 linears/embeddings, f32 hc/sinks/ape/bias, int32 tid2eid)
// into `dir` (created if missing). Same seed, same bytes.
void WriteTinyModel(const std::string& dir, uint64_t seed, const TinyModelSpec& spec = {});

}  // namespace dsmesh
