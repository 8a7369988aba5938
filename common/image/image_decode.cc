#include "common/image/image_decode.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>

#include <png.h>
// jpeglib.h needs size_t and FILE declared before it.
#include <jpeglib.h>
#include <jerror.h>
#include <webp/decode.h>

namespace dsmesh {
namespace {

// Round(x / 255) for x in [0, 255 * 255 * 2], the way Pillow divides in its paste and convert code.
inline uint8_t Div255(uint32_t x) {
  x += 128;
  return static_cast<uint8_t>(((x >> 8) + x) >> 8);
}

void CheckDimensions(const char* format, uint64_t width, uint64_t height, const ImageLimits& limits) {
  if (width == 0 || height == 0)
    throw ImageError(std::string(format) + " image has zero size (" + std::to_string(width) + " x " +
                     std::to_string(height) + ")");
  if (width > static_cast<uint64_t>(limits.max_side) || height > static_cast<uint64_t>(limits.max_side))
    throw ImageError(std::string(format) + " image is " + std::to_string(width) + " x " + std::to_string(height) +
                     " pixels; each side may be at most " + std::to_string(limits.max_side));
  if (width * height > limits.max_pixels)
    throw ImageError(std::string(format) + " image is " + std::to_string(width) + " x " + std::to_string(height) +
                     " = " + std::to_string(width * height) + " pixels; at most " +
                     std::to_string(limits.max_pixels) + " are accepted");
}

// Interleaved 8-bit samples with `channels` per pixel (1 grey, 3 RGB, 4 RGBA) -> RGB. `composite_alpha`:
// a 4th channel is alpha to composite on white; otherwise it is dropped.
void ToRgb(const uint8_t* src, int channels, bool composite_alpha, RgbImage* out) {
  const size_t n = static_cast<size_t>(out->width) * out->height;
  out->pixels.resize(n * 3);
  uint8_t* dst = out->pixels.data();
  for (size_t i = 0; i < n; ++i, dst += 3, src += channels) {
    if (channels == 1) {
      dst[0] = dst[1] = dst[2] = src[0];
    } else if (channels == 4 && composite_alpha) {
      const uint32_t a = src[3];
      for (int c = 0; c < 3; ++c) dst[c] = Div255(src[c] * a + 255u * (255u - a));
    } else {
      dst[0] = src[0];
      dst[1] = src[1];
      dst[2] = src[2];
    }
  }
}

// ---- PNG (libpng) ----------------------------------------------------------------------------------
// libpng reports errors through a callback that must not return; it longjmps back to DecodePngRows. Only
// plain C data lives in that function's frame, so nothing with a destructor is skipped.

struct PngSource {
  const uint8_t* data;
  size_t size;
  size_t pos;
  jmp_buf jump;
  char message[200];
};

void PngOnError(png_structp png, png_const_charp message) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->message, sizeof(src->message), "%s", message ? message : "unknown error");
  longjmp(src->jump, 1);
}

void PngOnWarning(png_structp, png_const_charp) {}  // ancillary trouble; errors are what matter

