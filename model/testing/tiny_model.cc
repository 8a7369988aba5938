#include "model/testing/tiny_model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "common/half.h"
#include "common/safetensors.h"
#include "model/tensor_names.h"
#include "common/vision/vision_config.h"

namespace dsmesh {
namespace {

class TinyWriter {
 public:
  TinyWriter(uint64_t seed, bool hf) : rng_(seed), hf_(hf) {}

  std::string Name(const std::string& ds) const {
    if (!hf_) return ds;
    std::string n = TransformersName(ds);
    return n.empty() ? ds : n;
  }

  std::vector<float> Normal(int64_t n, double stddev, double mean = 0.0) {
    std::normal_distribution<double> dist(mean, stddev);
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(dist(rng_));
    return v;
  }

  void Bf16(const std::string& ds, std::vector<int64_t> shape, const std::vector<float>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = FloatToBf16(v[i]);
    w_.Add(Name(ds), DType::kBF16, std::move(shape), b.data(), b.size() * 2);
  }
  void F32(const std::string& ds, std::vector<int64_t> shape, const std::vector<float>& v) {
    w_.Add(Name(ds), DType::kF32, std::move(shape), v.data(), v.size() * 4);
  }
  // A linear [out, in] with std 1/sqrt(in), so activations keep their scale through the layers.
  void Linear(const std::string& prefix, int64_t out, int64_t in) {
    Bf16(prefix + ".weight", {out, in}, Normal(out * in, 1.0 / std::sqrt(static_cast<double>(in))));
  }
  void Norm(const std::string& name, int64_t n) { Bf16(name, {n}, Normal(n, 0.1, 1.0)); }

  std::mt19937_64& rng() { return rng_; }
  SafetensorsWriter& writer() { return w_; }
  bool hf() const { return hf_; }

