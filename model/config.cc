#include "model/config.h"

#include <cmath>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace dsmesh {
namespace {

using nlohmann::json;

[[noreturn]] void Fail(const std::string& source, const std::string& what) {
  throw std::runtime_error(source + ": " + what);
}

// Reads a required number field.
template <class T>
T Need(const json& j, const char* key, const std::string& src) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) Fail(src, std::string("missing field \"") + key + "\"");
  if (!it->is_number()) Fail(src, std::string("field \"") + key + "\" must be a number");
  return it->get<T>();
}

template <class T>
T Opt(const json& j, const char* key, T fallback, const std::string& src) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) Fail(src, std::string("field \"") + key + "\" must be a boolean");
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) Fail(src, std::string("field \"") + key + "\" must be a string");
  } else {
    if (!it->is_number()) Fail(src, std::string("field \"") + key + "\" must be a number");
  }
  return it->get<T>();
}

void ParseYarn(const json& r, YarnScaling* y, const std::string& src, const std::string& where) {
  std::string type = r.value("rope_type", r.value("type", std::string("default")));
  if (type == "default" || type == "none") return;
  if (type != "yarn") Fail(src, where + ": unsupported rope type \"" + type + "\" (only yarn or default)");
  y->enabled = true;
  y->factor = Need<double>(r, "factor", src);
  y->original_max_position = Need<double>(r, "original_max_position_embeddings", src);
  y->beta_fast = Opt<double>(r, "beta_fast", 32.0, src);
  y->beta_slow = Opt<double>(r, "beta_slow", 1.0, src);
  double attention_factor = Opt<double>(r, "attention_factor", 1.0, src);
  double mscale = Opt<double>(r, "mscale", 0.0, src);
  double mscale_all = Opt<double>(r, "mscale_all_dim", 0.0, src);
  // DeepSeek-V4 applies YaRN without mscale; a config asking for it describes another model.
  if (attention_factor != 1.0 || (mscale != 0.0 && mscale != mscale_all))
    Fail(src, where + ": YaRN attention scaling (attention_factor/mscale) is not supported for deepseek_v4");
}

AttentionKind KindFromName(const std::string& name, const std::string& src) {
  if (name == "sliding_attention") return AttentionKind::kSliding;
  if (name == "compressed_sparse_attention") return AttentionKind::kCompressedSparse;
  if (name == "heavily_compressed_attention") return AttentionKind::kHeavilyCompressed;
  Fail(src, "unknown layer_types entry \"" + name + "\"");
}

}  // namespace

const char* AttentionKindName(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kSliding: return "sliding_attention";
    case AttentionKind::kCompressedSparse: return "compressed_sparse_attention";
    case AttentionKind::kHeavilyCompressed: return "heavily_compressed_attention";
  }
  return "?";
}

AttentionKind ModelConfig::attention_kind(int layer) const {
  int r = compress_ratios.at(layer);
  if (r == 0) return AttentionKind::kSliding;
  // The reference (and transformers' mapping) gives the overlapping compressor and the indexer to
  // ratio 4 only; any other ratio compresses without overlap and attends to every entry.
  return r == 4 ? AttentionKind::kCompressedSparse : AttentionKind::kHeavilyCompressed;
}

MlpKind ModelConfig::mlp_kind(int layer) const {
  return layer < num_hash_layers ? MlpKind::kHashMoe : MlpKind::kRoutedMoe;
}

ModelConfig ModelConfig::FromJson(const std::string& text, const std::string& src) {
  return FromCard(ModelCard::FromJson(text, src));
}

