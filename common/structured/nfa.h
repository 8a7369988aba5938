// A byte-level NFA (Thompson construction) and the builders the structured-output compilers use: byte
// ranges, literals, UTF-8 characters, sequences, alternatives, bounded and unbounded repetition, and a
// regular-expression parser (the ECMAScript subset JSON Schema "pattern" and vLLM's guided_regex use).
// Everything here is a regular language over bytes; token_grammar.h determinizes it lazily and turns it
// into token masks.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dsmesh::structured {

// A constraint the compilers cannot express; the message names the keyword or construct
// ("'multipleOf' is not supported"), and `path` says where in the schema it sits.
struct GrammarError : std::invalid_argument {
  GrammarError(const std::string& message, std::string path = "")
      : std::invalid_argument(message), path(std::move(path)) {}
  std::string path;
};

struct NfaEdge {
  uint8_t lo, hi;  // inclusive byte range
  int32_t to;
};

struct NfaState {
  std::vector<int32_t> eps;
  std::vector<NfaEdge> edges;
};

// A piece of NFA with one entry and one exit; the exit has no outgoing edges until it is connected.
struct Frag {
  int32_t start = -1, end = -1;
};

class Nfa {
 public:
  static constexpr size_t kMaxStates = 1 << 20;
  std::vector<NfaState> states;
  int32_t start = -1, accept = -1;

  int32_t NewState();
  void Eps(int32_t from, int32_t to) { states[from].eps.push_back(to); }
  size_t size() const { return states.size(); }

  // ---- builders --------------------------------------------------------------------------
  Frag Empty();                              // matches ""
  Frag Nothing();                            // matches no string at all
  Frag Range(uint8_t lo, uint8_t hi);        // one byte in [lo, hi]
  Frag Literal(std::string_view bytes);
  Frag Seq(const std::vector<Frag>& parts);
  Frag Alt(const std::vector<Frag>& options);
  Frag Opt(Frag f);
  Frag Star(Frag f);
  Frag Plus(Frag f) { return Seq({f, Star(Copy(f))}); }
  // `make` builds a fresh copy each call: min..max copies (max < 0: unbounded).
  Frag Repeat(const std::function<Frag()>& make, int min, int max);
  // One well-formed UTF-8 character whose code point is in [lo, hi].
  Frag CodePoints(uint32_t lo, uint32_t hi);
  // Any well-formed UTF-8 character except the ASCII bytes for which `excluded(b)` is true.
  Frag Utf8CharExcept(const std::function<bool(uint8_t)>& excluded);
  // A fresh copy of the states reachable from f.start (f must be self-contained).
  Frag Copy(Frag f);

  void SetRoot(Frag f) {
    start = f.start;
    accept = f.end;
  }
};

// Regular expression -> NFA fragment. `json_string` maps every matched character to its JSON-string
// spelling (the regex constrains the decoded string; '"' becomes \", '\' becomes \\, control characters
// are not generated). Anchors ^ and $ at the ends are accepted and ignored (the whole value is matched).
// Throws GrammarError naming the unsupported construct (lookaround, backreferences, ...).
Frag CompileRegex(Nfa& nfa, std::string_view pattern, bool json_string);

}  // namespace dsmesh::structured
