// `dsmesh quantize` on a small random DeepSeek-V4 checkpoint written by model/tiny_model: which tensors
// become EXL3 and at what K, that every EXL3 set loads and dequantizes close to its source weight, that
// kept tensors are byte-identical, the config/tokenizer files, and the overwrite rules.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include <gtest/gtest.h>

#include "common/safetensors.h"
#include "kernels/exl3/exl3_linear.h"
#include "kernels/exl3/quant_plan.h"
#include "kernels/exl3/quantize_checkpoint.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace {
namespace fs = std::filesystem;

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Exl3BitsSpec, Parse) {
  const Exl3BitsSpec s = Exl3BitsSpec::Parse("experts=2,dense=6,layer.13=3,mtp=4");
  EXPECT_EQ(s.experts, 2);
  EXPECT_EQ(s.dense, 6);
  EXPECT_EQ(s.layer.at(13), 3);
  EXPECT_EQ(*s.mtp, 4);
  EXPECT_EQ(s.ToString(), "experts=2,dense=6,layer.13=3,mtp=4");
  EXPECT_THROW(Exl3BitsSpec::Parse("experts=2"), std::invalid_argument);
  EXPECT_THROW(Exl3BitsSpec::Parse("experts=2,dense=9"), std::invalid_argument);
  EXPECT_THROW(Exl3BitsSpec::Parse("experts=2,dense=6,layers.1=3"), std::invalid_argument);
}

TEST(Exl3Plan, Classes) {
  const Exl3BitsSpec s = Exl3BitsSpec::Parse("experts=2,dense=6,layer.3=3,mtp=4");
  EXPECT_EQ(PlanExl3Tensor("layers.3.ffn.experts.17.w2.weight", s).K, 3);
  EXPECT_EQ(PlanExl3Tensor("layers.4.ffn.experts.17.w1.weight", s).K, 2);
  EXPECT_EQ(PlanExl3Tensor("mtp.0.ffn.experts.0.w3.weight", s).K, 4);
  EXPECT_EQ(PlanExl3Tensor("layers.3.attn.indexer.compressor.wgate.weight", s).K, 6);
  EXPECT_EQ(PlanExl3Tensor("layers.3.ffn.shared_experts.w2.weight", s).prefix, "layers.3.ffn.shared_experts.w2");
  for (const char* keep : {"embed.weight", "head.weight", "layers.3.ffn.gate.weight", "layers.3.attn.compressor.ape",
                           "layers.3.attn.indexer.weights_proj.weight", "mtp.0.e_proj.weight", "layers.3.attn_norm.weight",
                           "layers.3.hc_attn_fn", "layers.3.attn.attn_sink"})
    EXPECT_EQ(PlanExl3Tensor(keep, s).cls, Exl3TensorClass::kKeep) << keep;
  EXPECT_EQ(ModuleOf("layers.12.attn.wq_a.weight"), "layers.12");
  EXPECT_EQ(ModuleOf("embed.weight"), "");
}