 private:
  std::mt19937_64 rng_;
  bool hf_;
  SafetensorsWriter w_;
};

void WriteHc(TinyWriter& t, const std::string& p, int rows, int64_t width, bool head) {
  t.F32(p + "fn", {rows, width}, t.Normal(rows * width, 0.5 / std::sqrt(static_cast<double>(width))));
  t.F32(p + "base", {rows}, t.Normal(rows, 0.5));
  t.F32(p + "scale", {head ? 1 : 3}, t.Normal(head ? 1 : 3, 0.3, 1.0));
}

void WriteCompressor(TinyWriter& t, const std::string& p, int ratio, int c, int64_t d, int64_t D) {
  t.Linear(p + "wkv", c * d, D);
  t.Linear(p + "wgate", c * d, D);
  t.F32(p + "ape", {ratio, c * d}, t.Normal(ratio * c * d, 0.5));
  t.Norm(p + "norm.weight", d);
}

void WriteBlock(TinyWriter& t, const TinyModelSpec& s, const std::string& p, int ratio, bool hash, int layer) {
  const int64_t D = s.hidden_size, d = s.head_dim, H = s.num_heads, hc = s.hc_mult;
  t.Norm(p + "attn_norm.weight", D);
  t.Norm(p + "ffn_norm.weight", D);
  WriteHc(t, p + "hc_attn_", (2 + hc) * hc, hc * D, false);
  WriteHc(t, p + "hc_ffn_", (2 + hc) * hc, hc * D, false);
  const std::string a = p + "attn.";
  t.Linear(a + "wq_a", s.q_lora_rank, D);
  t.Norm(a + "q_norm.weight", s.q_lora_rank);
  t.Linear(a + "wq_b", H * d, s.q_lora_rank);
  t.Linear(a + "wkv", d, D);
  t.Norm(a + "kv_norm.weight", d);
  t.Linear(a + "wo_a", (int64_t)s.o_groups * s.o_lora_rank, H * d / s.o_groups);
  t.Linear(a + "wo_b", D, (int64_t)s.o_groups * s.o_lora_rank);
  t.F32(a + "attn_sink", {H}, t.Normal(H, 1.0));
  if (ratio > 0) WriteCompressor(t, a + "compressor.", ratio, ratio == 4 ? 2 : 1, d, D);
  if (ratio == 4) {
    t.Linear(a + "indexer.wq_b", (int64_t)s.index_n_heads * s.index_head_dim, s.q_lora_rank);
    t.Linear(a + "indexer.weights_proj", s.index_n_heads, D);
    WriteCompressor(t, a + "indexer.compressor.", ratio, 2, s.index_head_dim, D);
  }
  const std::string f = p + "ffn.";
  const int64_t E = s.n_routed_experts, I = s.moe_intermediate_size;
  t.Linear(f + "gate", E, D);
  if (hash) {
    std::vector<int32_t> table(s.vocab_size * s.num_experts_per_tok);
    std::vector<int32_t> perm(E);
    for (int64_t v = 0; v < s.vocab_size; ++v) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), t.rng());  // distinct experts per row
      for (int k = 0; k < s.num_experts_per_tok; ++k) table[v * s.num_experts_per_tok + k] = perm[k];
    }
    t.writer().Add(t.Name(f + "gate.tid2eid"), DType::kI32, {s.vocab_size, s.num_experts_per_tok}, table.data(),
                   table.size() * 4);
  } else {
    t.F32(f + "gate.bias", {E}, t.Normal(E, 0.1));
  }
  // Draw every expert's w1, w3, w2 in the same order for both namings, so a DeepSeek-named and a
  // transformers-named tiny model from one seed hold identical weights.
  const double sd_in = 1.0 / std::sqrt(static_cast<double>(D)), sd_mid = 1.0 / std::sqrt(static_cast<double>(I));
  std::vector<uint16_t> gate_up, down;
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = f + "experts." + std::to_string(e) + ".";
    std::vector<float> w1 = t.Normal(I * D, sd_in), w3 = t.Normal(I * D, sd_in), w2 = t.Normal(D * I, sd_mid);
    if (t.hf() && layer >= 0) {
      // transformers fuses the routed experts: gate_up_proj [E, 2I, D] (w1 rows then w3 rows), down_proj [E, D, I].
      for (float v : w1) gate_up.push_back(FloatToBf16(v));
      for (float v : w3) gate_up.push_back(FloatToBf16(v));
      for (float v : w2) down.push_back(FloatToBf16(v));
    } else {
      t.Bf16(x + "w1.weight", {I, D}, w1);
      t.Bf16(x + "w3.weight", {I, D}, w3);
      t.Bf16(x + "w2.weight", {D, I}, w2);
    }
  }
  if (t.hf() && layer >= 0) {
    t.writer().Add(TransformersGateUpName(layer), DType::kBF16, {E, 2 * I, D}, gate_up.data(), gate_up.size() * 2);
    t.writer().Add(TransformersDownName(layer), DType::kBF16, {E, D, I}, down.data(), down.size() * 2);
  }
  t.Linear(f + "shared_experts.w1", I, D);
  t.Linear(f + "shared_experts.w3", I, D);
  t.Linear(f + "shared_experts.w2", D, I);
}

