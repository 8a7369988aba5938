#include "common/tokenizer/pretokenizer.h"

#include <cctype>
#include <cstdio>
#include <stdexcept>

#include "common/tokenizer/unicode_class.h"

namespace dsmesh {
namespace {

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

constexpr size_t kJitStackMax = 8 << 20;  // deep enough for backtracking over very long runs

}  // namespace

PreTokenizerScratch::PreTokenizerScratch(size_t steps) : prefixed_(steps) {
  match_data_ = pcre2_match_data_create(1, nullptr);
  match_context_ = pcre2_match_context_create(nullptr);
  jit_stack_ = pcre2_jit_stack_create(64 << 10, kJitStackMax, nullptr);
  if (!match_data_ || !match_context_ || !jit_stack_) throw std::bad_alloc();
  pcre2_jit_stack_assign(match_context_, nullptr, jit_stack_);
}

PreTokenizerScratch::~PreTokenizerScratch() {
  pcre2_jit_stack_free(jit_stack_);
  pcre2_match_context_free(match_context_);
  pcre2_match_data_free(match_data_);
}

std::string PreTokenizer::TranslatePattern(const std::string& p, const std::string& source) {
  const std::string ws = unicode_class::kJsWhitespaceClassBody;
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ']' is literal
      continue;
    }
    if (c == ']' && in_class) {
      in_class = false;
      out += c;
      continue;
    }
    if (c != '\\' || i + 1 == p.size()) {
      out += c;
      continue;
    }
    const char e = p[++i];
    auto set = [&](const std::string& body, bool negated) {
      if (!in_class) {
        out += negated ? "[^" + body + "]" : "[" + body + "]";
      } else if (!negated) {
        out += body;
      } else {
        throw std::runtime_error(source + ": pre_tokenizer regex uses \\" + std::string(1, e) +
                                 " inside a character class, which is not supported: " + p);
      }
    };
    switch (e) {
      case 's': set(ws, false); break;
      case 'S': set(ws, true); break;
      case 'd': set("0-9", false); break;
      case 'D': set("0-9", true); break;
      case 'w': set("A-Za-z0-9_", false); break;
      case 'W': set("A-Za-z0-9_", true); break;
      case 'b':
      case 'B':
        if (!in_class)
          throw std::runtime_error(source + ": pre_tokenizer regex uses \\b or \\B (word boundaries differ between "
                                            "regex engines; not supported): " + p);
        out += "\\b";
        break;
      case 'u':  // \uHHHH (ECMAScript / Oniguruma) -> \x{HHHH}
        if (i + 4 < p.size() && std::isxdigit(static_cast<unsigned char>(p[i + 1])) &&
            std::isxdigit(static_cast<unsigned char>(p[i + 2])) && std::isxdigit(static_cast<unsigned char>(p[i + 3])) &&
            std::isxdigit(static_cast<unsigned char>(p[i + 4]))) {
          out += "\\x{" + p.substr(i + 1, 4) + "}";
          i += 4;
        } else {
          out += "\\u";
        }
        break;
      default:
        out += '\\';
        out += e;
        // Copy the rest of a multi-byte character after the backslash.
        while (i + 1 < p.size() && (static_cast<unsigned char>(p[i + 1]) & 0xC0) == 0x80) out += p[++i];
    }
  }
  return out;
}

PreTokenizer::PreTokenizer(const std::vector<PreTokenizerStep>& steps, const std::string& source)
    : source_(source) {
  for (const PreTokenizerStep& s : steps) {
    Step step{s.kind, nullptr};
    if (s.kind == PreTokenizerStep::Kind::kSplitIsolated) {
      const std::string pattern = TranslatePattern(s.regex, source);
      int err;
      PCRE2_SIZE offset;
      step.code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                &err, &offset, nullptr);
      if (!step.code)
        throw std::runtime_error(source + ": cannot compile pre_tokenizer regex '" + s.regex + "' (as '" + pattern +
                                 "'): " + Pcre2Message(err) + " at offset " + std::to_string(offset));
      const int jrc = pcre2_jit_compile(step.code, PCRE2_JIT_COMPLETE);
      if (jrc != 0 && jit_) {
        // No silent fallback: say once, per tokenizer, that this one runs the slow interpreter.
        std::fprintf(stderr, "dsmesh tokenizer: %s: PCRE2 JIT unavailable (%s); regexes run interpreted (slower)\n",
                     source.c_str(), Pcre2Message(jrc).c_str());
        jit_ = false;
      }
    }
    steps_.push_back(step);
  }
}

PreTokenizer::~PreTokenizer() {
  for (Step& s : steps_)
    if (s.code) pcre2_code_free(s.code);
}

void PreTokenizer::ThrowMatchError(int rc) const {
  throw std::runtime_error(source_ + ": pre_tokenizer regex match failed: " + Pcre2Message(rc));
}

}  // namespace dsmesh
