// The pieces every bench mode shares: the nearest-rank percentile (against the worked example of its
// textbook definition) and the synthetic prompts' contracts (range, determinism, distinctness, size).
#include <cmath>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/bench/percentile.h"
#include "cli/bench/synthetic_prompts.h"

namespace dsmesh {
namespace {

TEST(Median, OddEvenAndEmpty) {
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(Median({}), 0);
}

TEST(Percentile, NearestRankOfTheTextbookExample) {
  // The nearest-rank method's worked example (Wikipedia, "Percentile"): 15, 20, 35, 40, 50.
  const std::vector<double> v = {40, 15, 50, 35, 20};  // order must not matter
  EXPECT_EQ(Percentile(v, 5), 15);
  EXPECT_EQ(Percentile(v, 30), 20);
  EXPECT_EQ(Percentile(v, 40), 20);
  EXPECT_EQ(Percentile(v, 50), 35);
  EXPECT_EQ(Percentile(v, 100), 50);
  EXPECT_EQ(Percentile(v, 0), 15);
}

TEST(Percentile, P50AndP99OfOneToAHundred) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(Percentile(v, 50), 50);
  EXPECT_EQ(Percentile(v, 99), 99);
  EXPECT_EQ(Percentile(v, 99.5), 100);
  EXPECT_EQ(Percentile({7}, 1), 7);
  EXPECT_EQ(Percentile({7}, 99), 7);
}

TEST(Percentile, EmptyIsNanAndBadRankThrows) {
  EXPECT_TRUE(std::isnan(Percentile({}, 50)));
  EXPECT_THROW(Percentile({1, 2}, 101), std::invalid_argument);
  EXPECT_THROW(Percentile({1, 2}, -1), std::invalid_argument);
  EXPECT_THROW(Percentile({1, 2}, NAN), std::invalid_argument);
}

TEST(SyntheticPrompts, RandomTokenIdsAreInRangeRepeatableAndDistinctPerSeed) {
  const std::vector<int32_t> a = RandomTokenIds(1000, 7);
  ASSERT_EQ(a.size(), 1000u);
  std::set<int32_t> seen;
  for (int32_t id : a) {
    EXPECT_GE(id, 2);
    EXPECT_LE(id, 501);
    seen.insert(id);
  }
  EXPECT_GT(seen.size(), 400u) << "ids should cover most of 2..501";
  EXPECT_EQ(RandomTokenIds(1000, 7), a);
  std::set<std::vector<int32_t>> prompts;
  for (uint32_t seed = 0; seed < 200; ++seed) prompts.insert(RandomTokenIds(16, seed));
  EXPECT_EQ(prompts.size(), 200u);
  EXPECT_TRUE(RandomTokenIds(0, 1).empty());
  EXPECT_TRUE(RandomTokenIds(-3, 1).empty());
}

TEST(SyntheticPrompts, TokenAtPositionStaysInTheVocabulary) {
  for (int64_t vocab : {512, 129280})
    for (int64_t i = 0; i < 5000; ++i) {
      const int32_t t = TokenAtPosition(i, vocab);
      ASSERT_GE(t, 0);
      ASSERT_LT(t, vocab);
      ASSERT_NE(t, TokenAtPosition(i + 1, vocab)) << i;
    }
}

TEST(SyntheticPrompts, NumberedWordPromptsHaveTheirWordsAndDiffer) {
  const std::string p = NumberedWordPrompt(3, 32);
  EXPECT_EQ(p.rfind("Request 3:", 0), 0u) << p;
  int words = 0;
  for (char c : p) words += c == ' ';
  EXPECT_EQ(words, 1 + 32) << p;
  std::set<std::string> after_index;
  for (int i = 0; i < 300; ++i) {
    const std::string q = NumberedWordPrompt(i, 4);
    after_index.insert(q.substr(q.find(':')));
  }
  EXPECT_EQ(after_index.size(), 300u);
}

TEST(SyntheticPrompts, FillerTextHasExactlyTheBytesAsked) {
  EXPECT_EQ(FillerText(0), "");
  EXPECT_EQ(FillerText(-5), "");
  EXPECT_EQ(FillerText(12), "word0 word1 ");
  EXPECT_EQ(FillerText(100000).size(), 100000u);
}

}  // namespace
}  // namespace dsmesh