void PngRead(png_structp png, png_bytep out, size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (n > src->size - src->pos) png_error(png, "truncated PNG data");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

struct PngRows {
  uint32_t width = 0, height = 0;
  int channels = 0;               // after the transforms: 3 or 4
  bool alpha_is_alpha = false;    // the 4th channel is a real alpha channel (colour type RGBA)
  std::vector<uint8_t> samples;   // height rows of width * channels bytes
  std::vector<png_bytep> rows;
};

// 0: decoded; 1: libpng error (message in src); 2: beyond the limits (message in src).
int DecodePngRows(PngSource* src, const ImageLimits* limits, PngRows* out) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, src, PngOnError, PngOnWarning);
  if (!png) {
    std::snprintf(src->message, sizeof(src->message), "out of memory");
    return 1;
  }
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    std::snprintf(src->message, sizeof(src->message), "out of memory");
    return 1;
  }
  if (setjmp(src->jump)) {
    png_destroy_read_struct(&png, &info, nullptr);
    return 1;
  }
  png_set_read_fn(png, src, PngRead);
  // Every CRC mismatch is an error (Pillow refuses them too); benign errors ("too much image data") as well.
  png_set_crc_action(png, PNG_CRC_ERROR_QUIT, PNG_CRC_ERROR_QUIT);
  png_set_benign_errors(png, 0);
  // Bounded memory for ancillary chunks: compressed text/ICC profiles cannot inflate past 4 MiB, and at most
  // 256 ancillary chunks are kept.
  png_set_chunk_malloc_max(png, 4u << 20);
  png_set_chunk_cache_max(png, 256);
  png_set_keep_unknown_chunks(png, PNG_HANDLE_CHUNK_NEVER, nullptr, 0);
  png_read_info(png, info);

  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0, interlace = 0;
  png_get_IHDR(png, info, &width, &height, &bit_depth, &color_type, &interlace, nullptr, nullptr);
  try {
    CheckDimensions("PNG", width, height, *limits);
  } catch (const ImageError& e) {
    std::snprintf(src->message, sizeof(src->message), "%s", e.what());
    png_destroy_read_struct(&png, &info, nullptr);
    return 2;
  }
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (bit_depth == 16) png_set_strip_16(png);
  if (color_type == PNG_COLOR_TYPE_GRAY || color_type == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const int channels = png_get_channels(png, info);
  if (png_get_bit_depth(png, info) != 8 || (channels != 3 && channels != 4) ||
      png_get_rowbytes(png, info) != static_cast<size_t>(width) * channels)
    png_error(png, "unsupported PNG sample layout");

  out->width = width;
  out->height = height;
  out->channels = channels;
  out->alpha_is_alpha = color_type == PNG_COLOR_TYPE_RGB_ALPHA;
  out->samples.resize(static_cast<size_t>(width) * height * channels);
  out->rows.resize(height);
  for (png_uint_32 y = 0; y < height; ++y) out->rows[y] = out->samples.data() + static_cast<size_t>(y) * width * channels;
  png_read_image(png, out->rows.data());
  png_read_end(png, nullptr);  // checks the chunks after the image data through IEND (and their CRCs)
  png_destroy_read_struct(&png, &info, nullptr);
  return 0;
}

RgbImage DecodePng(std::string_view bytes, const ImageLimits& limits) {
  PngSource src{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 0, {}, {0}};
  PngRows rows;
  int rc = DecodePngRows(&src, &limits, &rows);
  if (rc == 2) throw ImageError(src.message);
  if (rc != 0) throw ImageError(std::string("invalid PNG data: ") + src.message);
  RgbImage out;
  out.width = static_cast<int>(rows.width);
  out.height = static_cast<int>(rows.height);
  ToRgb(rows.samples.data(), rows.channels, rows.alpha_is_alpha, &out);
  return out;
}

// ---- JPEG (libjpeg-turbo) --------------------------------------------------------------------------

constexpr int kMaxJpegScans = 500;  // a progressive file with more scans is refused (decode-time bomb)

struct JpegErrors {
  jpeg_error_mgr mgr;  // first member: libjpeg's err pointer is cast back to JpegErrors
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX + 64];
};

void JpegOnError(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrors*>(cinfo->err);
  char text[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, text);
  std::snprintf(err->message, sizeof(err->message), "%s", text);
  longjmp(err->jump, 1);
}

// Warnings: data that ends early is an error here (a truncated file, or a scan whose entropy-coded data
// stops before the image does, which libjpeg would fill with grey); the other warnings (e.g. extraneous
// bytes before a marker) let libjpeg go on, as Pillow does.
void JpegOnMessage(j_common_ptr cinfo, int level) {
  if (level != -1) return;
  const int code = cinfo->err->msg_code;
  if (code != JWRN_JPEG_EOF && code != JWRN_HIT_MARKER) return;
  auto* err = reinterpret_cast<JpegErrors*>(cinfo->err);
  std::snprintf(err->message, sizeof(err->message), "%s",
                code == JWRN_JPEG_EOF ? "truncated JPEG data" : "the compressed data ends before the image does");
  longjmp(err->jump, 1);
}

