#include "model/tensor_names.h"

#include <utility>
#include <vector>

namespace dsmesh {
namespace {

bool StartsWith(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// Per-layer renames, longest DeepSeek prefix first (prefix, replacement).
const std::vector<std::pair<std::string, std::string>>& LayerRenames() {
  static const std::vector<std::pair<std::string, std::string>> kRenames = {
      {"attn.indexer.compressor.wkv.", "self_attn.compressor.indexer.kv_proj."},
      {"attn.indexer.compressor.wgate.", "self_attn.compressor.indexer.gate_proj."},
      {"attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"},
      {"attn.indexer.compressor.norm.", "self_attn.compressor.indexer.kv_norm."},
      {"attn.indexer.wq_b.", "self_attn.compressor.indexer.q_b_proj."},
      {"attn.indexer.weights_proj.", "self_attn.compressor.indexer.scorer.weights_proj."},
      {"attn.compressor.wkv.", "self_attn.compressor.kv_proj."},
      {"attn.compressor.wgate.", "self_attn.compressor.gate_proj."},
      {"attn.compressor.ape", "self_attn.compressor.position_bias"},
      {"attn.compressor.norm.", "self_attn.compressor.kv_norm."},
      {"attn.wq_a.", "self_attn.q_a_proj."},
      {"attn.q_norm.", "self_attn.q_a_norm."},
      {"attn.wq_b.", "self_attn.q_b_proj."},
      {"attn.wkv.", "self_attn.kv_proj."},
      {"attn.kv_norm.", "self_attn.kv_norm."},
      {"attn.wo_a.", "self_attn.o_a_proj."},
      {"attn.wo_b.", "self_attn.o_b_proj."},
      {"attn.attn_sink", "self_attn.sinks"},
      {"attn_norm.", "input_layernorm."},
      {"ffn_norm.", "post_attention_layernorm."},
      {"hc_attn_fn", "attn_hc.fn"},
      {"hc_attn_base", "attn_hc.base"},
      {"hc_attn_scale", "attn_hc.scale"},
      {"hc_ffn_fn", "ffn_hc.fn"},
      {"hc_ffn_base", "ffn_hc.base"},
      {"hc_ffn_scale", "ffn_hc.scale"},
      {"ffn.gate.weight", "mlp.gate.weight"},
      {"ffn.gate.bias", "mlp.gate.e_score_correction_bias"},
      {"ffn.gate.tid2eid", "mlp.gate.tid2eid"},
      {"ffn.shared_experts.w1.", "mlp.shared_experts.gate_proj."},
      {"ffn.shared_experts.w3.", "mlp.shared_experts.up_proj."},
      {"ffn.shared_experts.w2.", "mlp.shared_experts.down_proj."},
  };
  return kRenames;
}

}  // namespace

std::string TransformersName(const std::string& name) {
  if (name == "embed.weight") return "model.embed_tokens.weight";
  if (name == "head.weight") return "lm_head.weight";
  if (name == "norm.weight") return "model.norm.weight";
  if (name == "hc_head_fn") return "model.hc_head.hc_fn";
  if (name == "hc_head_base") return "model.hc_head.hc_base";
  if (name == "hc_head_scale") return "model.hc_head.hc_scale";
  if (!StartsWith(name, "layers.")) return "";
  size_t dot = name.find('.', 7);
  if (dot == std::string::npos) return "";
  std::string layer = name.substr(7, dot - 7);
  std::string rest = name.substr(dot + 1);
  for (const auto& [from, to] : LayerRenames()) {
    if (StartsWith(rest, from)) return "model.layers." + layer + "." + to + rest.substr(from.size());
  }
  return "";
}

std::string TransformersGateUpName(int layer) {
  return "model.layers." + std::to_string(layer) + ".mlp.experts.gate_up_proj";
}
std::string TransformersDownName(int layer) {
  return "model.layers." + std::to_string(layer) + ".mlp.experts.down_proj";
}

}  // namespace dsmesh
