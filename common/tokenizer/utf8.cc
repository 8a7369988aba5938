#include "common/tokenizer/utf8.h"

#include <cstdint>
#include <cstring>

namespace dsmesh::utf8 {
namespace {

// For a lead byte, how many continuation bytes follow and the allowed range of the first of them
// (Unicode Table 3-7, "Well-Formed UTF-8 Byte Sequences"). need == -1 marks a byte that can never
// start a sequence.
struct LeadInfo {
  int need;
  uint8_t lo, hi;
};

constexpr LeadInfo Lead(uint8_t b) {
  if (b < 0x80) return {0, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  return {-1, 0, 0};
}

constexpr char kReplacement[] = "\xEF\xBF\xBD";

// Outcome of reading one sequence at s[i].
enum class Step { kChar, kInvalid, kTruncated };

// Reads the sequence at s[i]; sets *len to the bytes consumed by a character or by the maximal
// invalid subpart (always >= 1 for kInvalid), or to the valid-so-far length for kTruncated.
inline Step ReadOne(const uint8_t* s, size_t n, size_t i, size_t* len) {
  const LeadInfo info = Lead(s[i]);
  if (info.need == 0) {
    *len = 1;
    return Step::kChar;
  }
  if (info.need < 0) {
    *len = 1;
    return Step::kInvalid;
  }
  size_t j = i + 1;
  for (int k = 0; k < info.need; ++k, ++j) {
    if (j >= n) {
      *len = j - i;
      return Step::kTruncated;
    }
    const uint8_t lo = k == 0 ? info.lo : 0x80, hi = k == 0 ? info.hi : 0xBF;
    if (s[j] < lo || s[j] > hi) {
      *len = j - i;  // the offending byte is not consumed; it may start the next sequence
      return Step::kInvalid;
    }
  }
  *len = j - i;
  return Step::kChar;
}

inline size_t AsciiRun(const uint8_t* s, size_t n, size_t i) {
  while (i + 8 <= n) {
    uint64_t w;
    std::memcpy(&w, s + i, 8);
    if (w & 0x8080808080808080ull) break;
    i += 8;
  }
  while (i < n && s[i] < 0x80) ++i;
  return i;
}

}  // namespace

size_t FindInvalid(std::string_view sv) {
  const auto* s = reinterpret_cast<const uint8_t*>(sv.data());
  const size_t n = sv.size();
  size_t i = 0;
  while (true) {
    i = AsciiRun(s, n, i);
    if (i >= n) return kValid;
    size_t len;
    if (ReadOne(s, n, i, &len) != Step::kChar) return i;
    i += len;
  }
}

void AppendLossy(std::string_view bytes, std::string* out) {
  const size_t done = AppendLossyComplete(bytes, out);
  if (done < bytes.size()) out->append(kReplacement);  // a truncated tail is one maximal subpart
}

size_t AppendLossyComplete(std::string_view bytes, std::string* out) {
  const auto* s = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0, copied = 0;  // bytes [copied, i) are well-formed and not yet appended
  while (true) {
    i = AsciiRun(s, n, i);
    if (i >= n) break;
    size_t len;
    const Step step = ReadOne(s, n, i, &len);
    if (step == Step::kChar) {
      i += len;
      continue;
    }
    out->append(bytes.data() + copied, i - copied);
    if (step == Step::kTruncated) return i;
    out->append(kReplacement);
    i += len;
    copied = i;
  }
  out->append(bytes.data() + copied, n - copied);
  return n;
}

void AppendCodePoint(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t DecodeValid(std::string_view sv, size_t* pos) {
  const auto* s = reinterpret_cast<const uint8_t*>(sv.data());
  size_t i = *pos;
  const uint8_t b = s[i];
  if (b < 0x80) {
    *pos = i + 1;
    return b;
  }
  if (b < 0xE0) {
    *pos = i + 2;
    return (char32_t(b & 0x1F) << 6) | (s[i + 1] & 0x3F);
  }
  if (b < 0xF0) {
    *pos = i + 3;
    return (char32_t(b & 0x0F) << 12) | (char32_t(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
  }
  *pos = i + 4;
  return (char32_t(b & 0x07) << 18) | (char32_t(s[i + 1] & 0x3F) << 12) |
         (char32_t(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
}

}  // namespace dsmesh::utf8
