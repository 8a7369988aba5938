// Vision preprocessing against an independent Python implementation (common/vision/testdata/
// vision_preprocess_reference.py: Pillow resizes and pads, numpy reshapes, run at test time with Debian's
// python3-pil and python3-numpy), plus hand-worked cases of the size rule and the token block.
#include "common/vision/vision_preprocess.h"

#include <sys/wait.h>

#include <cstdio>
#include <array>
#include <cstring>
#include <sstream>

#include <gtest/gtest.h>

namespace dsmesh {
namespace {

std::string RunReference(const std::string& args) {
  const std::string command = "/usr/bin/python3 common/vision/testdata/vision_preprocess_reference.py " + args;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run " + command);
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  if (pclose(pipe) != 0) throw std::runtime_error("failed: " + command);
  return out;
}

// The pattern image of the reference script.
RgbImage Pattern(int w, int h) {
  RgbImage im;
  im.width = w;
  im.height = h;
  im.pixels.resize(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        im.pixels[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>((x * 7 + y * 13 + c * 50 + (x * y) % 11 + ((x / 5 + y / 3) % 2) * 90) % 256);
  return im;
}

std::string GridLine(const ImageGrid& g) {
  std::ostringstream s;
  s << g.best_width << " " << g.best_height << " " << g.vit_h << " " << g.vit_w << " " << g.llm_h << " " << g.llm_w
    << " " << g.block_tokens;
  return s.str();
}

const VisionConfig kConfig;  // V4-Flash-Vision: patch 14, ratio 3, 384 tokens, 147456 pixels, 8:1

TEST(VisionPreprocessTest, DefaultsAreTheFlashVisionConfig) {
  VisionConfig c = VisionConfig::FromJson(nlohmann::json::parse(R"({"vision_n_layers": 32})"));
  EXPECT_EQ(c.n_layers, 32);
  EXPECT_EQ(c.dim, 1024);
  EXPECT_EQ(c.n_heads, 16);
  EXPECT_EQ(c.inter_dim, 2816);
  EXPECT_EQ(c.patch_size, 14);
  EXPECT_EQ(c.downsample_ratio, 3);
  EXPECT_EQ(c.max_n_token, 384);
  EXPECT_EQ(c.min_pixels, 147456);
  EXPECT_EQ(c.max_wh_ratio, 8.0);
  EXPECT_FALSE(VisionConfig::FromJson(nlohmann::json::parse(R"({"vision_max_wh_ratio": null})")).max_wh_ratio);
  EXPECT_THROW(VisionConfig::FromJson(nlohmann::json::parse(R"({"vision_patch_size": "14"})")), std::runtime_error);
  EXPECT_THROW(VisionConfig::FromJson(nlohmann::json::parse(R"({"vision_dim": 1000})")), std::runtime_error);
}

// Worked by hand from the rule (see vision_preprocess.h).
TEST(VisionPreprocessTest, SizeRuleByHand) {
  // 1000 x 1000: rounded up to 1008 (72 patches, 24 x 24 aligner rows, 602 tokens) does not fit 381, so
  // the square budget solve gives floor(sqrt(379.25) - 0.5) = 18 aligner rows: 756 x 756, 346 tokens.
  EXPECT_EQ(GridLine(PlanImageGrid(1000, 1000, kConfig)), "756 756 54 54 18 18 346");
  // 100 x 100 is under min_pixels: scaled by sqrt(14.7456) = 3.84 to 384, rounded up to 392 (28 patches),
  // 10 x 10 aligner rows, 10 * 11 + 2 = 112 tokens + the pair pad (5 * 11 odd) = 114.
  EXPECT_EQ(GridLine(PlanImageGrid(100, 100, kConfig)), "392 392 28 28 10 10 114");
  // 3000 x 200 is clamped to 1600 x 200 (8:1) before the budget solve.
  EXPECT_EQ(GridLine(PlanImageGrid(3000, 200, kConfig)), GridLine(PlanImageGrid(1600, 200, kConfig)));
  EXPECT_THROW(PlanImageGrid(0, 10, kConfig), std::runtime_error);
}

const std::vector<std::pair<int, int>> kSizes = {
    {1000, 1000}, {100, 100}, {37, 23},   {300, 200},  {1280, 720}, {720, 1280}, {3000, 200}, {200, 3000}, {1, 1},
    {5, 1000},    {14, 14},   {2000, 1999}, {640, 80}, {641, 80},   {639, 80},   {384, 384},  {756, 757},
    {1, 5000},    {90, 9000}, {999, 1},   {512, 300}, {3, 2},     {1500, 1100}};

TEST(VisionPreprocessTest, GridsMatchTheReference) {
  std::string args = "grid";
  for (auto [w, h] : kSizes) args += " " + std::to_string(w) + " " + std::to_string(h);
  // Plus a sweep of sizes, so every branch of the budget solve is reached.
  std::vector<std::pair<int, int>> sizes = kSizes;
  for (int w = 1; w <= 6000; w = w * 3 / 2 + 7)
    for (int h = 1; h <= 6000; h = h * 5 / 3 + 11) {
      sizes.emplace_back(w, h);
      args += " " + std::to_string(w) + " " + std::to_string(h);
    }
  std::istringstream ref(RunReference(args));
  for (auto [w, h] : sizes) {
    std::string line;
    ASSERT_TRUE(std::getline(ref, line));
    EXPECT_EQ(GridLine(PlanImageGrid(w, h, kConfig)), line) << w << " x " << h;
  }
}

TEST(VisionPreprocessTest, PatchesMatchTheReference) {
  std::string args = "patches";
  for (auto [w, h] : kSizes) args += " " + std::to_string(w) + " " + std::to_string(h);
  const std::string ref = RunReference(args);
  size_t at = 0;
  for (auto [w, h] : kSizes) {
    SCOPED_TRACE(std::to_string(w) + " x " + std::to_string(h));
    const size_t nl = ref.find('\n', at);
    ASSERT_NE(nl, std::string::npos);
    const std::string line = ref.substr(at, nl - at);
    PreprocessedImage ours = PreprocessImage(Pattern(w, h), kConfig);
    ASSERT_EQ(GridLine(ours.grid), line);
    const size_t n = static_cast<size_t>(ours.grid.vit_h) * ours.grid.vit_w * 3 * 14 * 14;
    ASSERT_EQ(ours.patches.size(), n);
    ASSERT_LE(nl + 1 + n * 4, ref.size());
    std::vector<float> theirs(n);
    std::memcpy(theirs.data(), ref.data() + nl + 1, n * 4);
    at = nl + 1 + n * 4;
    size_t mismatches = 0, first = 0;
    for (size_t i = 0; i < n; ++i)
      if (ours.patches[i] != theirs[i] && mismatches++ == 0) first = i;
    EXPECT_EQ(mismatches, 0u) << "first at " << first << ": ours " << ours.patches[first] << " reference "
                              << theirs[first];
  }
  EXPECT_EQ(at, ref.size());
}

TEST(VisionPreprocessTest, GreyPaddingAndNormalization) {
  // 37 x 23 is fitted into 490 x 308 as 490 x 305 (round(23 / 37 * 490)), 2 grey rows above and 1 below
  // (round(1.5) = 2); grey 127 normalizes to (127/255 - 0.5) / 0.5 = -0.0039216 -> bf16 -129 * 2^-15.
  PreprocessedImage p = PreprocessImage(Pattern(37, 23), kConfig);
  EXPECT_EQ(GridLine(p.grid), "490 308 22 35 8 12 106");
  const float grey = -0.003936767578125f;
  for (int c = 0; c < 3; ++c)
    for (int x = 0; x < 14; ++x) {
      EXPECT_EQ(p.patches[c * 196 + 0 * 14 + x], grey);   // patch (0, 0), rows 0 and 1
      EXPECT_EQ(p.patches[c * 196 + 1 * 14 + x], grey);
      EXPECT_NE(p.patches[c * 196 + 2 * 14 + x], grey);   // row 2 is the image
    }
  EXPECT_EQ(p.patches.back(), grey);  // the bottom row
  RgbImage white = Pattern(300, 300);
  std::fill(white.pixels.begin(), white.pixels.end(), 255);
  for (float v : PreprocessImage(white, kConfig).patches) ASSERT_EQ(v, 1.0f);
}

TEST(VisionPreprocessTest, BlockByHand) {
  // 1 x 1 aligner grid at a position 3 mod 4 (no alignment pad): START, then the padded 2 x 2 grid
  // [IMAGE NEWLINE / PAD PAD] read column by column over the row pair: IMAGE PAD NEWLINE PAD, then END.
  ImageBlock b = BuildImageBlock(1, 1, 3);
  EXPECT_EQ(b.types, (std::vector<int>{kImageStart, kImageToken, kImagePad, kImageNewline, kImagePad, kImageEnd}));
  EXPECT_EQ(b.perm, std::vector<int>{0});
  // 2 x 3 at position 0: 3 pads first; rows 0 and 1 interleaved: outputs 0 3 1 4 2 5.
  b = BuildImageBlock(2, 3, 0);
  EXPECT_EQ(b.types, (std::vector<int>{1, 1, 1, 0, 2, 2, 2, 2, 2, 2, 3, 3, 4}));
  EXPECT_EQ(b.perm, (std::vector<int>{0, 3, 1, 4, 2, 5}));
  // The block without its pad is grid_tokens long.
  for (auto [w, h] : kSizes) {
    ImageGrid g = PlanImageGrid(w, h, kConfig);
    EXPECT_EQ(static_cast<int>(BuildImageBlock(g.llm_h, g.llm_w, 3).types.size()), g.block_tokens);
    EXPECT_LE(g.block_tokens + 3, kConfig.max_n_token);
  }
}

TEST(VisionPreprocessTest, BlocksMatchTheReference) {
  std::string args = "block";
  std::vector<std::array<int, 3>> cases;
  for (int h = 1; h <= 9; ++h)
    for (int w = 1; w <= 9; ++w)
      for (int start : {0, 1, 2, 3, 17}) {
        cases.push_back({h, w, start});
        args += " " + std::to_string(h) + " " + std::to_string(w) + " " + std::to_string(start);
      }
  cases.push_back({60, 4, 1001});
  args += " 60 4 1001";
  std::istringstream ref(RunReference(args));
  for (auto [h, w, start] : cases) {
    std::string types_line, perm_line;
    ASSERT_TRUE(std::getline(ref, types_line));
    ASSERT_TRUE(std::getline(ref, perm_line));
    ImageBlock b = BuildImageBlock(h, w, start);
    std::string types, perm;
    for (int t : b.types) types += (types.empty() ? "" : " ") + std::to_string(t);
    for (int i : b.perm) perm += (perm.empty() ? "" : " ") + std::to_string(i);
    EXPECT_EQ(types, types_line) << h << " x " << w << " at " << start;
    EXPECT_EQ(perm, perm_line) << h << " x " << w << " at " << start;
  }
}

}  // namespace
}  // namespace dsmesh
