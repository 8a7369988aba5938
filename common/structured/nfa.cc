#include "common/structured/nfa.h"

#include <algorithm>
#include <unordered_map>

namespace dsmesh::structured {

int32_t Nfa::NewState() {
  // Nested bounded repetitions multiply; a spec this large is refused rather than built.
  if (states.size() >= kMaxStates)
    throw GrammarError("the schema is too large to compile (over " + std::to_string(kMaxStates) +
                       " automaton states; lower maxItems/maxLength or nesting)");
  states.emplace_back();
  return static_cast<int32_t>(states.size() - 1);
}

Frag Nfa::Empty() {
  int32_t s = NewState();
  return {s, s};
}

Frag Nfa::Nothing() { return {NewState(), NewState()}; }

Frag Nfa::Range(uint8_t lo, uint8_t hi) {
  int32_t a = NewState(), b = NewState();
  states[a].edges.push_back({lo, hi, b});
  return {a, b};
}

Frag Nfa::Literal(std::string_view bytes) {
  int32_t a = NewState(), cur = a;
  for (unsigned char c : bytes) {
    int32_t n = NewState();
    states[cur].edges.push_back({c, c, n});
    cur = n;
  }
  return {a, cur};
}

Frag Nfa::Seq(const std::vector<Frag>& parts) {
  if (parts.empty()) return Empty();
  for (size_t i = 0; i + 1 < parts.size(); ++i) Eps(parts[i].end, parts[i + 1].start);
  return {parts.front().start, parts.back().end};
}

Frag Nfa::Alt(const std::vector<Frag>& options) {
  if (options.size() == 1) return options[0];
  int32_t a = NewState(), b = NewState();
  for (const Frag& f : options) {
    Eps(a, f.start);
    Eps(f.end, b);
  }
  return {a, b};
}

Frag Nfa::Opt(Frag f) {
  int32_t a = NewState(), b = NewState();
  Eps(a, f.start);
  Eps(f.end, b);
  Eps(a, b);
  return {a, b};
}

Frag Nfa::Star(Frag f) {
  int32_t a = NewState(), b = NewState();
  Eps(a, f.start);
  Eps(f.end, a);
  Eps(a, b);
  return {a, b};
}

Frag Nfa::Repeat(const std::function<Frag()>& make, int min, int max) {
  std::vector<Frag> parts;
  for (int i = 0; i < min; ++i) parts.push_back(make());
  if (max < 0) {
    parts.push_back(Star(make()));
  } else {
    // Nested optionals: (x (x (x)?)?)? so the NFA stays linear in max - min.
    Frag tail = Empty();
    for (int i = max; i > min; --i) tail = Opt(Seq({make(), tail}));
    parts.push_back(tail);
  }
  return Seq(parts);
}

Frag Nfa::Copy(Frag f) {
  std::unordered_map<int32_t, int32_t> map;
  std::vector<int32_t> todo = {f.start};
  map[f.start] = NewState();
  while (!todo.empty()) {
    int32_t s = todo.back();
    todo.pop_back();
    // Copy through indices: NewState may reallocate `states`.
    auto visit = [&](int32_t t) {
      auto [it, fresh] = map.emplace(t, -1);
      if (fresh) {
        it->second = NewState();
        todo.push_back(t);
      }
      return it->second;
    };
    for (size_t i = 0; i < states[s].eps.size(); ++i) {
      int32_t t = visit(states[s].eps[i]);
      states[map[s]].eps.push_back(t);
    }
    for (size_t i = 0; i < states[s].edges.size(); ++i) {
      NfaEdge e = states[s].edges[i];
      int32_t t = visit(e.to);
      states[map[s]].edges.push_back({e.lo, e.hi, t});
    }
  }
  auto end = map.find(f.end);
  if (end == map.end()) return {map[f.start], NewState()};  // the end was unreachable
  return {map[f.start], end->second};
}

namespace {

int Utf8Len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

std::vector<uint8_t> Utf8Bytes(uint32_t cp) {
  if (cp < 0x80) return {static_cast<uint8_t>(cp)};
  if (cp < 0x800) return {static_cast<uint8_t>(0xC0 | (cp >> 6)), static_cast<uint8_t>(0x80 | (cp & 0x3F))};
  if (cp < 0x10000)
    return {static_cast<uint8_t>(0xE0 | (cp >> 12)), static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F)),
            static_cast<uint8_t>(0x80 | (cp & 0x3F))};
  return {static_cast<uint8_t>(0xF0 | (cp >> 18)), static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F)),
          static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F)), static_cast<uint8_t>(0x80 | (cp & 0x3F))};
}

