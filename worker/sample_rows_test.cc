// The CPU backend's SampleRows (the reference of the device sampler) against the worker's SampleToken on
// many random logit rows and parameter sets: the same token and bitwise the same logprobs. Rows without
// penalties or masks are the rows the step executor samples on the device.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "worker/sampler.h"

namespace dsmesh {
namespace {

// A parameter set drawn from what requests use: greedy, temperature alone, with top_k/top_p/min_p
// singly and together, seeded, with and without logprobs.
SamplingParams RandomParams(std::mt19937& rng) {
  SamplingParams p;
  std::uniform_int_distribution<int> pick(0, 9);
  const float temps[] = {0.0f, 0.0f, 0.3f, 0.7f, 1.0f, 1.0f, 1.3f, 2.0f, 0.05f, 1e-6f};
  p.set_temperature(temps[pick(rng)]);
  if (pick(rng) < 5) p.set_top_k(std::uniform_int_distribution<int>(1, 300)(rng));
  if (pick(rng) < 5) p.set_top_p(std::uniform_real_distribution<float>(0.05f, 1.0f)(rng));
  if (pick(rng) < 3) p.set_min_p(std::uniform_real_distribution<float>(0.0f, 0.5f)(rng));
  if (pick(rng) < 4) p.set_want_logprobs(true);
  if (pick(rng) < 3) p.set_logprobs(std::uniform_int_distribution<int>(0, 20)(rng));
  return p;
}

// Logit rows of several shapes: wide normal, peaked (a few tokens far above), many exact ties
// (quantized values), -inf masked stretches.
std::vector<float> RandomRow(std::mt19937& rng, int64_t vocab, int kind) {
  std::vector<float> x(vocab);
  std::normal_distribution<float> nd(0.0f, kind == 1 ? 3.0f : 1.0f);
  for (float& v : x) v = nd(rng);
  if (kind == 1)
    for (int i = 0; i < 5; ++i) x[std::uniform_int_distribution<int64_t>(0, vocab - 1)(rng)] += 15.0f;
  if (kind == 2)
    for (float& v : x) v = std::round(v * 4.0f) / 4.0f;
  if (kind == 3)
    for (int64_t i = 0; i < vocab; i += 3) x[i] = -std::numeric_limits<float>::infinity();
  return x;
}

TEST(SampleRows, CpuOpEqualsSampleTokenOnRandomRowsAndParameters) {
  auto cpu = MakeCpuBackend(1);
  std::mt19937 rng(2024);
  int sampled = 0;
  for (int64_t vocab : {7, 1000, 129280}) {
    const int rows = vocab > 100000 ? 24 : 120;
    Tensor logits = AllocateTensor(DType::kF32, {rows, vocab});
    std::vector<SamplingParams> params(rows);
    std::vector<RowSampling> spec(rows);
    for (int r = 0; r < rows; ++r) {
      const std::vector<float> x = RandomRow(rng, vocab, r % 4);
      std::copy(x.begin(), x.end(), logits.as<float>() + r * vocab);
      params[r] = RandomParams(rng);
      const uint64_t seed = rng();
      const int64_t position = std::uniform_int_distribution<int64_t>(0, 400000)(rng);
      spec[r] = RowSamplingOf(params[r], seed, position);
    }
    const std::vector<SampledRow> got = cpu->SampleRows(logits, spec);
    ASSERT_EQ(got.size(), static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      const SampleResult want = SampleToken(logits.as<float>() + r * vocab, vocab, params[r], spec[r].seed,
                                            spec[r].position, {});
      SCOPED_TRACE("vocab " + std::to_string(vocab) + " row " + std::to_string(r) + ": " + params[r].ShortDebugString());
      EXPECT_EQ(got[r].token, want.token_id);
      sampled += params[r].temperature() >= 1e-5f;
      if (spec[r].logprobs < 0) continue;
      EXPECT_EQ(got[r].logprob, want.logprobs.logprob());
      ASSERT_EQ(static_cast<int>(got[r].top_ids.size()), want.logprobs.top_size());
      for (int i = 0; i < want.logprobs.top_size(); ++i) {
        EXPECT_EQ(got[r].top_ids[i], want.logprobs.top(i).token_id());
        EXPECT_EQ(got[r].top_logprobs[i], want.logprobs.top(i).logprob());
      }
    }
  }
  EXPECT_GT(sampled, 100);  // most rows drew (not greedy)
}

}  // namespace
}  // namespace dsmesh