// The vision tower with every bias and sentinel embedding random (none hides behind zero).
void WriteVision(TinyWriter& t, const TinyModelSpec& s) {
  const VisionConfig real;  // patch size and merge ratio of the real model
  const int64_t dim = s.vision_dim, I = s.vision_inter_dim, D = s.hidden_size, p = real.patch_size,
                r = real.downsample_ratio;
  auto biased = [&](const std::string& prefix, int64_t out, int64_t in) {
    t.Linear(prefix, out, in);
    t.Bf16(prefix + ".bias", {out}, t.Normal(out, 0.1));
  };
  biased("vision.patch_embed.proj", dim, 3 * p * p);
  for (int i = 0; i < s.vision_n_layers; ++i) {
    const std::string b = "vision.blocks." + std::to_string(i) + ".";
    t.Norm(b + "norm1.weight", dim);
    t.Norm(b + "norm2.weight", dim);
    biased(b + "attn.wqkv", 3 * dim, dim);
    biased(b + "attn.wo", dim, dim);
    t.Linear(b + "mlp.w1", 2 * I, dim);
    t.Linear(b + "mlp.w2", dim, I);
  }
  t.Norm("vision.norm.weight", dim);
  biased("aligner.w1", D, dim * r * r);
  biased("aligner.w2", D, D);
  for (const char* name : {"image_start", "image_pad", "image_newline", "image_end"}) t.F32(name, {D}, t.Normal(D, 1.0));
  // Image rows' router bias on every main layer, hash layers included; wide enough that image rows pick
  // other experts than text rows would.
  const int64_t E = s.n_routed_experts;
  for (size_t l = 0; l < s.compress_ratios.size(); ++l)
    t.F32("layers." + std::to_string(l) + ".ffn.gate.bias_vl", {E}, t.Normal(E, 1.0));
}

}  // namespace

nlohmann::ordered_json TinyModelConfig(const TinyModelSpec& s) {
  const int L = static_cast<int>(s.compress_ratios.size());
  const bool hf = s.transformers_naming;
  nlohmann::ordered_json c;
  c["architectures"] = {"DeepseekV4ForCausalLM"};
  c["model_type"] = "deepseek_v4";
  c["vocab_size"] = s.vocab_size;
  c["hidden_size"] = s.hidden_size;
  c["num_hidden_layers"] = L;
  c["num_attention_heads"] = s.num_heads;
  c["num_key_value_heads"] = 1;
  c["head_dim"] = s.head_dim;
  c["q_lora_rank"] = s.q_lora_rank;
  c["o_groups"] = s.o_groups;
  c["o_lora_rank"] = s.o_lora_rank;
  c["sliding_window"] = s.sliding_window;
  c["index_n_heads"] = s.index_n_heads;
  c["index_head_dim"] = s.index_head_dim;
  c["index_topk"] = s.index_topk;
  c["n_routed_experts"] = s.n_routed_experts;
  c["num_experts_per_tok"] = s.num_experts_per_tok;
  c["n_shared_experts"] = 1;
  c["moe_intermediate_size"] = s.moe_intermediate_size;
  c["scoring_func"] = "sqrtsoftplus";
  c["topk_method"] = "noaux_tc";
  c["norm_topk_prob"] = true;
  c["routed_scaling_factor"] = s.routed_scaling_factor;
  c["swiglu_limit"] = s.swiglu_limit;
  c["hc_mult"] = s.hc_mult;
  c["hc_sinkhorn_iters"] = 20;
  c["hc_eps"] = 1e-6;
  c["rms_norm_eps"] = 1e-6;
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = 1048576;
  c["rope_theta"] = 10000.0;
  c["compress_rope_theta"] = 160000.0;
  c["bos_token_id"] = 0;
  c["eos_token_id"] = 1;
  c["tie_word_embeddings"] = false;
  c["torch_dtype"] = "bfloat16";
  nlohmann::ordered_json yarn = {{"type", "yarn"}, {"factor", 16}, {"original_max_position_embeddings", 65536},
                                 {"beta_fast", 32}, {"beta_slow", 1}};
  if (hf) {
    std::vector<std::string> types, mlp;
    for (int l = 0; l < L; ++l) {
      int r = s.compress_ratios[l];
      types.push_back(r == 0 ? "sliding_attention" : r == 4 ? "compressed_sparse_attention" : "heavily_compressed_attention");
      mlp.push_back(l < s.num_hash_layers ? "hash_moe" : "moe");
    }
    c["layer_types"] = types;
    c["mlp_layer_types"] = mlp;
    c["compress_rates"] = {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 128}};
    c["partial_rotary_factor"] = static_cast<double>(s.rope_dim) / s.head_dim;
    nlohmann::ordered_json compress = {{"rope_type", "yarn"}, {"rope_theta", 160000.0}, {"factor", 16},
                                       {"original_max_position_embeddings", 65536}, {"beta_fast", 32},
                                       {"beta_slow", 1}, {"attention_factor", 1.0},
                                       {"partial_rotary_factor", static_cast<double>(s.rope_dim) / s.head_dim}};
    c["rope_parameters"] = {{"main", {{"rope_type", "default"}, {"rope_theta", 10000.0},
                                      {"partial_rotary_factor", static_cast<double>(s.rope_dim) / s.head_dim}}},
                            {"compress", compress}};
    c["num_nextn_predict_layers"] = 0;
  } else {
    std::vector<int> ratios = s.compress_ratios;
    for (int m = 0; m < s.num_mtp_layers; ++m) ratios.push_back(0);
    c["compress_ratios"] = ratios;
    c["num_hash_layers"] = s.num_hash_layers;
    c["qk_rope_head_dim"] = s.rope_dim;
    c["rope_scaling"] = yarn;
    c["num_nextn_predict_layers"] = s.num_mtp_layers;
  }
  if (s.vision) {  // the patch, merge and preprocessing keys as the real model has them (VisionConfig defaults)
    const VisionConfig real;
    c["vision_n_layers"] = s.vision_n_layers;
    c["vision_dim"] = s.vision_dim;
    c["vision_n_heads"] = s.vision_n_heads;
    c["vision_inter_dim"] = s.vision_inter_dim;
    c["vision_patch_size"] = real.patch_size;
    c["vision_downsample_ratio"] = real.downsample_ratio;
    c["vision_rope_theta"] = real.rope_theta;
    c["vision_max_n_token"] = real.max_n_token;
    c["vision_min_pixels"] = real.min_pixels;
    c["vision_max_wh_ratio"] = *real.max_wh_ratio;
  }
  return c;
}