ModelConfig ModelConfig::FromCard(const ModelCard& card) {
  const std::string& src = card.source;
  const json& j = card.document;
  const std::string& type = card.model_type;
  if (type.empty()) Fail(src, "missing field \"model_type\"");
  if (type != "deepseek_v4")
    Fail(src, "unsupported model_type \"" + type + "\" (this build supports \"deepseek_v4\")");

  ModelConfig c;
  c.model_type = type;
  c.source = src;
  c.vocab_size = card.Required(card.vocab_size, "vocab_size");
  c.hidden_size = Need<int64_t>(j, "hidden_size", src);
  c.num_layers = Need<int>(j, "num_hidden_layers", src);
  c.num_mtp_layers = card.num_mtp_layers;
  c.num_heads = Need<int>(j, "num_attention_heads", src);
  int kv_heads = Opt<int>(j, "num_key_value_heads", 1, src);
  if (kv_heads != 1) Fail(src, "num_key_value_heads must be 1 for deepseek_v4 (shared K=V head)");
  c.head_dim = Need<int>(j, "head_dim", src);
  c.q_lora_rank = Need<int>(j, "q_lora_rank", src);
  c.o_groups = Need<int>(j, "o_groups", src);
  c.o_lora_rank = Need<int>(j, "o_lora_rank", src);
  c.sliding_window = Need<int>(j, "sliding_window", src);
  c.index_n_heads = Opt<int>(j, "index_n_heads", 0, src);
  c.index_head_dim = Opt<int>(j, "index_head_dim", 0, src);
  c.index_topk = Opt<int>(j, "index_topk", 0, src);
  c.n_routed_experts = Need<int>(j, "n_routed_experts", src);
  c.num_experts_per_tok = Need<int>(j, "num_experts_per_tok", src);
  c.n_shared_experts = Opt<int>(j, "n_shared_experts", 1, src);
  c.moe_intermediate_size = Need<int64_t>(j, "moe_intermediate_size", src);
  c.scoring_func = Opt<std::string>(j, "scoring_func", "sqrtsoftplus", src);
  c.norm_topk_prob = Opt<bool>(j, "norm_topk_prob", true, src);
  c.routed_scaling_factor = Opt<double>(j, "routed_scaling_factor", 1.0, src);
  c.swiglu_limit = Opt<double>(j, "swiglu_limit", 0.0, src);
  c.hc_mult = Opt<int>(j, "hc_mult", 4, src);
  c.hc_sinkhorn_iters = Opt<int>(j, "hc_sinkhorn_iters", 20, src);
  c.hc_eps = Opt<double>(j, "hc_eps", 1e-6, src);
  c.rms_norm_eps = Opt<double>(j, "rms_norm_eps", 1e-6, src);
  c.bos_token_id = card.bos_token_id.value_or(0);
  c.eos_token_id = card.eos_token_id.value_or(1);
  c.tie_word_embeddings = Opt<bool>(j, "tie_word_embeddings", false, src);
  c.rope_theta = Opt<double>(j, "rope_theta", 10000.0, src);
  c.compress_rope_theta = Opt<double>(j, "compress_rope_theta", 160000.0, src);

  if (c.scoring_func != "sqrtsoftplus")
    Fail(src, "unsupported scoring_func \"" + c.scoring_func + "\" (deepseek_v4 uses sqrtsoftplus)");
  std::string act = Opt<std::string>(j, "hidden_act", "silu", src);
  if (act != "silu") Fail(src, "unsupported hidden_act \"" + act + "\"");
  if (Opt<bool>(j, "attention_bias", false, src)) Fail(src, "attention_bias true is not supported");
  if (c.n_shared_experts > 1) Fail(src, "n_shared_experts > 1 is not supported");

  // Rotary dims: qk_rope_head_dim (checkpoint) or partial_rotary_factor (transformers).
  if (j.contains("qk_rope_head_dim") && !j["qk_rope_head_dim"].is_null()) {
    c.rope_dim = Need<int>(j, "qk_rope_head_dim", src);
  } else if (j.contains("partial_rotary_factor") && !j["partial_rotary_factor"].is_null()) {
    c.rope_dim = static_cast<int>(c.head_dim * Need<double>(j, "partial_rotary_factor", src));
  } else {
    Fail(src, "missing field \"qk_rope_head_dim\" (or \"partial_rotary_factor\")");
  }

  // Rope tables: rope_parameters {main, compress} (transformers) or rope_scaling (checkpoint).
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
      j["rope_parameters"].contains("compress")) {
    const json& rp = j["rope_parameters"];
    if (rp.contains("main") && rp["main"].is_object()) {
      c.rope_theta = Opt<double>(rp["main"], "rope_theta", c.rope_theta, src);
      ParseYarn(rp["main"], &c.compress_yarn, src, "rope_parameters.main");
      if (c.compress_yarn.enabled) Fail(src, "rope_parameters.main: YaRN on the sliding rope is not supported");
    }
    const json& cp = rp["compress"];
    c.compress_rope_theta = Opt<double>(cp, "rope_theta", c.compress_rope_theta, src);
    ParseYarn(cp, &c.compress_yarn, src, "rope_parameters.compress");
    if (cp.contains("partial_rotary_factor") && cp["partial_rotary_factor"].is_number())
      c.rope_dim = static_cast<int>(c.head_dim * cp["partial_rotary_factor"].get<double>());
  } else {
    const json* rs = nullptr;
    if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) rs = &j["rope_scaling"];
    else if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) rs = &j["rope_parameters"];
    if (rs) {
      ParseYarn(*rs, &c.compress_yarn, src, "rope_scaling");
      if (rs->contains("rope_theta") && (*rs)["rope_theta"].is_number() && !j.contains("rope_theta"))
        c.rope_theta = (*rs)["rope_theta"].get<double>();
    }
  }

  // Per-layer attention kinds and ratios.
  const int total_layers = c.num_layers + c.num_mtp_layers;
  if (j.contains("compress_ratios") && j["compress_ratios"].is_array()) {
    for (const auto& r : j["compress_ratios"]) {
      if (!r.is_number_integer() || r.get<int>() < 0) Fail(src, "compress_ratios entries must be integers >= 0");
      c.compress_ratios.push_back(r.get<int>());
    }
    if ((int)c.compress_ratios.size() < c.num_layers)
      Fail(src, "compress_ratios has " + std::to_string(c.compress_ratios.size()) + " entries, need at least " +
                    std::to_string(c.num_layers) + " (num_hidden_layers)");
    for (int r : c.compress_ratios)
      if (r == 1) Fail(src, "compress_ratios entry 1 is not supported");
  } else if (j.contains("layer_types") && j["layer_types"].is_array()) {
    int csa = 4, hca = 128;
    if (j.contains("compress_rates") && j["compress_rates"].is_object()) {
      const json& cr = j["compress_rates"];
      csa = Opt<int>(cr, "compressed_sparse_attention", csa, src);
      hca = Opt<int>(cr, "heavily_compressed_attention", hca, src);
    }
    csa = Opt<int>(j, "compress_rate_csa", csa, src);
    hca = Opt<int>(j, "compress_rate_hca", hca, src);
    if (csa != 4) Fail(src, "compress_rates.compressed_sparse_attention must be 4 (got " + std::to_string(csa) + ")");
    if (hca < 2 || hca == 4) Fail(src, "compress_rates.heavily_compressed_attention must be > 1 and != 4");
    for (const auto& t : j["layer_types"]) {
      if (!t.is_string()) Fail(src, "layer_types entries must be strings");
      AttentionKind k = KindFromName(t.get<std::string>(), src);
      c.compress_ratios.push_back(k == AttentionKind::kSliding ? 0
                                  : k == AttentionKind::kCompressedSparse ? csa : hca);
    }
    if ((int)c.compress_ratios.size() != c.num_layers)
      Fail(src, "layer_types has " + std::to_string(c.compress_ratios.size()) + " entries, num_hidden_layers is " +
                    std::to_string(c.num_layers));
  } else {
    Fail(src, "missing field \"compress_ratios\" (or \"layer_types\")");
  }
  // MTP blocks attend through the sliding window only unless the checkpoint says otherwise.
  c.compress_ratios.resize(total_layers, 0);
  // The checkpoint spelling may list one ratio per MTP block beyond num_nextn_predict_layers; drop extras.

  // Hash-routed layers: num_hash_layers (checkpoint) or mlp_layer_types (transformers).
  if (j.contains("mlp_layer_types") && j["mlp_layer_types"].is_array()) {
    int n = 0;
    bool seen_moe = false;
    for (const auto& t : j["mlp_layer_types"]) {
      std::string s = t.is_string() ? t.get<std::string>() : "";
      if (s == "hash_moe") {
        if (seen_moe) Fail(src, "mlp_layer_types: hash_moe layers must come first");
        ++n;
      } else if (s == "moe") {
        seen_moe = true;
      } else {
        Fail(src, "unknown mlp_layer_types entry \"" + s + "\"");
      }
    }
    c.num_hash_layers = n;
  } else {
    c.num_hash_layers = Opt<int>(j, "num_hash_layers", 0, src);
  }

  c.vision = card.vision;

  // Sanity: the shapes the forward relies on.
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) Fail(src, what);
  };
  check(c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers > 0, "vocab_size, hidden_size, num_hidden_layers must be > 0");
  check(c.head_dim > 0 && c.rope_dim > 0 && c.rope_dim <= c.head_dim && c.rope_dim % 2 == 0,
        "qk_rope_head_dim must be even and in (0, head_dim]");
  check(c.o_groups > 0 && c.num_heads % c.o_groups == 0, "num_attention_heads must be a multiple of o_groups");
  check(c.sliding_window > 0, "sliding_window must be > 0");
  check(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.n_routed_experts,
        "num_experts_per_tok must be in [1, n_routed_experts]");
  check(c.hc_mult >= 1 && c.hc_sinkhorn_iters >= 1, "hc_mult and hc_sinkhorn_iters must be >= 1");
  bool any_csa = false;
  for (int l = 0; l < total_layers; ++l) any_csa |= c.attention_kind(l) == AttentionKind::kCompressedSparse;
  if (any_csa)
    check(c.index_n_heads > 0 && c.index_head_dim >= c.rope_dim && c.index_topk > 0,
          "compressed sparse layers need index_n_heads, index_head_dim (>= rope dims) and index_topk");
  return c;
}

ModelConfig ModelConfig::FromDirectory(const std::string& dir) {
  return FromCard(ModelCard::FromDirectory(dir));
}

}  // namespace dsmesh
