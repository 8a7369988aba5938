#include "common/tokenizer/unicode_class.h"

#include <pcre2.h>

#include <stdexcept>
#include <string>

#include "common/tokenizer/utf8.h"

namespace dsmesh::unicode_class {

const char kJsWhitespaceClassBody[] =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
    "\\x{3000}\\x{FEFF}";

bool IsJsWhitespace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0xA0) return false;
  return cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

bool IsWordChar(char32_t cp) {
  // Compiled once; pcre2_match on a 1-4 byte subject with its own match data is thread-safe.
  static pcre2_code* const code = [] {
    int err;
    PCRE2_SIZE off;
    pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>("^[\\p{L}\\p{Nd}\\p{Nl}\\p{M}\\p{Pc}\\x{200C}\\x{200D}]"), PCRE2_ZERO_TERMINATED,
                                  PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!c) throw std::runtime_error("unicode_class: cannot compile the word-character class");
    return c;
  }();
  std::string s;
  utf8::AppendCodePoint(cp, &s);
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md, nullptr);
  pcre2_match_data_free(md);
  return rc >= 0;
}

}  // namespace dsmesh::unicode_class
