#include "common/tokenizer/byte_level.h"

#include "common/tokenizer/utf8.h"

namespace dsmesh::byte_level {
namespace {

struct Tables {
  std::array<char32_t, 256> to_cp{};
  std::array<int, 324> to_byte{};  // every code point used is below 256 + 68
  Tables() {
    to_byte.fill(-1);
    int shifted = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? char32_t(b) : char32_t(256 + shifted++);
      to_byte[to_cp[b]] = b;
    }
  }
};

const Tables& T() {
  static const Tables tables;
  return tables;
}

}  // namespace

char32_t ByteToCodePoint(unsigned char b) { return T().to_cp[b]; }

std::optional<unsigned char> CodePointToByte(char32_t cp) {
  if (cp >= T().to_byte.size() || T().to_byte[cp] < 0) return std::nullopt;
  return static_cast<unsigned char>(T().to_byte[cp]);
}

std::optional<std::string> ToBytes(std::string_view token) {
  // Every code point of the alphabet is below U+0144, so one or two UTF-8 bytes each.
  const Tables& t = T();
  std::string out;
  out.reserve(token.size());
  const auto* s = reinterpret_cast<const unsigned char*>(token.data());
  for (size_t i = 0, n = token.size(); i < n;) {
    char32_t cp;
    if (s[i] < 0x80) {
      cp = s[i++];
    } else if ((s[i] & 0xE0) == 0xC0 && i + 1 < n && (s[i + 1] & 0xC0) == 0x80) {
      cp = (char32_t(s[i] & 0x1F) << 6) | (s[i + 1] & 0x3F);
      i += 2;
    } else {
      return std::nullopt;
    }
    if (cp >= t.to_byte.size() || t.to_byte[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.to_byte[cp]));
  }
  return out;
}

std::string FromBytes(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) utf8::AppendCodePoint(ByteToCodePoint(b), &out);
  return out;
}

}  // namespace dsmesh::byte_level
