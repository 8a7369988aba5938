// The image placeholder's expansion, on blocks worked by hand from vLLM's build_image_block description.
#include "common/vision/image_prompt.h"

#include <gtest/gtest.h>

namespace dsmesh {
namespace {

constexpr int32_t kP = 999;  // the placeholder's id in these tests
constexpr int32_t S = kImageSentinelBaseId + kImageStart, PAD = kImageSentinelBaseId + kImagePad,
                  I = kImageSentinelBaseId + kImageToken, NL = kImageSentinelBaseId + kImageNewline,
                  E = kImageSentinelBaseId + kImageEnd;

TEST(ImagePromptTest, TwoByTwoGridAtPositionOne) {
  // Starts at 1: 3 - 1 % 4 = 2 pads. Rows (0,1) read column by column: I I | I I | NL NL; 3 columns of a
  // pair -> 6 slots, 1 pair x 3 = 3 odd -> 2 trailing pads.
  const ExpandedPrompt p = ExpandImagePlaceholders({10, kP, 11}, kP, {{2, 2}});
  const std::vector<int32_t> want = {10, PAD, PAD, S, I, I, I, I, NL, NL, PAD, PAD, E, 11};
  EXPECT_EQ(p.tokens, want);
  ASSERT_EQ(p.images.size(), 1u);
  EXPECT_EQ(p.images[0].begin, 1);
  EXPECT_EQ(p.images[0].length, 12);
  EXPECT_EQ(p.images[0].embed_positions, (std::vector<int64_t>{4, 5, 6, 7}));
  // Slot order (0,0), (1,0), (0,1), (1,1) of the row-major grid.
  EXPECT_EQ(p.images[0].perm, (std::vector<int>{0, 2, 1, 3}));
}

TEST(ImagePromptTest, OddRowCountGetsAPadRow) {
  // 1 x 3 at position 3: no alignment pad; row 1 is a pad row; 4 columns x 2 = 8 slots, 1 pair x 4 even.
  const ExpandedPrompt p = ExpandImagePlaceholders({1, 2, 3, kP}, kP, {{1, 3}});
  const std::vector<int32_t> want = {1, 2, 3, S, I, PAD, I, PAD, I, PAD, NL, PAD, E};
  EXPECT_EQ(p.tokens, want);
  EXPECT_EQ(p.images[0].embed_positions, (std::vector<int64_t>{4, 6, 8}));
  EXPECT_EQ(p.images[0].perm, (std::vector<int>{0, 1, 2}));
}

TEST(ImagePromptTest, EachBlockIsAlignedWhereItLands) {
  const ExpandedPrompt p = ExpandImagePlaceholders({7, kP, 8, kP}, kP, {{2, 2}, {3, 1}});
  ASSERT_EQ(p.images.size(), 2u);
  for (const ImageSpan& s : p.images) {
    // The START token sits at 3 mod 4, so the grid starts on a multiple of 4.
    int64_t start = s.begin;
    while (p.tokens[start] == PAD) ++start;
    EXPECT_EQ(p.tokens[start], S);
    EXPECT_EQ((start + 1) % 4, 0);
    EXPECT_EQ(p.tokens[s.begin + s.length - 1], E);
    for (int64_t pos : s.embed_positions) EXPECT_EQ(p.tokens[pos], I);
  }
  EXPECT_EQ(p.images[1].begin, 1 + p.images[0].length + 1);
  EXPECT_EQ(p.tokens.size(), 2 + p.images[0].length + p.images[1].length);
  EXPECT_EQ(p.images[1].perm, (std::vector<int>{0, 1, 2}));  // 3 x 1: (0,0), (1,0), then (2,0) of the next pair
}

TEST(ImagePromptTest, PlaceholderCountMustMatchImages) {
  EXPECT_THROW(ExpandImagePlaceholders({kP, kP}, kP, {{1, 1}}), std::runtime_error);
  EXPECT_THROW(ExpandImagePlaceholders({1}, kP, {{1, 1}}), std::runtime_error);
  EXPECT_EQ(ExpandImagePlaceholders({1, 2}, kP, {}).tokens, (std::vector<int32_t>{1, 2}));
}

}  // namespace
}  // namespace dsmesh