struct JpegProgress {
  jpeg_progress_mgr mgr;  // first member
  JpegErrors* errors;
};

void JpegOnProgress(j_common_ptr cinfo) {
  auto* progress = reinterpret_cast<JpegProgress*>(cinfo->progress);
  auto* dinfo = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (dinfo->input_scan_number > kMaxJpegScans) {
    std::snprintf(progress->errors->message, sizeof(progress->errors->message),
                  "JPEG file has more than %d scans", kMaxJpegScans);
    longjmp(progress->errors->jump, 1);
  }
}

struct JpegRows {
  int width = 0, height = 0;
  int components = 0;  // 1 grey, 3 RGB, 4 CMYK
  std::vector<uint8_t> samples;
};

// 0: decoded; 1: libjpeg error (message in errors); 2: beyond the limits (message in errors).
int DecodeJpegRows(const uint8_t* data, size_t size, const ImageLimits* limits, JpegErrors* errors, JpegRows* out) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&errors->mgr);
  errors->mgr.error_exit = JpegOnError;
  errors->mgr.emit_message = JpegOnMessage;
  JpegProgress progress;
  progress.mgr.progress_monitor = JpegOnProgress;
  progress.errors = errors;
  jpeg_create_decompress(&cinfo);
  if (setjmp(errors->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return 1;
  }
  cinfo.progress = &progress.mgr;
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  if (jpeg_read_header(&cinfo, TRUE) != JPEG_HEADER_OK) {
    std::snprintf(errors->message, sizeof(errors->message), "JPEG data holds no image");
    jpeg_destroy_decompress(&cinfo);
    return 1;
  }
  try {
    CheckDimensions("JPEG", cinfo.image_width, cinfo.image_height, *limits);
  } catch (const ImageError& e) {
    std::snprintf(errors->message, sizeof(errors->message), "%s", e.what());
    jpeg_destroy_decompress(&cinfo);
    return 2;
  }
  // libjpeg's working memory (coefficient buffers of a progressive file) stays near the pixel limit.
  cinfo.mem->max_memory_to_use = static_cast<long>(limits->max_pixels * 8 + (64l << 20));
  switch (cinfo.jpeg_color_space) {
    case JCS_GRAYSCALE: cinfo.out_color_space = JCS_GRAYSCALE; break;
    case JCS_CMYK:
    case JCS_YCCK: cinfo.out_color_space = JCS_CMYK; break;
    default: cinfo.out_color_space = JCS_RGB; break;
  }
  jpeg_start_decompress(&cinfo);
  const int comps = cinfo.output_components;
  if ((comps != 1 && comps != 3 && comps != 4) || static_cast<int>(cinfo.output_width) != static_cast<int>(cinfo.image_width) ||
      cinfo.output_height != cinfo.image_height) {
    std::snprintf(errors->message, sizeof(errors->message), "unsupported JPEG layout (%d components)", comps);
    jpeg_destroy_decompress(&cinfo);
    return 1;
  }
  out->width = static_cast<int>(cinfo.output_width);
  out->height = static_cast<int>(cinfo.output_height);
  out->components = comps;
  const size_t stride = static_cast<size_t>(out->width) * comps;
  out->samples.resize(stride * out->height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out->samples.data() + stride * cinfo.output_scanline;
    if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
      std::snprintf(errors->message, sizeof(errors->message), "truncated JPEG data");
      jpeg_destroy_decompress(&cinfo);
      return 1;
    }
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return 0;
}

RgbImage DecodeJpeg(std::string_view bytes, const ImageLimits& limits) {
  JpegErrors errors;
  errors.message[0] = 0;
  JpegRows rows;
  int rc = DecodeJpegRows(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &limits, &errors, &rows);
  if (rc == 2) throw ImageError(errors.message);
  if (rc != 0) throw ImageError(std::string("invalid JPEG data: ") + errors.message);
  RgbImage out;
  out.width = rows.width;
  out.height = rows.height;
  if (rows.components == 4) {
    // Pillow reads 4-component JPEG as Adobe-inverted CMYK ("CMYK;I") and converts CMYK -> RGB as
    // R = (255 - K) - C * (255 - K) / 255 (rounded), likewise G from M and B from Y.
    const size_t n = static_cast<size_t>(out.width) * out.height;
    out.pixels.resize(n * 3);
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* s = rows.samples.data() + i * 4;
      const uint32_t nk = s[3];  // 255 - (255 - stored K)
      for (int c = 0; c < 3; ++c) out.pixels[i * 3 + c] = static_cast<uint8_t>(nk - Div255((255u - s[c]) * nk));
    }
  } else {
    ToRgb(rows.samples.data(), rows.components, false, &out);
  }
  return out;
}

