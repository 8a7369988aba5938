// Decoding of client-supplied images (PNG, JPEG, WebP) into 8-bit RGB with Debian's libpng, libjpeg-turbo
// and libwebp. Every input is hostile until decoded: the declared dimensions are checked against the limits
// before any pixel memory is allocated, truncated or corrupt data (bad CRC, premature end, bad markers) is an
// error, and errors come back as ImageError with a message meant for the client (an HTTP 400).
//
// The colour conversions follow what vLLM hands the DeepSeek-V4 vision processor (vllm/multimodal/media/
// image.py ImageMediaIO with image_mode "RGB", on top of Pillow's decoders), so the pixels match:
//   - RGBA (PNG colour type 6, WebP with alpha) is composited on white (255, 255, 255): out = (c*a + 255*(255-a))/255
//     rounded as Pillow's paste with a mask does;
//   - grey+alpha PNG: the alpha is dropped (Pillow's LA -> RGB); palette and tRNS transparency is ignored
//     (Pillow's P -> RGB); grey is replicated into R, G and B;
//   - 16-bit PNG samples keep their high byte (Pillow's "RGB;16B"); 16-bit grey does the same, where Pillow's
//     I -> RGB conversion would clip every value above 255 (a deliberate difference: docs/vision.md);
//   - JPEG is decoded with libjpeg's defaults (integer slow DCT, fancy upsampling), as Pillow does; CMYK/YCCK
//     JPEG goes through Pillow's CMYK -> RGB formula (Adobe files store inverted CMYK);
//   - no EXIF orientation is applied (vLLM applies none); only the first (default) image of a file is read,
//     and animated WebP is refused.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dsmesh {

// A decoded image: 8-bit RGB, rows top to bottom, 3 bytes per pixel, no padding.
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // width * height * 3
  const uint8_t* at(int x, int y) const { return pixels.data() + (static_cast<size_t>(y) * width + x) * 3; }
};

enum class ImageFormat { kPng, kJpeg, kWebp };
const char* ImageFormatName(ImageFormat format);  // "PNG", "JPEG", "WebP"
const char* ImageFormatMime(ImageFormat format);  // "image/png", "image/jpeg", "image/webp"

struct ImageLimits {
  uint64_t max_bytes = 20ull << 20;     // encoded size
  uint64_t max_pixels = 16ull << 20;    // width * height as declared by the file
  int max_side = 16384;                 // width and height each
};

// What is wrong with an image, worded for the client.
struct ImageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The format by its magic bytes, or nullopt when it is none of the three.
std::optional<ImageFormat> SniffImageFormat(std::string_view bytes);

// Decodes `bytes` (any of the three formats, found by their magic bytes). Throws ImageError for empty or
// unrecognised data, a file beyond `limits`, or corrupt/truncated data. `format` receives the format found.
RgbImage DecodeImage(std::string_view bytes, const ImageLimits& limits, ImageFormat* format = nullptr);

}  // namespace dsmesh
