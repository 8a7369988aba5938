#include "common/image/image_decode.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "common/image/image_test_util.h"
#include "common/image/image_url.h"

namespace dsmesh {
namespace {

using image_test::FixtureNames;
using image_test::kTestdata;
using image_test::ReadFile;

std::string ErrorOf(std::string_view bytes, const ImageLimits& limits = {}) {
  try {
    DecodeImage(bytes, limits);
  } catch (const ImageError& e) {
    return e.what();
  }
  return "";
}

std::string UrlErrorOf(const std::string& url, const ImageUrlOptions& options = {}) {
  try {
    DecodeImageUrl(url, options);
  } catch (const ImageError& e) {
    return e.what();
  }
  return "";
}

std::string Base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    for (int k = 3; k >= 0; --k) out += kAlphabet[(v >> (6 * k)) & 63];
  }
  if (i + 1 == bytes.size()) {
    uint32_t v = uint8_t(bytes[i]) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += "=";
  }
  return out;
}

// Every fixture decodes to exactly the pixels Pillow gives after vLLM's RGB conversion (same libjpeg-turbo
// and libwebp underneath, so even the lossy formats agree bit for bit).
TEST(ImageDecodeTest, PixelsMatchPillowForEveryFixture) {
  const auto names = FixtureNames();
  const auto pillow = image_test::PillowDecode(names);
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    ImageFormat format;
    RgbImage ours = DecodeImage(ReadFile(kTestdata + name), ImageLimits{}, &format);
    const RgbImage& ref = pillow.at(name);
    ASSERT_EQ(ours.width, ref.width);
    ASSERT_EQ(ours.height, ref.height);
    ASSERT_EQ(ours.pixels.size(), ref.pixels.size());
    size_t mismatches = 0, first = 0;
    for (size_t i = 0; i < ours.pixels.size(); ++i)
      if (ours.pixels[i] != ref.pixels[i] && mismatches++ == 0) first = i;
    EXPECT_EQ(mismatches, 0u) << "first at byte " << first << ": ours " << int(ours.pixels[first]) << " Pillow "
                              << int(ref.pixels[first]);
  }
}

TEST(ImageDecodeTest, SniffsFormats) {
  EXPECT_EQ(SniffImageFormat(ReadFile(std::string(kTestdata) + "rgb.png")), ImageFormat::kPng);
  EXPECT_EQ(SniffImageFormat(ReadFile(std::string(kTestdata) + "rgb.jpg")), ImageFormat::kJpeg);
  EXPECT_EQ(SniffImageFormat(ReadFile(std::string(kTestdata) + "lossy.webp")), ImageFormat::kWebp);
  EXPECT_EQ(SniffImageFormat("GIF89a......"), std::nullopt);
  EXPECT_EQ(SniffImageFormat(""), std::nullopt);
}

TEST(ImageDecodeTest, EmptyAndUnknownDataAreErrors) {
  EXPECT_EQ(ErrorOf(""), "the image data is empty");
  EXPECT_EQ(ErrorOf("GIF89a\x01\x00\x01\x00"), "the data is not a PNG, JPEG or WebP image");
  EXPECT_EQ(ErrorOf(std::string("\x89PNG\r\n\x1a\n", 8)).rfind("invalid PNG data", 0), 0u);
  EXPECT_EQ(ErrorOf("\xff\xd8\xff").rfind("invalid JPEG data", 0), 0u);
  EXPECT_EQ(ErrorOf(std::string("RIFF\x04\x00\x00\x00WEBP", 12)).rfind("invalid WebP data", 0), 0u);
}