void WriteTinyModel(const std::string& dir, uint64_t seed, const TinyModelSpec& s) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) throw std::runtime_error(dir + ": cannot create directory");
  const int L = static_cast<int>(s.compress_ratios.size());
  const bool hf = s.transformers_naming;
  TinyWriter t(seed, hf);
  const int64_t D = s.hidden_size;
  t.Bf16("embed.weight", {s.vocab_size, D}, t.Normal(s.vocab_size * D, 1.0));
  t.Linear("head", s.vocab_size, D);
  t.Norm("norm.weight", D);
  WriteHc(t, "hc_head_", s.hc_mult, s.hc_mult * D, true);
  for (int l = 0; l < L; ++l)
    WriteBlock(t, s, "layers." + std::to_string(l) + ".", s.compress_ratios[l], l < s.num_hash_layers, l);
  if (!hf) {  // transformers has no MTP module; DeepSeek checkpoints ship it
    for (int m = 0; m < s.num_mtp_layers; ++m) {
      const std::string p = "mtp." + std::to_string(m) + ".";
      t.Linear(p + "e_proj", D, D);
      t.Linear(p + "h_proj", D, D);
      t.Norm(p + "enorm.weight", D);
      t.Norm(p + "hnorm.weight", D);
      t.Norm(p + "norm.weight", D);
      WriteHc(t, p + "hc_head_", s.hc_mult, s.hc_mult * D, true);
      WriteBlock(t, s, p, 0, false, -1);
    }
  }
  if (s.vision) WriteVision(t, s);
  t.writer().SetMetadata("format", "pt");
  t.writer().Write(dir + "/model.safetensors");

  const nlohmann::ordered_json c = TinyModelConfig(s);
  std::ofstream out(dir + "/config.json");
  out << c.dump(2) << "\n";
  if (!out) throw std::runtime_error(dir + "/config.json: write failed");
}

}  // namespace dsmesh
