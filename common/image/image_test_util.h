// Helpers for the image tests: fixture files, Pillow's decoding of them (python3-pil at test time), and a
// CRC-32 to rebuild PNG chunks after an edit.
#pragma once

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/image/image_decode.h"

namespace dsmesh::image_test {

inline const char* kTestdata = "common/image/testdata/";

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The fixtures every image test uses (written by testdata/make_images.py).
inline std::vector<std::string> FixtureNames() {
  return {"rgb.png",        "rgba.png",         "gray.png",          "gray_alpha.png",    "palette_trns.png",
          "rgb16.png",      "rgb_interlaced.png", "gray2.png",       "rgb.jpg",           "progressive.jpg",
          "rgb444.jpg",     "gray.jpg",         "cmyk.jpg",          "lossy.webp",        "lossless.webp",
          "rgba_lossless.webp", "rgba_lossy.webp", "wide.png"};
}

inline std::string Python3() { return "/usr/bin/python3"; }

// Pillow's RGB for each named fixture, converted as vLLM converts (testdata/pil_rgb.py).
inline std::map<std::string, RgbImage> PillowDecode(const std::vector<std::string>& names) {
  std::string command = Python3() + " " + kTestdata + "pil_rgb.py";
  for (const auto& n : names) command += " " + std::string(kTestdata) + n;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run " + command);
  std::string out;
  char buf[65536];
  size_t got;
  while ((got = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, got);
  int status = pclose(pipe);
  if (status != 0) throw std::runtime_error("failed (status " + std::to_string(WEXITSTATUS(status)) + "): " + command);
  std::map<std::string, RgbImage> images;
  size_t at = 0;
  for (const auto& n : names) {
    size_t nl = out.find('\n', at);
    if (nl == std::string::npos) throw std::runtime_error("short output from pil_rgb.py");
    RgbImage image;
    std::istringstream header(out.substr(at, nl - at));
    header >> image.width >> image.height;
    const size_t size = static_cast<size_t>(image.width) * image.height * 3;
    image.pixels.assign(out.begin() + nl + 1, out.begin() + nl + 1 + size);
    at = nl + 1 + size;
    images[n] = std::move(image);
  }
  return images;
}

inline uint32_t Crc32(const uint8_t* data, size_t n) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= data[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

inline void PutBigEndian32(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>((v >> (24 - 8 * i)) & 0xff);
}

// Rewrites the PNG's IHDR width and height and fixes the chunk's CRC, so the edit reaches the decoder's
// checks rather than failing on the CRC.
inline std::string PngWithDimensions(std::string png, uint32_t width, uint32_t height) {
  // signature (8) | length (4) "IHDR" (4) | width (4) height (4) ... | CRC after 13 data bytes
  PutBigEndian32(png, 16, width);
  PutBigEndian32(png, 20, height);
  PutBigEndian32(png, 29, Crc32(reinterpret_cast<const uint8_t*>(png.data()) + 12, 17));
  return png;
}

}  // namespace dsmesh::image_test