TEST(Exl3Quantize, TinyCheckpoint) {
  const fs::path root = fs::path(::testing::TempDir()) / "exl3_quantize_test";
  fs::remove_all(root);
  fs::create_directories(root);
  const fs::path in = root / "bf16", out = root / "exl3";
  TinyModelSpec spec;
  spec.vocab_size = 512;
  spec.compress_ratios = {0, 4};
  spec.n_routed_experts = 4;
  WriteTinyModel(in.string(), 3, spec);
  { std::ofstream(in / "tokenizer.json") << "{\"fake\": true}\n"; }

  QuantizeCheckpointOptions opt;
  opt.model_dir = in.string();
  opt.out_dir = out.string();
  opt.bits = Exl3BitsSpec::Parse("experts=2,dense=6,layer.1=3");
  opt.progress = false;
  const QuantizeCheckpointSummary s = QuantizeCheckpoint(opt);
  std::printf("quantized the test checkpoint in %.1f s: %lld linears, %lld tiles, %.2f bits average\n", s.seconds,
              static_cast<long long>(s.tensors_quantized), static_cast<long long>(s.tiles), s.average_bits);
  EXPECT_GT(s.tensors_quantized, 0);
  EXPECT_EQ(s.shards, 1);

  const Checkpoint src = Checkpoint::Open(in.string()), dst = Checkpoint::Open(out.string());
  int quantized = 0;
  for (const std::string& name : src.names()) {
    const Exl3TensorPlan plan = PlanExl3Tensor(name, opt.bits);
    const Tensor t = src.Get(name);
    if (plan.cls == Exl3TensorClass::kKeep) {
      ASSERT_TRUE(dst.Has(name)) << name;
      const Tensor d = dst.Get(name);
      ASSERT_EQ(d.dtype, t.dtype) << name;
      ASSERT_EQ(d.shape, t.shape) << name;
      ASSERT_EQ(std::memcmp(d.data, t.data, t.nbytes()), 0) << name;
      continue;
    }
    ++quantized;
    EXPECT_FALSE(dst.Has(name)) << name;
    ASSERT_TRUE(HasExl3Weight(dst, plan.prefix)) << name;
    const Exl3Weight w = LoadExl3Weight(dst, plan.prefix, t.shape[1], t.shape[0]);
    EXPECT_EQ(w.codebook, Exl3Codebook::kMcg);
    EXPECT_EQ(w.K, plan.K) << name;
    EXPECT_EQ(w.K, name.find("ffn.experts.") == std::string::npos ? 6 : name.rfind("layers.1.", 0) == 0 ? 3 : 2) << name;
    // Dequantized W (k x n) against the source [out, in].
    const std::vector<float> W = Exl3OriginalWeightF32(w), ref = ToFloatVector(t);
    double err2 = 0, ref2 = 0;
    for (int64_t o = 0; o < t.shape[0]; ++o)
      for (int64_t i = 0; i < t.shape[1]; ++i) {
        const double d = W[i * w.n_padded() + o] - ref[o * t.shape[1] + i];
        err2 += d * d;
        ref2 += double(ref[o * t.shape[1] + i]) * ref[o * t.shape[1] + i];
      }
    const double rel = std::sqrt(err2 / ref2), bound = w.K == 2 ? 0.32 : w.K == 3 ? 0.17 : 0.03;
    EXPECT_LT(rel, bound) << name << " K=" << w.K;
    for (int64_t o = t.shape[0]; o < w.n_padded(); ++o) EXPECT_EQ(w.svh.as<uint16_t>()[o] & 0x7FFF, 0) << name;
  }
  EXPECT_EQ(quantized, s.tensors_quantized);

  const nlohmann::json config = nlohmann::json::parse(Slurp(out / "config.json"));
  const nlohmann::json& qc = config.at("quantization_config");
  EXPECT_EQ(qc.at("quant_method"), "exl3");
  EXPECT_EQ(qc.at("codebook"), "mcg");
  EXPECT_EQ(qc.at("bits_per_class").at("experts"), 2);
  EXPECT_EQ(qc.at("bits_per_class").at("dense"), 6);
  EXPECT_EQ(qc.at("bits_per_class").at("layer.1"), 3);
  EXPECT_EQ(config.at("hidden_size"), nlohmann::json::parse(Slurp(in / "config.json")).at("hidden_size"));
  const nlohmann::json qfile = nlohmann::json::parse(Slurp(out / "quantization_config.json"));
  EXPECT_EQ(qfile.at("tensor_storage").size(), static_cast<size_t>(s.tensors_quantized));
  EXPECT_EQ(Slurp(out / "tokenizer.json"), "{\"fake\": true}\n");

  // Refuses to overwrite without --force, and leaves the existing pack alone.
  try {
    QuantizeCheckpoint(opt);
    ADD_FAILURE() << "overwrote without force";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  // With force (and several shards), the pack is replaced atomically; no temporary directory remains.
  opt.force = true;
  opt.shard_bytes = 1 << 20;
  const QuantizeCheckpointSummary s2 = QuantizeCheckpoint(opt);
  EXPECT_GT(s2.shards, 1);
  EXPECT_TRUE(fs::exists(out / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));
  EXPECT_TRUE(HasExl3Weight(Checkpoint::Open(out.string()), "layers.0.attn.wq_a"));
  for (const fs::directory_entry& e : fs::directory_iterator(root))
    EXPECT_TRUE(e.path().filename() == "bf16" || e.path().filename() == "exl3") << e.path();

  // A failing run (input without linears) leaves no output and no temporary directory behind.
  const fs::path empty = root / "empty";
  fs::create_directories(empty);
  { std::ofstream(empty / "config.json") << "{}"; }
  SafetensorsWriter wr;
  float one = 1;
  wr.Add("norm.weight", DType::kF32, {1}, &one, 4);
  wr.Write((empty / "model.safetensors").string());
  opt.model_dir = empty.string();
  opt.out_dir = (root / "never").string();
  EXPECT_THROW(QuantizeCheckpoint(opt), std::runtime_error);
  EXPECT_FALSE(fs::exists(root / "never"));
  for (const fs::directory_entry& e : fs::directory_iterator(root))
    EXPECT_EQ(e.path().filename().string().find(".partial"), std::string::npos) << e.path();
  fs::remove_all(root);
}

}  // namespace
}  // namespace dsmesh