// ---- WebP (libwebp) --------------------------------------------------------------------------------

const char* WebpStatusText(VP8StatusCode status) {
  switch (status) {
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "unsupported feature";
    case VP8_STATUS_SUSPENDED: return "suspended";
    case VP8_STATUS_USER_ABORT: return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "truncated data";
    default: return "error";
  }
}

RgbImage DecodeWebp(std::string_view bytes, const ImageLimits& limits) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  WebPBitstreamFeatures features;
  VP8StatusCode status = WebPGetFeatures(data, bytes.size(), &features);
  if (status != VP8_STATUS_OK) throw ImageError(std::string("invalid WebP data: ") + WebpStatusText(status));
  if (features.has_animation) throw ImageError("animated WebP is not supported (send a still image)");
  CheckDimensions("WebP", static_cast<uint64_t>(features.width), static_cast<uint64_t>(features.height), limits);
  RgbImage out;
  out.width = features.width;
  out.height = features.height;
  const int channels = features.has_alpha ? 4 : 3;
  std::vector<uint8_t> samples(static_cast<size_t>(out.width) * out.height * channels);
  const int stride = out.width * channels;
  const uint8_t* ok = features.has_alpha
                          ? WebPDecodeRGBAInto(data, bytes.size(), samples.data(), samples.size(), stride)
                          : WebPDecodeRGBInto(data, bytes.size(), samples.data(), samples.size(), stride);
  if (!ok) throw ImageError("invalid WebP data: corrupt or truncated");
  ToRgb(samples.data(), channels, /*composite_alpha=*/true, &out);
  return out;
}

}  // namespace

const char* ImageFormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kPng: return "PNG";
    case ImageFormat::kJpeg: return "JPEG";
    case ImageFormat::kWebp: return "WebP";
  }
  return "?";
}

const char* ImageFormatMime(ImageFormat format) {
  switch (format) {
    case ImageFormat::kPng: return "image/png";
    case ImageFormat::kJpeg: return "image/jpeg";
    case ImageFormat::kWebp: return "image/webp";
  }
  return "?";
}

std::optional<ImageFormat> SniffImageFormat(std::string_view b) {
  if (b.size() >= 8 && b.substr(0, 8) == std::string_view("\x89PNG\r\n\x1a\n", 8)) return ImageFormat::kPng;
  if (b.size() >= 3 && b.substr(0, 3) == std::string_view("\xff\xd8\xff", 3)) return ImageFormat::kJpeg;
  if (b.size() >= 12 && b.substr(0, 4) == "RIFF" && b.substr(8, 4) == "WEBP") return ImageFormat::kWebp;
  return std::nullopt;
}

RgbImage DecodeImage(std::string_view bytes, const ImageLimits& limits, ImageFormat* format) {
  if (bytes.empty()) throw ImageError("the image data is empty");
  if (bytes.size() > limits.max_bytes)
    throw ImageError("the image is " + std::to_string(bytes.size()) + " bytes; at most " +
                     std::to_string(limits.max_bytes) + " are accepted");
  auto found = SniffImageFormat(bytes);
  if (!found) throw ImageError("the data is not a PNG, JPEG or WebP image");
  if (format) *format = *found;
  switch (*found) {
    case ImageFormat::kPng: return DecodePng(bytes, limits);
    case ImageFormat::kJpeg: return DecodeJpeg(bytes, limits);
    case ImageFormat::kWebp: return DecodeWebp(bytes, limits);
  }
  throw ImageError("unreachable");
}

}  // namespace dsmesh