TEST(ImageDecodeTest, LimitsAreCheckedOnTheDeclaredSize) {
  const std::string png = ReadFile(std::string(kTestdata) + "rgb.png");  // 37 x 23
  ImageLimits limits;
  limits.max_side = 30;
  EXPECT_EQ(ErrorOf(png, limits), "PNG image is 37 x 23 pixels; each side may be at most 30");
  limits = {};
  limits.max_pixels = 800;
  EXPECT_EQ(ErrorOf(png, limits), "PNG image is 37 x 23 = 851 pixels; at most 800 are accepted");
  limits = {};
  limits.max_bytes = 100;
  EXPECT_EQ(ErrorOf(png, limits), "the image is " + std::to_string(png.size()) + " bytes; at most 100 are accepted");
  limits = {};
  limits.max_pixels = 851;
  limits.max_side = 37;
  EXPECT_EQ(ErrorOf(png, limits), "");  // exactly at the limits

  // The same limits hold for JPEG and WebP, read from their headers.
  limits = {};
  limits.max_side = 36;
  EXPECT_EQ(ErrorOf(ReadFile(std::string(kTestdata) + "progressive.jpg"), limits),
            "JPEG image is 37 x 23 pixels; each side may be at most 36");
  EXPECT_EQ(ErrorOf(ReadFile(std::string(kTestdata) + "rgba_lossy.webp"), limits),
            "WebP image is 37 x 23 pixels; each side may be at most 36");
}

// Decompression bombs: a small file whose header declares a huge image is refused before any pixel memory
// is allocated; one within the limits but without the data for it ends in a clean error.
TEST(ImageDecodeTest, HugeDeclaredDimensionsAreRefused) {
  const std::string png = ReadFile(std::string(kTestdata) + "rgb.png");
  EXPECT_EQ(ErrorOf(image_test::PngWithDimensions(png, 100000, 100000)),
            "PNG image is 100000 x 100000 pixels; each side may be at most 16384");
  EXPECT_EQ(ErrorOf(image_test::PngWithDimensions(png, 16384, 16384)),
            "PNG image is 16384 x 16384 = 268435456 pixels; at most 16777216 are accepted");
  EXPECT_EQ(ErrorOf(image_test::PngWithDimensions(png, 0x7fffffff, 1)).rfind("invalid PNG data", 0), 0u);
  EXPECT_EQ(ErrorOf(image_test::PngWithDimensions(png, 0, 23)).rfind("invalid PNG data", 0), 0u);
  EXPECT_EQ(ErrorOf(image_test::PngWithDimensions(png, 4000, 4000)).rfind("invalid PNG data", 0), 0u);

  // JPEG: the SOF segment's height and width (big-endian at +5 and +7 from the marker).
  std::string jpg = ReadFile(std::string(kTestdata) + "rgb.jpg");
  size_t sof = jpg.find("\xff\xc0");
  ASSERT_NE(sof, std::string::npos);
  jpg[sof + 5] = jpg[sof + 7] = '\x4e';  // 20000 x 20000
  jpg[sof + 6] = jpg[sof + 8] = '\x20';
  EXPECT_EQ(ErrorOf(jpg), "JPEG image is 20000 x 20000 pixels; each side may be at most 16384");
  jpg[sof + 5] = jpg[sof + 7] = '\x10';  // 4096 x 4096: within the limits, but the data is for 37 x 23
  jpg[sof + 6] = jpg[sof + 8] = '\x00';
  EXPECT_EQ(ErrorOf(jpg), "invalid JPEG data: the compressed data ends before the image does");
  jpg[sof + 5] = jpg[sof + 7] = jpg[sof + 6] = jpg[sof + 8] = '\xff';  // beyond libjpeg's own maximum
  EXPECT_EQ(ErrorOf(jpg).rfind("invalid JPEG data", 0), 0u);
  jpg[sof + 5] = jpg[sof + 6] = 0;  // height 0
  EXPECT_NE(ErrorOf(jpg), "");
}

