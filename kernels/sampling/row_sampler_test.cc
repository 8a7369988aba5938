// The reference row sampler: greedy ties and NaN, the cuts (min_p, top_k, top_p) on integer weights,
// the seeded draw's frequencies, and logprobs of the raw logits.
#include "kernels/sampling/row_sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace dsmesh {
namespace {

RowSampling Sampled(float temperature) {
  RowSampling p;
  p.temperature = temperature;
  p.seed = 11;
  return p;
}

TEST(RowSampler, GreedyIsTheLowestIdOfTheLargestLogit) {
  const float x[] = {0.5f, 2.0f, std::nanf(""), 2.0f};
  EXPECT_EQ(SampleRowToken(x, 4, RowSampling{}), 1);
}

TEST(RowSampler, CandidatesAreOrderedByScaledLogitThenId) {
  const float x[] = {1.0f, 3.0f, 1.0f, 2.0f};
  const TokenDist d = ProcessedRowDist(x, 4, Sampled(1));
  ASSERT_EQ(d.ids, (std::vector<int32_t>{1, 3, 0, 2}));
  EXPECT_EQ(d.weights[0], std::ldexp(1.0, sampling::WeightShift(4)));
  EXPECT_EQ(d.weights[2], d.weights[3]);
}

TEST(RowSampler, CutsKeepThePrefixTheyShould) {
  const float x[] = {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};
  RowSampling k = Sampled(1);
  k.top_k = 2;
  EXPECT_EQ(ProcessedRowDist(x, 4, k).ids, (std::vector<int32_t>{3, 2}));
  RowSampling p = Sampled(1);
  p.top_p = 0.65f;
  EXPECT_EQ(ProcessedRowDist(x, 4, p).ids, (std::vector<int32_t>{3, 2}));
  p.top_p = 0.75f;
  EXPECT_EQ(ProcessedRowDist(x, 4, p).ids, (std::vector<int32_t>{3, 2, 1}));
  RowSampling m = Sampled(1);
  m.min_p = 0.6f;  // keeps p >= 0.24
  EXPECT_EQ(ProcessedRowDist(x, 4, m).ids, (std::vector<int32_t>{3, 2}));
}

TEST(RowSampler, TokensFarBelowTheTopWeighNothing) {
  const float x[] = {0.0f, -40.0f, -std::numeric_limits<float>::infinity(), -1.0f};
  EXPECT_EQ(ProcessedRowDist(x, 4, Sampled(1)).ids, (std::vector<int32_t>{0, 3}));
}

TEST(RowSampler, DrawFrequenciesFollowTheSoftmax) {
  const float x[] = {std::log(0.2f), std::log(0.3f), std::log(0.5f)};
  std::vector<int> count(3);
  const int n = 20000;
  RowSampling p = Sampled(1);
  for (int pos = 0; pos < n; ++pos) {
    p.position = pos;
    ++count[SampleRowToken(x, 3, p)];
  }
  EXPECT_NEAR(count[0] / double(n), 0.2, 0.015);
  EXPECT_NEAR(count[1] / double(n), 0.3, 0.015);
  EXPECT_NEAR(count[2] / double(n), 0.5, 0.015);
}

TEST(RowSampler, LogprobsOfTheRawLogitsWithTopN) {
  const float x[] = {0.0f, 1.0f, 2.0f, 1.0f};
  RowSampling p;
  p.logprobs = 3;
  const SampledRow r = SampleRow(x, 4, p);
  const double z = std::log(1 + 2 * std::exp(1.0) + std::exp(2.0));
  EXPECT_EQ(r.token, 2);
  EXPECT_NEAR(r.logprob, 2 - z, 1e-6);
  EXPECT_EQ(r.top_ids, (std::vector<int32_t>{2, 1, 3}));
  EXPECT_NEAR(r.top_logprobs[2], 1 - z, 1e-6);
}

}  // namespace
}  // namespace dsmesh
