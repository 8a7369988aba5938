// Mutation fuzzing of the decoders: every fixture is mutated thousands of times (bit flips, byte
// overwrites with boundary values, truncations, inserted/deleted runs, header edits with the PNG CRC
// fixed so the edit reaches the deeper checks, random chunk lengths) and decoded. Each outcome must be an
// ImageError or a valid image (dimensions within the limits, width * height * 3 bytes); a crash, a
// sanitizer report, another exception type or a decode slower than a few seconds fails the test.
// DSMESH_IMAGE_FUZZ_ITERATIONS overrides the iterations per fixture (default 400).
#include <chrono>
#include <cstdlib>
#include <random>

#include <gtest/gtest.h>

#include "common/image/image_decode.h"
#include "common/image/image_test_util.h"

namespace dsmesh {
namespace {

using image_test::FixtureNames;
using image_test::kTestdata;
using image_test::ReadFile;

int Iterations() {
  const char* v = std::getenv("DSMESH_IMAGE_FUZZ_ITERATIONS");
  return v && *v ? std::atoi(v) : 400;
}

std::string Mutate(std::string s, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  static const uint8_t kBoundary[] = {0x00, 0x01, 0x7f, 0x80, 0xfe, 0xff};
  const int rounds = 1 + static_cast<int>(rng() % 4);
  for (int r = 0; r < rounds && !s.empty(); ++r) {
    switch (rng() % 9) {
      case 0:  // flip 1-8 bits anywhere
        for (int k = 1 + static_cast<int>(rng() % 8); k > 0; --k) s[pick(s.size())] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:  // flip a bit in the first 64 bytes (headers)
        s[pick(std::min<size_t>(64, s.size()))] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 2:  // a boundary value somewhere in the first 64 bytes
        s[pick(std::min<size_t>(64, s.size()))] = static_cast<char>(kBoundary[rng() % sizeof(kBoundary)]);
        break;
      case 3:  // truncate
        s.resize(pick(s.size()));
        break;
      case 4:  // delete a run
        {
          size_t at = pick(s.size());
          s.erase(at, 1 + pick(std::min<size_t>(64, s.size() - at)));
        }
        break;
      case 5:  // insert random bytes
        {
          std::string run(1 + pick(32), '\0');
          for (char& c : run) c = static_cast<char>(rng());
          s.insert(pick(s.size() + 1), run);
        }
        break;
      case 6:  // 4 random bytes at a random offset (lengths, sizes, offsets)
        for (size_t at = pick(s.size()), k = 0; k < 4 && at + k < s.size(); ++k) s[at + k] = static_cast<char>(rng());
        break;
      case 7:  // duplicate a slice (repeated chunks/markers)
        {
          size_t at = pick(s.size());
          std::string slice = s.substr(at, 1 + pick(256));
          s.insert(pick(s.size() + 1), slice);
        }
        break;
      case 8:  // PNG: new IHDR dimensions with a valid CRC; others: overwrite a header byte
        if (s.size() > 33 && SniffImageFormat(s) == ImageFormat::kPng) {
          static const uint32_t kSizes[] = {0, 1, 2, 37, 255, 4096, 16384, 16385, 65535, 0x7fffffffu, 0xffffffffu};
          const uint32_t w = rng() % 2 ? kSizes[rng() % 11] : static_cast<uint32_t>(rng() % 5000);
          const uint32_t h = rng() % 2 ? kSizes[rng() % 11] : static_cast<uint32_t>(rng() % 5000);
          s = image_test::PngWithDimensions(s, w, h);
          if (rng() % 2) {  // and perhaps a new bit depth / colour type / interlace byte, CRC fixed again
            s[24 + rng() % 5] = static_cast<char>(rng() % 2 ? rng() % 17 : rng());
            image_test::PutBigEndian32(s, 29, image_test::Crc32(reinterpret_cast<const uint8_t*>(s.data()) + 12, 17));
          }
        } else {
          s[pick(std::min<size_t>(40, s.size()))] = static_cast<char>(rng());
        }
        break;
    }
  }
  return s;
}

TEST(ImageFuzzTest, MutatedImagesGiveAnErrorOrAValidImage) {
  ImageLimits limits;
  limits.max_pixels = 4u << 20;  // bigger declared images are refused early; smaller ones decode
  limits.max_side = 8192;
  const int iterations = Iterations();
  std::mt19937_64 rng(20261202);
  size_t errors = 0, images = 0;
  double slowest_s = 0;
  for (const auto& name : FixtureNames()) {
    const std::string seed = ReadFile(kTestdata + name);
    for (int i = 0; i < iterations; ++i) {
      const std::string bytes = Mutate(seed, rng);
      const auto start = std::chrono::steady_clock::now();
      try {
        RgbImage image = DecodeImage(bytes, limits);
        ASSERT_GT(image.width, 0);
        ASSERT_GT(image.height, 0);
        ASSERT_LE(image.width, limits.max_side);
        ASSERT_LE(image.height, limits.max_side);
        ASSERT_LE(static_cast<uint64_t>(image.width) * image.height, limits.max_pixels);
        ASSERT_EQ(image.pixels.size(), static_cast<size_t>(image.width) * image.height * 3);
        ++images;
      } catch (const ImageError& e) {
        ASSERT_NE(std::string(e.what()), "");
        ++errors;
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      slowest_s = std::max(slowest_s, s);
      ASSERT_LT(s, 5.0) << name << " mutation " << i << " took " << s << " s";
    }
  }
  std::printf("%zu mutated images: %zu errors, %zu decoded; slowest decode %.3f s\n", errors + images, errors, images,
              slowest_s);
  // Both outcomes occur: the mutations reach past the first check, and most of them are caught.
  EXPECT_GT(errors, images);
  EXPECT_GT(images, 0u);
}

}  // namespace
}  // namespace dsmesh
