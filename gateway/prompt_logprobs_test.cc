// prompt_logprobs from logits rows: vLLM's shape (null first), logprob/rank of the prompt token, top-k,
// rows beyond the prompt ignored, missing rows reported.
#include "gateway/prompt_logprobs.h"

#include <cmath>

#include <gtest/gtest.h>

namespace dsmesh {
namespace {

TEST(PromptLogprobs, VllmShape) {
  PromptLogprobs p({3, 1, 2}, 2, [](int id) { return "t" + std::to_string(id); });
  const float r0[4] = {0.0f, 1.0f, 2.0f, 3.0f};  // predicts token 1 (rank 3)
  const float r1[4] = {5.0f, 0.0f, 0.0f, 0.0f};  // predicts token 2 (rank 2, tied with 1 and 3)
  const float r2[4] = {9.0f, 9.0f, 9.0f, 9.0f};  // predicts the first generated token: ignored
  EXPECT_EQ(p.FirstMissing(), 0);
  p.AddRow(2, r2, 4);
  p.AddRow(1, r1, 4);
  EXPECT_EQ(p.FirstMissing(), 0);
  p.AddRow(0, r0, 4);
  EXPECT_EQ(p.FirstMissing(), std::nullopt);
  const nlohmann::json j = p.ToJson();
  ASSERT_EQ(j.size(), 3u);
  EXPECT_TRUE(j[0].is_null());
  const double lse0 = std::log(1 + std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(j[1]["1"]["logprob"].get<double>(), 1.0 - lse0, 1e-12);
  EXPECT_EQ(j[1]["1"]["rank"], 3);
  EXPECT_EQ(j[1]["1"]["decoded_token"], "t1");
  EXPECT_EQ(j[1].size(), 3u);  // the prompt token + top 2 (tokens 3 and 2)
  EXPECT_EQ(j[1]["3"]["rank"], 1);
  EXPECT_EQ(j[1]["2"]["rank"], 2);
  EXPECT_EQ(j[2]["2"]["rank"], 2);
  EXPECT_EQ(j[2].size(), 3u);  // token 2 + the top 2, tokens 0 and 1 (ties go to the lower id)
}

TEST(PromptLogprobs, KZeroGivesThePromptTokenOnly) {
  PromptLogprobs p({0, 1}, 0, [](int) { return std::string(); });
  const float r[3] = {0.0f, 0.0f, 0.0f};
  p.AddRow(0, r, 3);
  const nlohmann::json j = p.ToJson();
  ASSERT_EQ(j[1].size(), 1u);
  EXPECT_NEAR(j[1]["1"]["logprob"].get<double>(), -std::log(3.0), 1e-12);
  EXPECT_EQ(j[1]["1"]["rank"], 1);
}

}  // namespace
}  // namespace dsmesh