// Byte sequences of one length between L and H (lexicographic, continuation bytes 80-BF after the first).
Frag EncodeSameLength(Nfa& nfa, const std::vector<uint8_t>& L, const std::vector<uint8_t>& H, size_t i) {
  const size_t n = L.size();
  if (i == n - 1) return nfa.Range(L[i], H[i]);
  if (L[i] == H[i]) return nfa.Seq({nfa.Range(L[i], L[i]), EncodeSameLength(nfa, L, H, i + 1)});
  bool low_min = true, high_max = true;
  for (size_t k = i + 1; k < n; ++k) {
    low_min &= L[k] == 0x80;
    high_max &= H[k] == 0xBF;
  }
  auto full = [&](uint8_t lo, uint8_t hi) {
    std::vector<Frag> parts = {nfa.Range(lo, hi)};
    for (size_t k = i + 1; k < n; ++k) parts.push_back(nfa.Range(0x80, 0xBF));
    return nfa.Seq(parts);
  };
  if (low_min && high_max) return full(L[i], H[i]);
  std::vector<Frag> options;
  uint8_t lo = L[i], hi = H[i];
  if (!low_min) {
    std::vector<uint8_t> top(L);
    for (size_t k = i + 1; k < n; ++k) top[k] = 0xBF;
    options.push_back(nfa.Seq({nfa.Range(L[i], L[i]), EncodeSameLength(nfa, L, top, i + 1)}));
    ++lo;
  }
  if (!high_max) {
    std::vector<uint8_t> bottom(H);
    for (size_t k = i + 1; k < n; ++k) bottom[k] = 0x80;
    options.push_back(nfa.Seq({nfa.Range(H[i], H[i]), EncodeSameLength(nfa, bottom, H, i + 1)}));
    --hi;
  }
  if (lo <= hi) options.push_back(full(lo, hi));
  return nfa.Alt(options);
}

}  // namespace

Frag Nfa::CodePoints(uint32_t lo, uint32_t hi) {
  std::vector<Frag> options;
  auto add = [&](uint32_t a, uint32_t b) {
    while (a <= b) {
      uint32_t limit = Utf8Len(a) == 1 ? 0x7F : Utf8Len(a) == 2 ? 0x7FF : Utf8Len(a) == 3 ? 0xFFFF : 0x10FFFF;
      uint32_t e = std::min(b, limit);
      options.push_back(EncodeSameLength(*this, Utf8Bytes(a), Utf8Bytes(e), 0));
      if (e == b) break;
      a = e + 1;
    }
  };
  hi = std::min<uint32_t>(hi, 0x10FFFF);
  if (lo > hi) return Nothing();
  // Surrogates are not characters.
  if (lo < 0xD800 && hi >= 0xD800) {
    add(lo, 0xD7FF);
    if (hi > 0xDFFF) add(0xE000, hi);
  } else if (lo >= 0xD800 && lo <= 0xDFFF) {
    if (hi > 0xDFFF) add(0xE000, hi);
  } else {
    add(lo, hi);
  }
  if (options.empty()) return Nothing();
  return Alt(options);
}

Frag Nfa::Utf8CharExcept(const std::function<bool(uint8_t)>& excluded) {
  std::vector<Frag> options;
  int run = -1;
  for (int b = 0; b <= 0x80; ++b) {
    bool ok = b < 0x80 && !excluded(static_cast<uint8_t>(b));
    if (ok && run < 0) run = b;
    if (!ok && run >= 0) {
      options.push_back(Range(static_cast<uint8_t>(run), static_cast<uint8_t>(b - 1)));
      run = -1;
    }
  }
  options.push_back(CodePoints(0x80, 0x10FFFF));
  return Alt(options);
}

// ---- regular expressions -----------------------------------------------------------------

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges Normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto& x : r) {
    if (!out.empty() && x.first <= out.back().second + 1) out.back().second = std::max(out.back().second, x.second);
    else out.push_back(x);
  }
  return out;
}

Ranges Complement(const Ranges& r) {
  Ranges n = Normalize(r), out;
  uint32_t next = 0;
  for (auto& x : n) {
    if (x.first > next) out.push_back({next, x.first - 1});
    next = x.second + 1;
  }
  if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
  return out;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};