// A file cut anywhere before its end is an error, never a partial image.
TEST(ImageDecodeTest, EveryTruncationIsAnError) {
  for (const char* name : {"rgb.png", "rgb_interlaced.png", "rgb.jpg", "progressive.jpg", "lossy.webp",
                           "rgba_lossless.webp"}) {
    SCOPED_TRACE(name);
    const std::string bytes = ReadFile(std::string(kTestdata) + name);
    ASSERT_EQ(ErrorOf(bytes), "");
    for (size_t n = 0; n < bytes.size(); ++n) ASSERT_NE(ErrorOf(bytes.substr(0, n)), "") << "cut at " << n;
  }
}

TEST(ImageDecodeTest, BadPngCrcIsAnError) {
  const std::string good = ReadFile(std::string(kTestdata) + "rgb.png");
  std::string png = good;
  png[29] ^= 0x01;  // IHDR's CRC
  EXPECT_EQ(ErrorOf(png), "invalid PNG data: IHDR: CRC error");
  // The IDAT chunk's CRC (its data is intact): found when the chunk ends.
  png = good;
  const size_t idat = png.find("IDAT");
  ASSERT_NE(idat, std::string::npos);
  const uint32_t length = (uint8_t(png[idat - 4]) << 24) | (uint8_t(png[idat - 3]) << 16) |
                          (uint8_t(png[idat - 2]) << 8) | uint8_t(png[idat - 1]);
  png[idat + 4 + length] ^= 0x01;
  EXPECT_NE(ErrorOf(png).find("CRC error"), std::string::npos) << ErrorOf(png);
  // A flipped bit inside the compressed data: an error either way (inflate or CRC).
  png = good;
  png[idat + 10] ^= 0x01;
  EXPECT_EQ(ErrorOf(png).rfind("invalid PNG data", 0), 0u);
}

TEST(ImageDecodeTest, AnimatedWebpIsRefused) {
  // A minimal VP8X header with the animation flag: refused by its features, before any frame is read.
  std::string webp("RIFF\x16\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00", 30);
  EXPECT_EQ(ErrorOf(webp), "animated WebP is not supported (send a still image)");
}

TEST(ImageUrlTest, StrictBase64) {
  EXPECT_EQ(DecodeBase64Strict(""), "");
  EXPECT_EQ(DecodeBase64Strict("aGk="), "hi");
  EXPECT_EQ(DecodeBase64Strict("aGV5"), "hey");
  EXPECT_EQ(DecodeBase64Strict("aA=="), "h");
  for (const char* bad : {"aGk", "aG k", "aGk=\n", "a===", "aA=A", "====", "aGk*", "aA==aGk="}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(DecodeBase64Strict(bad), ImageError);
  }
}

TEST(ImageUrlTest, DataUrls) {
  const std::string png = ReadFile(std::string(kTestdata) + "rgb.png");
  const std::string jpg = ReadFile(std::string(kTestdata) + "rgb.jpg");
  const std::string webp = ReadFile(std::string(kTestdata) + "lossy.webp");
  EXPECT_EQ(DecodeImageUrl("data:image/png;base64," + Base64(png), {}).width, 37);
  EXPECT_EQ(DecodeImageUrl("DATA:Image/JPEG;base64," + Base64(jpg), {}).height, 23);
  EXPECT_EQ(DecodeImageUrl("data:image/jpg;base64," + Base64(jpg), {}).height, 23);
  EXPECT_EQ(DecodeImageUrl("data:image/webp;base64," + Base64(webp), {}).width, 37);

  EXPECT_EQ(UrlErrorOf("data:image/png;base64," + Base64(jpg)),
            "the data: URL declares image/png but the data is JPEG");
  EXPECT_EQ(UrlErrorOf("data:image/webp;base64," + Base64(png)),
            "the data: URL declares image/webp but the data is PNG");
  EXPECT_EQ(UrlErrorOf("data:image/gif;base64,R0lGODlh"),
            "media type 'image/gif' is not supported; send image/png, image/jpeg or image/webp");
  EXPECT_EQ(UrlErrorOf("data:;base64," + Base64(png)).rfind("the data: URL declares no media type", 0), 0u);
  EXPECT_EQ(UrlErrorOf("data:image/png," + png.substr(0, 8)), "the data: URL must be base64 (data:image/png;base64,...)");
  EXPECT_EQ(UrlErrorOf("data:image/png;base64"), "the data: URL has no ',' before its data");
  EXPECT_EQ(UrlErrorOf("data:image/png;base64,"), "the image data is empty");
  EXPECT_EQ(UrlErrorOf("data:image/png;base64,AAAA"), "the data is not a PNG, JPEG or WebP image");
  EXPECT_EQ(UrlErrorOf("data:image/png;base64,aGk").rfind("invalid base64", 0), 0u);
  ImageUrlOptions small;
  small.limits.max_bytes = 1000;
  EXPECT_EQ(UrlErrorOf("data:image/png;base64," + Base64(png), small).rfind("the image is about", 0), 0u);
}

