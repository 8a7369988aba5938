// Synthetic models (model/testing/synthetic.h): the source spelling, the V4-Flash config, and a small synthetic
// model that runs with finite, seed-determined logits on the CPU backend (the GPU twin is checked
// against this one in gpu_forward_test).
#include "model/testing/synthetic.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "kernels/cpu/cpu_backend.h"
#include "model/model.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace {

using testing_util::SmallSpec;
using testing_util::TempDir;
using testing_util::Tokens;

TEST(Synthetic, ParsesTheSourceAndRefusesBadItems) {
  SyntheticSpec s = ParseSyntheticSource("synthetic:v4-flash");
  EXPECT_EQ(s.base, "v4-flash");
  EXPECT_EQ(s.seed, 0u);
  EXPECT_EQ(s.bits.experts, 2);
  EXPECT_EQ(s.bits.dense, 6);
  s = ParseSyntheticSource("synthetic:v4-flash:seed=7,experts=3,dense=4,layer.13=3");
  EXPECT_EQ(s.seed, 7u);
  EXPECT_EQ(s.bits.experts, 3);
  EXPECT_EQ(s.bits.dense, 4);
  EXPECT_EQ(s.bits.layer.at(13), 3);
  EXPECT_THROW(ParseSyntheticSource("synthetic:"), std::invalid_argument);
  EXPECT_THROW(ParseSyntheticSource("synthetic:v4-flash:seed=x"), std::invalid_argument);
  EXPECT_THROW(ParseSyntheticSource("synthetic:v4-flash:experts=11"), std::invalid_argument);
  const ModelConfig c = SyntheticConfig(ParseSyntheticSource("synthetic:v4-flash"));
  EXPECT_EQ(c.num_layers, 43);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.n_routed_experts, 256);
}

TEST(Synthetic, SmallModelRunsWithFiniteSeededLogits) {
  const std::string dir = TempDir("synthetic_small");
  WriteTinyModel(dir, 1, SmallSpec());  // only its config.json is used
  auto run = [&](const std::string& source) {
    auto m = LoadModel(source, ShardSpec{}, MakeCpuBackend());
    auto st = m->NewState();
    return m->Forward({{st.get(), Tokens(40, 512, 3), false}})[0].logits;
  };
  Tensor a = run("synthetic:" + dir + ":seed=1");
  Tensor b = run("synthetic:" + dir + ":seed=1");
  Tensor c = run("synthetic:" + dir + ":seed=2");
  double sum = 0, sq = 0;
  const float* p = a.as<float>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(p[i]));
    sum += p[i];
    sq += p[i] * p[i];
  }
  const double mean = sum / a.numel(), stddev = std::sqrt(sq / a.numel() - mean * mean);
  std::printf("synthetic small model: logits mean %.3g std %.3g\n", mean, stddev);
  EXPECT_GT(stddev, 1e-3);
  EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes()), 0) << "same seed, different logits";
  EXPECT_NE(std::memcmp(a.data, c.data, a.nbytes()), 0) << "the seed changes nothing";
}

TEST(Synthetic, TensorParallelShardsMatchTheWholeModel) {
  const std::string dir = TempDir("synthetic_tp");
  WriteTinyModel(dir, 1, SmallSpec());
  const std::string source = "synthetic:" + dir + ":seed=5";
  auto whole = LoadModel(source, ShardSpec{}, MakeCpuBackend());
  auto st = whole->NewState();
  const std::vector<int32_t> prompt = Tokens(30, 512, 4);
  Tensor want = whole->Forward({{st.get(), prompt, false}})[0].logits;
  testing_util::ThreadGroup group(2);
  std::vector<Tensor> got(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      testing_util::ThreadCommunicator comm(&group, r, 2);
      auto m = LoadModel(source, ShardSpec{r, 2}, MakeCpuBackend(), &comm);
      auto s = m->NewState();
      got[r] = m->Forward({{s.get(), prompt, false}})[0].logits;
    });
  for (auto& t : ranks) t.join();
  EXPECT_LE(testing_util::RelL2(got[0].as<float>(), want.as<float>(), want.numel()), 1e-5);
}

}  // namespace
}  // namespace dsmesh
