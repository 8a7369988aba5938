#include "worker/sampler.h"

#include <cmath>
#include <map>

#include <gtest/gtest.h>

namespace dsmesh {
namespace {

SamplingParams Params(float temperature) {
  SamplingParams p;
  p.set_temperature(temperature);
  p.set_top_p(1);
  return p;
}

TEST(Sampler, GreedyTakesArgmaxLowestIdOnTies) {
  const float logits[] = {0.5f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(SampleToken(logits, 4, Params(0), 1, 0, {}).token_id, 1);
}

TEST(Sampler, GreedyOverALongVocabularyFindsTheFirstMaxAndSkipsNaN) {
  std::vector<float> logits(129281);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.001f * i);
  logits[3] = std::nanf("");
  logits[70001] = 5.0f;
  logits[129280] = 5.0f;  // the tail (not a multiple of 8) holds a tie
  EXPECT_EQ(SampleToken(logits.data(), logits.size(), Params(0), 1, 0, {}).token_id, 70001);
  logits[70001] = 1.0f;
  EXPECT_EQ(SampleToken(logits.data(), logits.size(), Params(0), 1, 0, {}).token_id, 129280);
}

TEST(Sampler, SameSeedAndPositionSameToken_DifferentPositionsVary) {
  std::vector<float> logits(50, 0.0f);
  std::map<int32_t, int> seen;
  for (int pos = 0; pos < 200; ++pos) {
    int32_t a = SampleToken(logits.data(), 50, Params(1), 42, pos, {}).token_id;
    EXPECT_EQ(a, SampleToken(logits.data(), 50, Params(1), 42, pos, {}).token_id);
    ++seen[a];
  }
  EXPECT_GT(seen.size(), 30u);  // uniform over 50 tokens: 200 draws hit most of them
}

TEST(Sampler, FrequenciesFollowSoftmaxOfScaledLogits) {
  const float logits[] = {std::log(0.2f), std::log(0.3f), std::log(0.5f)};
  std::vector<int> count(3);
  const int n = 20000;
  for (int pos = 0; pos < n; ++pos) ++count[SampleToken(logits, 3, Params(1), 7, pos, {}).token_id];
  EXPECT_NEAR(count[0] / double(n), 0.2, 0.015);
  EXPECT_NEAR(count[1] / double(n), 0.3, 0.015);
  EXPECT_NEAR(count[2] / double(n), 0.5, 0.015);
  // Temperature 2 flattens: p ~ sqrt(q) normalized.
  std::fill(count.begin(), count.end(), 0);
  for (int pos = 0; pos < n; ++pos) ++count[SampleToken(logits, 3, Params(2), 7, pos, {}).token_id];
  const double z = std::sqrt(0.2) + std::sqrt(0.3) + std::sqrt(0.5);
  EXPECT_NEAR(count[0] / double(n), std::sqrt(0.2) / z, 0.015);
}

TEST(Sampler, TopKTopPMinPCutTheTail) {
  const float logits[] = {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};
  SamplingParams k = Params(1);
  k.set_top_k(2);
  SamplingParams p = Params(1);
  p.set_top_p(0.65f);  // 0.4 + 0.3 >= 0.65: keeps tokens 3 and 2
  SamplingParams m = Params(1);
  m.set_min_p(0.6f);   // keeps p >= 0.24: tokens 3 and 2
  for (int pos = 0; pos < 2000; ++pos) {
    EXPECT_GE(SampleToken(logits, 4, k, 3, pos, {}).token_id, 2);
    EXPECT_GE(SampleToken(logits, 4, p, 3, pos, {}).token_id, 2);
    EXPECT_GE(SampleToken(logits, 4, m, 3, pos, {}).token_id, 2);
  }
  SamplingParams one = Params(1);
  one.set_top_k(1);
  EXPECT_EQ(SampleToken(logits, 4, one, 3, 5, {}).token_id, 3);
}

TEST(Sampler, PenaltiesLowerRepeatedTokens) {
  const float logits[] = {1.0f, 1.2f, 0.0f};
  PenaltyState pen;
  pen.AddOutputToken(1);
  SamplingParams f = Params(0);
  f.set_frequency_penalty(0.5f);
  EXPECT_EQ(SampleToken(logits, 3, f, 0, 0, pen).token_id, 0);
  SamplingParams r = Params(0);
  r.set_repetition_penalty(1.5f);  // 1.2 / 1.5 = 0.8 < 1.0
  EXPECT_EQ(SampleToken(logits, 3, r, 0, 0, pen).token_id, 0);
  PenaltyState prompt_only;
  prompt_only.AddPromptToken(1);
  EXPECT_EQ(SampleToken(logits, 3, r, 0, 0, prompt_only).token_id, 0);
  SamplingParams none = Params(0);
  EXPECT_EQ(SampleToken(logits, 3, none, 0, 0, pen).token_id, 1);
}

TEST(Sampler, LogprobsAreRawLogSoftmaxWithTopN) {
  const float logits[] = {0.0f, 1.0f, 2.0f};
  SamplingParams p = Params(0);
  p.set_want_logprobs(true);
  p.set_logprobs(2);
  auto r = SampleToken(logits, 3, p, 0, 0, {});
  const double z = std::log(1 + std::exp(1.0) + std::exp(2.0));
  EXPECT_EQ(r.logprobs.token_id(), 2);
  EXPECT_NEAR(r.logprobs.logprob(), 2 - z, 1e-6);
  ASSERT_EQ(r.logprobs.top_size(), 2);
  EXPECT_EQ(r.logprobs.top(1).token_id(), 1);
  EXPECT_NEAR(r.logprobs.top(1).logprob(), 1 - z, 1e-6);
}

TEST(Sampler, ValidationNamesTheField) {
  SamplingParams p = Params(-1);
  try {
    ValidateSamplingParams(p, 10);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("temperature"), std::string::npos);
  }
  p = Params(1);
  p.add_stop_token_ids(10);
  EXPECT_THROW(ValidateSamplingParams(p, 10), std::invalid_argument);
}

}  // namespace
}  // namespace dsmesh