TEST(ImageUrlTest, NetworkUrlsAndOtherSchemesAreRefused) {
  EXPECT_EQ(UrlErrorOf("https://example.com/cat.png").rfind("image URLs over http(s) are not fetched", 0), 0u);
  EXPECT_EQ(UrlErrorOf("HTTP://example.com/cat.png").rfind("image URLs over http(s) are not fetched", 0), 0u);
  EXPECT_EQ(UrlErrorOf("ftp://example.com/cat.png").rfind("image URL scheme 'ftp' is not supported", 0), 0u);
  EXPECT_EQ(UrlErrorOf("cat.png"), "the image URL must be a data: URL (data:image/png;base64,...)");
  EXPECT_EQ(UrlErrorOf(""), "the image URL is empty");
}

TEST(ImageUrlTest, FileUrlsOnlyInsideTheAllowedPath) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(testing::TempDir()) / "image_url_test";
  fs::remove_all(dir);
  fs::create_directories(dir / "allowed");
  fs::copy_file(std::string(kTestdata) + "rgb.png", dir / "allowed" / "a b.png");
  fs::copy_file(std::string(kTestdata) + "rgb.png", dir / "outside.png");
  fs::create_symlink(dir / "outside.png", dir / "allowed" / "link.png");
  ASSERT_EQ(mkfifo((dir / "allowed" / "fifo.png").c_str(), 0600), 0);
  const std::string allowed = (dir / "allowed").string();
  const std::string inside = "file://" + allowed + "/a%20b.png";

  EXPECT_EQ(UrlErrorOf(inside).rfind("local files are not served: start the gateway with --allowed-local-media-path", 0),
            0u);
  ImageUrlOptions options;
  options.allowed_local_media_path = allowed;
  EXPECT_EQ(DecodeImageUrl(inside, options).width, 37);
  EXPECT_EQ(DecodeImageUrl("file://localhost" + allowed + "/a%20b.png", options).width, 37);
  EXPECT_EQ(UrlErrorOf("file://" + (dir / "outside.png").string(), options),
            "the file is outside the allowed local media path");
  EXPECT_EQ(UrlErrorOf("file://" + allowed + "/../outside.png", options),
            "the file is outside the allowed local media path");
  EXPECT_EQ(UrlErrorOf("file://" + allowed + "/link.png", options), "the file is outside the allowed local media path");
  EXPECT_EQ(UrlErrorOf("file://" + allowed + "/fifo.png", options), "the path is not a regular file");
  EXPECT_EQ(UrlErrorOf("file://" + allowed + "/missing.png", options), "no such file under the allowed local media path");
  EXPECT_EQ(UrlErrorOf("file://" + allowed, options), "the path is not a regular file");  // the directory itself
  EXPECT_EQ(UrlErrorOf("file://host/x.png", options), "the file URL must be file:///absolute/path");
  options.limits.max_bytes = 100;
  EXPECT_EQ(UrlErrorOf(inside, options).rfind("the image is ", 0), 0u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dsmesh
