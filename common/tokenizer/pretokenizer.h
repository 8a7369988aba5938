// Pre-tokenization of the byte-level BPE family: a sequence of regex splits ("Isolated": matches and
// the text between them both become pieces), each applied to every piece of the previous step,
// run by PCRE2 (UTF + UCP, JIT-compiled). The ByteLevel step itself needs no work here: the BPE
// model consumes raw bytes, which is equivalent to mapping them to the ByteLevel alphabet.
//
// The patterns in tokenizer.json are written for Oniguruma (HF) and run by ECMAScript RegExp in the
// reference implementation. We follow the reference: \s, \d, \w (and negations) are rewritten to
// their ECMAScript sets before compiling, since PCRE2's Unicode \s differs (it excludes U+FEFF).
#pragma once

#include <pcre2.h>

#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/tokenizer_json.h"

namespace dsmesh {

// Per-thread matching state (PCRE2 match data and JIT stack); one per thread and tokenizer.
class PreTokenizerScratch {
 public:
  PreTokenizerScratch(size_t steps);
  ~PreTokenizerScratch();
  PreTokenizerScratch(const PreTokenizerScratch&) = delete;
  PreTokenizerScratch& operator=(const PreTokenizerScratch&) = delete;

 private:
  friend class PreTokenizer;
  pcre2_match_data* match_data_;
  pcre2_match_context* match_context_;
  pcre2_jit_stack* jit_stack_;
  std::vector<std::string> prefixed_;  // per step: buffer for a piece given a leading space
};

class PreTokenizer {
 public:
  // `source` names the tokenizer.json in error messages.
  PreTokenizer(const std::vector<PreTokenizerStep>& steps, const std::string& source);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Calls fn(std::string_view piece) for every non-empty pre-token of `text`, in order. `text` must be
  // well-formed UTF-8 (it is not re-checked).
  template <class Fn>
  void ForEachPiece(std::string_view text, PreTokenizerScratch* scratch, Fn&& fn) const {
    Run(0, text, scratch, fn);
  }

  size_t steps() const { return steps_.size(); }
  bool jit() const { return jit_; }

  // The PCRE2 form of an HF/ECMAScript pattern (exposed for tests).
  static std::string TranslatePattern(const std::string& pattern, const std::string& source);

 private:
  struct Step {
    PreTokenizerStep::Kind kind;
    pcre2_code* code = nullptr;
  };

  template <class Fn>
  void Run(size_t level, std::string_view piece, PreTokenizerScratch* scratch, Fn& fn) const {
    if (level == steps_.size()) {
      fn(piece);
      return;
    }
    const Step& step = steps_[level];
    if (step.kind == PreTokenizerStep::Kind::kPrefixSpace) {
      if (!piece.empty() && piece[0] == ' ') return Run(level + 1, piece, scratch, fn);
      std::string& buf = scratch->prefixed_[level];
      buf.assign(1, ' ');
      buf.append(piece);
      return Run(level + 1, std::string_view(buf), scratch, fn);
    }
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
    const size_t n = piece.size();
    size_t pos = 0, prev = 0;
    while (pos <= n) {
      const int rc = Match(step.code, subject, n, pos, scratch);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) ThrowMatchError(rc);
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch->match_data_);
      const size_t ms = ov[0], me = ov[1];
      if (ms > prev) Run(level + 1, piece.substr(prev, ms - prev), scratch, fn);
      if (me > ms) Run(level + 1, piece.substr(ms, me - ms), scratch, fn);
      prev = me;
      if (me > ms) {
        if (me == n) break;  // only an empty match could follow, and it would add no piece
        pos = me;
      } else {  // empty match: step over one code point, as ECMAScript matchAll does with /u
        if (me >= n) break;
        pos = me + 1;
        while (pos < n && (static_cast<unsigned char>(piece[pos]) & 0xC0) == 0x80) ++pos;
      }
    }
    if (prev < n) Run(level + 1, piece.substr(prev), scratch, fn);
  }

  int Match(const pcre2_code* code, PCRE2_SPTR subject, size_t n, size_t pos, PreTokenizerScratch* scratch) const {
    if (jit_) return pcre2_jit_match(code, subject, n, pos, 0, scratch->match_data_, scratch->match_context_);
    return pcre2_match(code, subject, n, pos, PCRE2_NO_UTF_CHECK, scratch->match_data_, scratch->match_context_);
  }

  [[noreturn]] void ThrowMatchError(int rc) const;

  std::string source_;
  std::vector<Step> steps_;
  bool jit_ = true;
};

}  // namespace dsmesh