class RegexParser {
 public:
  RegexParser(Nfa& nfa, std::string_view p, bool json) : nfa_(nfa), p_(p), json_(json) {}

  Frag Parse() {
    if (!p_.empty() && p_[0] == '^') ++i_;
    Frag f = ParseAlt();
    if (i_ < p_.size()) Fail("unbalanced ')'");
    return f;
  }

 private:
  [[noreturn]] void Fail(const std::string& what) {
    throw GrammarError("regular expression /" + std::string(p_) + "/: " + what + " (at offset " +
                       std::to_string(i_) + ")");
  }
  bool More() const { return i_ < p_.size(); }
  char Peek() const { return p_[i_]; }

  Frag ParseAlt() {
    std::vector<Frag> options = {ParseSeq()};
    while (More() && Peek() == '|') {
      ++i_;
      options.push_back(ParseSeq());
    }
    return nfa_.Alt(options);
  }

  Frag ParseSeq() {
    std::vector<Frag> parts;
    while (More() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '$' && i_ + 1 == p_.size()) {
        ++i_;
        break;
      }
      parts.push_back(ParseQuantified());
    }
    return nfa_.Seq(parts);
  }

  int ReadInt() {
    size_t s = i_;
    while (More() && Peek() >= '0' && Peek() <= '9') ++i_;
    if (s == i_) Fail("expected a number in {m,n}");
    if (i_ - s > 5) Fail("repetition count too large");
    return std::stoi(std::string(p_.substr(s, i_ - s)));
  }

  Frag ParseQuantified() {
    Frag atom = ParseAtom();
    while (More()) {
      char c = Peek();
      int lo, hi;
      if (c == '*') { lo = 0; hi = -1; ++i_; }
      else if (c == '+') { lo = 1; hi = -1; ++i_; }
      else if (c == '?') { lo = 0; hi = 1; ++i_; }
      else if (c == '{') {
        ++i_;
        lo = ReadInt();
        hi = lo;
        if (More() && Peek() == ',') {
          ++i_;
          hi = (More() && Peek() == '}') ? -1 : ReadInt();
        }
        if (!More() || Peek() != '}') Fail("expected '}'");
        ++i_;
        if (hi >= 0 && hi < lo) Fail("{m,n} with n < m");
        if (hi > 1000 || lo > 1000) Fail("repetition bound over 1000");
      } else {
        break;
      }
      if (More() && (Peek() == '?' || Peek() == '+')) ++i_;  // lazy/possessive: same language
      Frag proto = atom;
      atom = nfa_.Repeat([&] { return nfa_.Copy(proto); }, lo, hi);
    }
    return atom;
  }

  // One character (code point) of the pattern, with escapes resolved; returns a class for \d etc.
  Ranges ParseEscape(bool in_class) {
    if (!More()) Fail("dangling '\\'");
    char c = p_[i_++];
    switch (c) {
      case 'd': return kDigit;
      case 'D': return Complement(kDigit);
      case 'w': return kWord;
      case 'W': return Complement(kWord);
      case 's': return kSpace;
      case 'S': return Complement(kSpace);
      case 'n': return {{'\n', '\n'}};
      case 't': return {{'\t', '\t'}};
      case 'r': return {{'\r', '\r'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case 'b':
        if (in_class) return {{'\b', '\b'}};
        Fail("word boundaries (\\b) are not supported");
      case 'B': Fail("\\B is not supported");
      case 'u': {
        if (i_ + 4 > p_.size()) Fail("\\u needs 4 hex digits");
        uint32_t cp = std::stoul(std::string(p_.substr(i_, 4)), nullptr, 16);
        i_ += 4;
        return {{cp, cp}};
      }
      case 'x': {
        if (i_ + 2 > p_.size()) Fail("\\x needs 2 hex digits");
        uint32_t cp = std::stoul(std::string(p_.substr(i_, 2)), nullptr, 16);
        i_ += 2;
        return {{cp, cp}};
      }
      default:
        if (c >= '1' && c <= '9') Fail("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) Fail(std::string("unknown escape \\") + c);
        return {{static_cast<uint32_t>(static_cast<unsigned char>(c)), static_cast<uint32_t>(static_cast<unsigned char>(c))}};
    }
  }

  uint32_t ReadCodePoint() {
    unsigned char c = p_[i_];
    int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (i_ + len > p_.size()) Fail("invalid UTF-8");
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(p_[i_ + k]) & 0x3F);
    i_ += len;
    return cp;
  }

  Ranges ParseClass() {
    bool negate = false;
    if (More() && Peek() == '^') {
      negate = true;
      ++i_;
    }
    Ranges r;
    bool first = true;
    while (More() && (Peek() != ']' || first)) {
      first = false;
      Ranges item;
      if (Peek() == '\\') {
        ++i_;
        item = ParseEscape(true);
      } else if (Peek() == '[' && i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
        Fail("POSIX classes are not supported");
      } else {
        uint32_t cp = ReadCodePoint();
        item = {{cp, cp}};
      }
      if (item.size() == 1 && item[0].first == item[0].second && i_ + 1 < p_.size() && Peek() == '-' &&
          p_[i_ + 1] != ']') {
        ++i_;
        Ranges hi_item;
        if (Peek() == '\\') {
          ++i_;
          hi_item = ParseEscape(true);
        } else {
          uint32_t cp = ReadCodePoint();
          hi_item = {{cp, cp}};
        }
        if (hi_item.size() != 1 || hi_item[0].first != hi_item[0].second) Fail("bad class range");
        if (hi_item[0].first < item[0].first) Fail("class range out of order");
        item = {{item[0].first, hi_item[0].first}};
      }
      r.insert(r.end(), item.begin(), item.end());
    }
    if (!More()) Fail("unterminated character class");
    ++i_;  // ']'
    return negate ? Complement(r) : Normalize(r);
  }

  // The NFA of a set of code points; in JSON-string mode each character is spelled as JSON writes it.
  Frag Chars(Ranges r) {
    r = Normalize(r);
    std::vector<Frag> options;
    for (auto [lo, hi] : r) {
      if (!json_) {
        options.push_back(nfa_.CodePoints(lo, hi));
        continue;
      }
      // JSON: control characters are not generated raw; '"' and '\' are escaped.
      auto piece = [&](uint32_t a, uint32_t b) {
        if (a <= b) options.push_back(nfa_.CodePoints(a, b));
      };
      uint32_t a = std::max<uint32_t>(lo, 0x20);
      if (lo <= '\n' && '\n' <= hi) options.push_back(nfa_.Literal("\\n"));
      if (lo <= '\t' && '\t' <= hi) options.push_back(nfa_.Literal("\\t"));
      while (a <= hi) {
        if (a == '"' || a == '\\') {
          options.push_back(nfa_.Literal(a == '"' ? "\\\"" : "\\\\"));
          ++a;
          continue;
        }
        uint32_t b = hi;
        if (a < '"' && b >= '"') b = '"' - 1;
        else if (a < '\\' && b >= '\\') b = '\\' - 1;
        piece(a, b);
        a = b + 1;
      }
    }
    if (options.empty()) return nfa_.Nothing();
    return nfa_.Alt(options);
  }

  Frag ParseAtom() {
    char c = Peek();
    if (c == '(') {
      ++i_;
      if (More() && Peek() == '?') {
        ++i_;
        if (More() && Peek() == ':') ++i_;
        else if (More() && Peek() == '<' && i_ + 1 < p_.size() && p_[i_ + 1] != '=' && p_[i_ + 1] != '!') {
          while (More() && Peek() != '>') ++i_;  // named group
          if (!More()) Fail("unterminated group name");
          ++i_;
        } else {
          Fail("lookaround assertions are not supported");
        }
      }
      Frag f = ParseAlt();
      if (!More() || Peek() != ')') Fail("missing ')'");
      ++i_;
      return f;
    }
    if (c == '[') {
      ++i_;
      return Chars(ParseClass());
    }
    if (c == '.') {
      ++i_;
      return Chars(Complement({{'\n', '\n'}, {'\r', '\r'}}));
    }
    if (c == '\\') {
      ++i_;
      return Chars(ParseEscape(false));
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') Fail(std::string("nothing to repeat before '") + c + "'");
    if (c == '^') Fail("'^' inside a pattern is not supported");
    if (c == '$') Fail("'$' inside a pattern is not supported");
    uint32_t cp = ReadCodePoint();
    return Chars({{cp, cp}});
  }

  Nfa& nfa_;
  std::string_view p_;
  bool json_;
  size_t i_ = 0;
};

}  // namespace

Frag CompileRegex(Nfa& nfa, std::string_view pattern, bool json_string) {
  return RegexParser(nfa, pattern, json_string).Parse();
}

}  // namespace dsmesh::structured
