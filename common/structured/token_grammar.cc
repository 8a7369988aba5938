#include "common/structured/token_grammar.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "common/structured/schema_compiler.h"

namespace dsmesh::structured {

// ---- vocabulary ----------------------------------------------------------------------------

int TextTokenChars(std::string_view b) {
  int chars = 0;
  for (size_t i = 0; i < b.size(); ++chars) {
    const unsigned char c = static_cast<unsigned char>(b[i]);
    size_t len;
    if (c < 0x80) {
      if (c < 0x20 || c == '"' || c == '\\') return -1;
      len = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
    } else {
      return -1;
    }
    if (i + len > b.size()) return -1;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(b[i + k]) & 0xC0) != 0x80) return -1;
    if (len > 1) {
      const unsigned char c1 = static_cast<unsigned char>(b[i + 1]);
      if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F))
        return -1;  // overlong, surrogate or beyond U+10FFFF
    }
    i += len;
  }
  return chars;
}

namespace {

// Builds a trie over `ids` (whose bytes are bytes[id]), nodes in depth-first preorder, children by byte.
// Tokens with equal bytes share a node: the node keeps the last one, `next_same` links it to the others.
ByteTrie BuildTrie(const std::vector<std::string>& bytes, const std::vector<int32_t>& ids,
                   std::vector<int32_t>* next_same) {
  struct TmpNode {
    std::vector<std::pair<uint8_t, uint32_t>> children;
    int32_t token = -1;
  };
  std::vector<TmpNode> tmp(1);
  for (int32_t id : ids) {
    uint32_t node = 0;
    for (unsigned char c : bytes[id]) {
      uint32_t child = 0;
      for (auto& [byte, idx] : tmp[node].children)
        if (byte == c) child = idx;
      if (!child) {
        child = static_cast<uint32_t>(tmp.size());
        tmp[node].children.push_back({c, child});
        tmp.emplace_back();
      }
      node = child;
    }
    (*next_same)[id] = tmp[node].token;
    tmp[node].token = id;
  }
  // Preorder (smallest byte first); `end` is filled when a node's subtree is done.
  ByteTrie t;
  t.nodes_pre.reserve(tmp.size());
  struct Frame {
    uint32_t tmp_node, pre;
    uint8_t byte;
    uint16_t depth;
    bool expanded;
  };
  std::vector<Frame> stack = {{0, 0, 0, 0, false}};
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (f.expanded) {
      t.nodes_pre[f.pre].end = static_cast<uint32_t>(t.nodes_pre.size());
      stack.pop_back();
      continue;
    }
    f.expanded = true;
    f.pre = static_cast<uint32_t>(t.nodes_pre.size());
    if (f.depth > 0xFFFF - 1) throw std::runtime_error("token longer than 65535 bytes");
    t.nodes_pre.push_back({0, tmp[f.tmp_node].token, f.byte, 0, f.depth});
    t.max_depth = std::max(t.max_depth, f.depth);
    auto ch = tmp[f.tmp_node].children;
    std::sort(ch.begin(), ch.end());
    const uint16_t depth = static_cast<uint16_t>(f.depth + 1);  // f may move when the stack grows
    for (auto it = ch.rbegin(); it != ch.rend(); ++it) stack.push_back({it->second, 0, it->first, depth, false});
  }
  return t;
}

}  // namespace

VocabTrie::VocabTrie(const Tokenizer& tok, int64_t vocab_size, bool with_added) : vocab_size_(vocab_size) {
  if (tok.eos_id()) eos_ = *tok.eos_id();
  bytes_.resize(vocab_size);
  next_same_.assign(vocab_size, -1);
  std::vector<int32_t> all, rest;
  std::vector<std::pair<int, int32_t>> text;  // (chars, id)
  const int64_t n = std::min<int64_t>(vocab_size, tok.vocab_size());
  for (int32_t id = 0; id < n; ++id) {
    if (tok.IsSpecial(id) || (!with_added && tok.IsAdded(id))) continue;
    std::string_view b;
    try {
      b = tok.TokenBytes(id);
    } catch (const std::exception&) {
      continue;  // a hole in the id space
    }
    if (b.empty()) continue;
    bytes_[id] = std::string(b);
    all.push_back(id);
    const int chars = TextTokenChars(b);
    if (chars > 0) {
      text.push_back({chars, id});
    } else {
      rest.push_back(id);
    }
  }
  all_ = BuildTrie(bytes_, all, &next_same_);
  // Tokens with equal bytes are all text tokens or none, so a node of rest_ holds the same last token as
  // all_'s node and next_same_ (built for all_) links the same tokens: the chains built here are dropped.
  std::vector<int32_t> unused(vocab_size, -1);
  rest_ = BuildTrie(bytes_, rest, &unused);
  std::sort(text.begin(), text.end());
  const int max_chars = text.empty() ? 0 : text.back().first;
  text_start_.assign(max_chars + 1, 0);
  for (const auto& [chars, id] : text) {
    text_tokens_.push_back(id);
    text_start_[chars] = text_tokens_.size();
  }
  for (int c = 1; c <= max_chars; ++c) text_start_[c] = std::max(text_start_[c], text_start_[c - 1]);
  text_upto_.assign(static_cast<size_t>(max_chars + 1) * words(), 0);
  for (int c = 1; c <= max_chars; ++c) {
    uint64_t* bits = &text_upto_[static_cast<size_t>(c) * words()];
    std::copy(bits - words(), bits, bits);
    for (size_t i = text_start_[c - 1]; i < text_start_[c]; ++i) bits[text_tokens_[i] >> 6] |= 1ull << (text_tokens_[i] & 63);
  }
}

// ---- grammar -------------------------------------------------------------------------------

CompiledGrammar::CompiledGrammar(Nfa nfa, std::shared_ptr<const VocabTrie> trie, size_t cache_bytes)
    : nfa_(std::move(nfa)), trie_(std::move(trie)), words_(trie_->words()), cache_limit_(cache_bytes) {
  // Fewest bytes from each NFA state to the accepting one: 0-1 BFS over the reversed graph, held as one
  // array of predecessors per state (offsets into `pred`): no allocation per state, which was most of the
  // compile time of the larger grammars (a free JSON value nested 3 deep has ~80,000 NFA states).
  const size_t n = nfa_.size();
  std::vector<uint32_t> pred_start(n + 1, 0);
  for (size_t s = 0; s < n; ++s) {
    for (int32_t t : nfa_.states[s].eps) ++pred_start[t + 1];
    for (const auto& e : nfa_.states[s].edges) ++pred_start[e.to + 1];
  }
  for (size_t s = 0; s < n; ++s) pred_start[s + 1] += pred_start[s];
  std::vector<int32_t> pred(pred_start[n]);  // predecessor, negated minus one for an epsilon edge
  {
    std::vector<uint32_t> fill(pred_start.begin(), pred_start.end() - 1);
    for (size_t s = 0; s < n; ++s) {
      for (int32_t t : nfa_.states[s].eps) pred[fill[t]++] = -static_cast<int32_t>(s) - 1;
      for (const auto& e : nfa_.states[s].edges) pred[fill[e.to]++] = static_cast<int32_t>(s);
    }
  }
  const int32_t inf = std::numeric_limits<int32_t>::max() / 2;
  nfa_dist_.assign(n, inf);
  std::deque<int32_t> q;
  nfa_dist_[nfa_.accept] = 0;
  q.push_back(nfa_.accept);
  while (!q.empty()) {
    int32_t s = q.front();
    q.pop_front();
    for (uint32_t k = pred_start[s]; k < pred_start[s + 1]; ++k) {
      const bool eps = pred[k] < 0;
      const int32_t p = eps ? -pred[k] - 1 : pred[k];
      const int w = eps ? 0 : 1;
      if (nfa_dist_[s] + w < nfa_dist_[p]) {
        nfa_dist_[p] = nfa_dist_[s] + w;
        if (w == 0) q.push_front(p);
        else q.push_back(p);
      }
    }
  }
  // Bytes in exactly the same NFA edges lead every DFA state to the same state: Step() computes one
  // transition per such class and fills the row for all its bytes. The class of a byte is the set of
  // distinct edge ranges holding it, so bytes need not be adjacent to share one (the letters that no
  // keyword of the schema uses, say): fewer transitions to build and fewer columns to compare.
  std::vector<std::pair<uint8_t, uint8_t>> ranges;
  {
    std::vector<char> seen(256 * 256, 0);
    for (const auto& st : nfa_.states)
      for (const auto& e : st.edges) {
        char& f = seen[e.lo * 256 + e.hi];
        if (!f) ranges.push_back({e.lo, e.hi});
        f = 1;
      }
  }
  std::vector<std::string> member_of(256, std::string(ranges.size(), '\0'));
  for (size_t r = 0; r < ranges.size(); ++r)
    for (int b = ranges[r].first; b <= ranges[r].second; ++b) member_of[b][r] = 1;
  std::unordered_map<std::string, uint8_t> class_of;
  for (int b = 0; b < 256; ++b) {
    auto [it, added] = class_of.emplace(member_of[b], static_cast<uint8_t>(class_bytes_.size()));
    if (added) class_bytes_.emplace_back();
    byte_class_[b] = it->second;
    class_bytes_[it->second].push_back(static_cast<uint8_t>(b));
  }
  mark_.assign(n, 0);
  in_next_.assign(n, 0);
  closures_.resize(n);
  closure_done_.assign(n, 0);
  std::vector<int32_t> start = {nfa_.start};
  Closure(&start);
  Intern(std::move(start));
}

void CompiledGrammar::Closure(std::vector<int32_t>* set) {
  std::vector<int32_t> todo = *set;
  for (int32_t s : *set) mark_[s] = 1;
  while (!todo.empty()) {
    int32_t s = todo.back();
    todo.pop_back();
    for (int32_t t : nfa_.states[s].eps)
      if (!mark_[t]) {
        mark_[t] = 1;
        set->push_back(t);
        todo.push_back(t);
      }
  }
  for (int32_t s : *set) mark_[s] = 0;
  // Only states with byte edges (or the accept state) matter for what follows.
  set->erase(std::remove_if(set->begin(), set->end(),
                            [&](int32_t s) { return nfa_.states[s].edges.empty() && s != nfa_.accept; }),
             set->end());
  std::sort(set->begin(), set->end());
  set->erase(std::unique(set->begin(), set->end()), set->end());
}

const std::vector<int32_t>& CompiledGrammar::StateClosure(int32_t s) {
  if (!closure_done_[s]) {
    std::vector<int32_t> set = {s};
    Closure(&set);
    closures_[s] = std::move(set);
    closure_done_[s] = 1;
  }
  return closures_[s];
}

int32_t CompiledGrammar::Intern(std::vector<int32_t> set) {
  if (set.empty()) return -1;
  std::string key(reinterpret_cast<const char*>(set.data()), set.size() * sizeof(int32_t));
  auto it = index_.find(key);
  if (it != index_.end()) return it->second;
  const int32_t id = static_cast<int32_t>(sets_.size());
  const std::string& stored = index_.emplace(std::move(key), id).first->first;
  bool acc = false;
  int32_t d = std::numeric_limits<int32_t>::max() / 2;
  for (int32_t s : set) {
    acc |= s == nfa_.accept;
    d = std::min(d, nfa_dist_[s]);
  }
  accepting_.push_back(acc);
  dist_.push_back(d);
  char_target_.push_back(kUnknown);
  text_limit_.push_back(kUnknown);
  after_min_.push_back(kUnknown);
  after_max_.push_back(kUnknown);
  sets_.push_back(std::move(set));
  trans_.resize(trans_.size() + 256, -2);
  if (adopted_) {  // a state built after the background table was adopted: its entries from the table
    state_mask_.push_back(-1);
    state_profile_.push_back(-1);
    MapState(id, stored);
  }
  return id;
}

int32_t CompiledGrammar::Step(int32_t state, uint8_t byte) {
  int32_t& slot = trans_[static_cast<size_t>(state) * 256 + byte];
  if (slot != -2) return slot;
  // The union of the (cached) closures of the targets: no closure search per transition.
  std::vector<int32_t> next;
  for (int32_t s : sets_[state])
    for (const auto& e : nfa_.states[s].edges)
      if (e.lo <= byte && byte <= e.hi)
        for (int32_t t : StateClosure(e.to))
          if (!in_next_[t]) {
            in_next_[t] = 1;
            next.push_back(t);
          }
  for (int32_t t : next) in_next_[t] = 0;
  std::sort(next.begin(), next.end());
  const int32_t id = Intern(std::move(next));
  int32_t* row = &trans_[static_cast<size_t>(state) * 256];  // Intern may have grown trans_
  for (uint8_t b : class_bytes_[byte_class_[byte]]) row[b] = id;
  return id;
}

int32_t CompiledGrammar::Next(int32_t state, uint8_t byte) {
  AdoptIfReady();
  return Step(state, byte);
}

int32_t CompiledGrammar::AdvanceToken(int32_t state, int32_t token) {
  AdoptIfReady();
  if (token == trie_->eos()) return accepting_[state] ? state : -1;
  if (token < 0 || token >= trie_->vocab_size()) return -1;
  const std::string& b = trie_->bytes(token);
  if (b.empty()) return -1;
  for (unsigned char c : b) {
    state = Step(state, c);
    if (state < 0) return -1;
  }
  return state;
}

// The state every text character (as TextTokenChars counts them) takes `state` to, -1 when all of them
// are rejected, kMixed when they disagree. Runs the DFA over the characters' byte structure (1-byte
// characters one by one; longer ones by lead byte, then each continuation byte range), keeping the
// distinct states after each byte, so it costs a few thousand transitions, not one per code point.
int32_t CompiledGrammar::CharTarget(int32_t state) {
  if (char_target_[state] != kUnknown) return char_target_[state];
  int32_t target = kUnknown;
  bool mixed = false;
  auto merge = [&](int32_t t) {
    if (target == kUnknown) target = t;
    else if (target != t) mixed = true;
  };
  auto step = [&](int32_t s, int b) { return s < 0 ? -1 : Step(s, static_cast<uint8_t>(b)); };
  auto add = [](std::vector<int32_t>* v, int32_t s) {
    if (std::find(v->begin(), v->end(), s) == v->end()) v->push_back(s);
  };
  for (int b = 0x20; b <= 0x7F && !mixed; ++b)
    if (b != '"' && b != '\\') merge(step(state, b));
  // Lead byte range, the second byte's range for those leads, and how many 80..BF bytes follow.
  struct Shape {
    int lead_lo, lead_hi, lo, hi, more;
  };
  static constexpr Shape kShapes[] = {
      {0xC2, 0xDF, 0x80, 0xBF, 0}, {0xE0, 0xE0, 0xA0, 0xBF, 1}, {0xE1, 0xEC, 0x80, 0xBF, 1},
      {0xED, 0xED, 0x80, 0x9F, 1}, {0xEE, 0xEF, 0x80, 0xBF, 1}, {0xF0, 0xF0, 0x90, 0xBF, 2},
      {0xF1, 0xF3, 0x80, 0xBF, 2}, {0xF4, 0xF4, 0x80, 0x8F, 2},
  };
  std::vector<int32_t> level, next;
  for (const Shape& sh : kShapes) {
    if (mixed) break;
    level.clear();
    for (int l = sh.lead_lo; l <= sh.lead_hi; ++l) add(&level, step(state, l));
    for (int k = 0; k <= sh.more; ++k) {
      next.clear();
      const int lo = k == 0 ? sh.lo : 0x80, hi = k == 0 ? sh.hi : 0xBF;
      for (int32_t s : level)
        for (int c = lo; c <= hi; ++c) add(&next, step(s, c));
      level.swap(next);
    }
    for (int32_t s : level) merge(s);
  }
  char_target_[state] = mixed ? kMixed : target;
  return char_target_[state];
}

// How many characters a text token may have to be allowed from `state`: follows state -> CharTarget ->
// ... while the characters agree. A text token of n characters is allowed exactly when the n-th state of
// that chain is not -1. Returns the number of characters the chain survives (max_text_chars() when it
// cycles or outlives every text token), or kNoShortcut when the characters disagree before the longest
// text token is decided.
int32_t CompiledGrammar::TextLimit(int32_t state) {
  if (text_limit_[state] != kUnknown) return text_limit_[state];
  const int32_t max_chars = trie_->max_text_chars();
  std::vector<int32_t> chain = {state};
  int32_t limit = kNoShortcut;
  for (int32_t i = 0;; ++i) {
    if (i == max_chars) {
      limit = max_chars;
      break;
    }
    const int32_t t = CharTarget(chain[i]);
    if (t == kMixed) break;
    if (t < 0) {
      limit = i;
      break;
    }
    if (std::find(chain.begin(), chain.end(), t) != chain.end()) {
      limit = max_chars;
      break;
    }
    chain.push_back(t);
  }
  text_limit_[state] = limit;
  return limit;
}

// Adds to `mask` every token of `trie` the DFA accepts from `state`: one pass over the preorder nodes
// that jumps past each subtree the DFA rejects. The state of a node's parent is the one last set at the
// parent's depth, so a small array by depth replaces a stack.
template <bool kAfter, bool kLimit>
void CompiledGrammar::WalkTrie(const ByteTrie& t, int32_t state, uint64_t* mask, int32_t* after, int32_t limit) {
  walk_states_.resize(static_cast<size_t>(t.max_depth) + 1);
  int32_t* at = walk_states_.data();
  at[0] = state;
  const ByteTrie::Node* nodes = t.nodes_pre.data();
  const uint32_t n_nodes = static_cast<uint32_t>(t.nodes());
  const int32_t* trans = trans_.data();
  for (uint32_t n = 1; n < n_nodes;) {
    const ByteTrie::Node& node = nodes[n];
    const int32_t parent = at[node.depth - 1];
    int32_t ns = trans[static_cast<size_t>(parent) * 256 + node.byte];
    if (ns == -2) {
      ns = Step(parent, node.byte);
      trans = trans_.data();  // Step may have grown trans_
    }
    if (ns < 0) {
      n = node.end;
      continue;
    }
    at[node.depth] = ns;
    if (node.token >= 0 && (!kLimit || dist_[ns] <= limit)) {
      for (int32_t tok = node.token; tok >= 0; tok = trie_->next_same(tok)) mask[tok >> 6] |= 1ull << (tok & 63);
      if constexpr (kAfter) {
        after[0] = std::min(after[0], dist_[ns]);
        after[1] = std::max(after[1], dist_[ns]);
        if (collect_ && collect_->size() <= kMaxProfileTokens)  // past the bound no profile is kept
          for (int32_t tok = node.token; tok >= 0; tok = trie_->next_same(tok)) collect_->push_back({dist_[ns], tok});
      }
    }
    ++n;
  }
}

// ---- cache ---------------------------------------------------------------------------------

namespace {
constexpr uint64_t kFullMask = 0, kTailMask = 2;
uint64_t Key(uint64_t kind, int32_t state, uint64_t limit = 0) {
  return (kind << 62) | (static_cast<uint64_t>(state) << 20) | limit;
}
}  // namespace

CompiledGrammar::Entry* CompiledGrammar::Find(uint64_t key) {
  auto it = cache_.find(key);
  if (it == cache_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  ++touched_;
  return &it->second;
}

CompiledGrammar::Entry& CompiledGrammar::Insert(uint64_t key, Entry entry) {
  lru_.push_front(key);
  entry.lru = lru_.begin();
  cache_bytes_ += entry.bytes;
  ++touched_;
  return cache_.emplace(key, std::move(entry)).first->second;
}

void CompiledGrammar::Evict() {
  while (cache_bytes_ + pre_stats_.bytes > cache_limit_ && lru_.size() > touched_) {
    auto it = cache_.find(lru_.back());
    cache_bytes_ -= it->second.bytes;
    cache_.erase(it);
    lru_.pop_back();
    ++evictions_;
  }
}

CompiledGrammar::CacheStats CompiledGrammar::cache_stats() const {
  return {cache_bytes_ + pre_stats_.bytes, cache_limit_, cache_.size(), evictions_, full_masks_, text_shortcut_,
          tail_masks_};
}

bool CompiledGrammar::ComputeMask(int32_t state, uint64_t* mask, int32_t* after) {
  after[0] = std::numeric_limits<int32_t>::max();
  after[1] = std::numeric_limits<int32_t>::min();
  const int32_t limit = TextLimit(state);
  const bool shortcut = limit != kNoShortcut;
  if (!shortcut) {
    WalkTrie<true, false>(trie_->all(), state, mask, after, 0);
  } else {
    const uint64_t* text = trie_->text_bits_upto(limit);
    for (size_t w = 0; w < words_; ++w) mask[w] |= text[w];
    // Text tokens of n characters end n steps along the CharTarget chain.
    for (int32_t n = 1, s = state; n <= limit; ++n) {
      s = CharTarget(s);
      if (trie_->text_start(n) > trie_->text_start(n - 1)) {
        after[0] = std::min(after[0], dist_[s]);
        after[1] = std::max(after[1], dist_[s]);
      }
    }
    WalkTrie<true, false>(trie_->rest(), state, mask, after, 0);
  }
  const int32_t eos = trie_->eos();
  if (accepting_[state] && eos >= 0) mask[eos >> 6] |= 1ull << (eos & 63);
  return shortcut;
}

void CompiledGrammar::ComputeTailMask(int32_t state, int32_t limit, uint64_t* mask, bool use_profile) {
  const int32_t chars = TextLimit(state);
  const int32_t profile =
      use_profile && static_cast<size_t>(state) < state_profile_.size() ? state_profile_[state] : -1;
  if (profile >= 0) {
    // The walked tokens, by distance after them: a prefix of the profile fits.
    for (const auto& [rel, tok] : profiles_[profile]) {
      if (dist_[state] + rel > limit) break;
      mask[tok >> 6] |= 1ull << (tok & 63);
    }
  }
  if (chars == kNoShortcut) {
    if (profile < 0) WalkTrie<false, true>(trie_->all(), state, mask, nullptr, limit);
  } else {
    // Text tokens: each run a..b of character counts whose chain state is close enough is one bitset
    // difference (text_bits_upto(b) minus text_bits_upto(a - 1)).
    int32_t run_start = 0;  // 0: not in a run
    auto close_run = [&](int32_t last) {
      const uint64_t* hi = trie_->text_bits_upto(last);
      const uint64_t* lo = trie_->text_bits_upto(run_start - 1);
      for (size_t w = 0; w < words_; ++w) mask[w] |= hi[w] & ~lo[w];
      run_start = 0;
    };
    for (int32_t n = 1, s = state; n <= chars; ++n) {
      s = CharTarget(s);
      const bool fits = dist_[s] <= limit;
      if (fits && !run_start) run_start = n;
      if (!fits && run_start) close_run(n - 1);
    }
    if (run_start) close_run(chars);
    if (profile < 0) WalkTrie<false, true>(trie_->rest(), state, mask, nullptr, limit);
  }
  const int32_t eos = trie_->eos();
  if (accepting_[state] && eos >= 0) mask[eos >> 6] |= 1ull << (eos & 63);
}

std::vector<uint64_t> CompiledGrammar::ComputeMaskForTest(int32_t state, int64_t remaining) {
  std::vector<uint64_t> mask(words_, 0);
  int32_t after[2];
  ComputeMask(state, mask.data(), after);
  // The same decisions as Mask(), by the walk.
  const int64_t limit = std::max<int64_t>(remaining - 1, after[0]);
  if (remaining > dist_[state] + 64 || after[1] <= limit) return mask;
  std::fill(mask.begin(), mask.end(), 0);
  ComputeTailMask(state, static_cast<int32_t>(limit), mask.data(), false);
  return mask;
}

const uint64_t* CompiledGrammar::FullMask(int32_t state) {
  if (static_cast<size_t>(state) < state_mask_.size() && state_mask_[state] >= 0)
    return pre_masks_[state_mask_[state]].get();
  if (Entry* e = Find(Key(kFullMask, state))) return e->bits.get();
  Entry e;
  e.bits = std::make_unique<uint64_t[]>(words_);
  e.bytes = words_ * sizeof(uint64_t);
  uint64_t* mask = e.bits.get();
  std::fill(mask, mask + words_, 0);
  int32_t after[2];
  if (ComputeMask(state, mask, after)) ++text_shortcut_;
  after_min_[state] = after[0];
  after_max_[state] = after[1];
  ++full_masks_;
  return Insert(Key(kFullMask, state), std::move(e)).bits.get();
}

const uint64_t* CompiledGrammar::Mask(int32_t state, int64_t remaining, std::vector<uint64_t>* scratch) {
  (void)scratch;
  AdoptIfReady();
  touched_ = 0;
  const uint64_t* full = FullMask(state);
  // Far from the end of the budget no token can push the shortest completion past it.
  constexpr int64_t kMargin = 64;
  if (remaining > dist_[state] + kMargin) {
    Evict();
    return full;
  }
  // When every allowed token leaves a completion within the budget, the budget mask is the full one.
  // The limit never goes below the least distance after a token, so some token stays allowed.
  const int64_t limit = std::max<int64_t>(remaining - 1, after_min_[state]);
  if (after_max_[state] <= limit) {
    Evict();
    return full;
  }
  // Per (state, limit): the mask of the tokens whose shortest completion fits, cached.
  const uint64_t key = Key(kTailMask, state, static_cast<uint64_t>(std::min<int64_t>(limit, 0xFFFFF)));
  if (Entry* e = Find(key)) {
    Evict();
    return e->bits.get();
  }
  ++tail_masks_;
  Entry e;
  e.bits = std::make_unique<uint64_t[]>(words_);
  e.bytes = words_ * sizeof(uint64_t);
  uint64_t* mask = e.bits.get();
  std::fill(mask, mask + words_, 0);
  ComputeTailMask(state, static_cast<int32_t>(limit), mask);
  const uint64_t* out = Insert(key, std::move(e)).bits.get();
  Evict();
  return out;
}

// ---- grammars by spec ----------------------------------------------------------------------

std::shared_ptr<CompiledGrammar> GrammarCache::Get(const std::string& spec_text) {
  auto it = entries_.find(spec_text);
  if (it != entries_.end()) {
    it->second.second = ++tick_;
    return it->second.first;
  }
  nlohmann::json spec;
  try {
    spec = nlohmann::json::parse(spec_text);
  } catch (const std::exception& e) {
    throw GrammarError(std::string("structured-output spec is not JSON: ") + e.what());
  }
  Nfa nfa = CompileSpec(spec);
  const bool added = spec.value("type", "") == "tool_calls";
  auto& trie = added ? with_added_ : plain_;
  if (!trie) trie = std::make_shared<VocabTrie>(*tokenizer_, vocab_size_, added);
  auto g = std::make_shared<CompiledGrammar>(std::move(nfa), trie, cache_bytes_);
  if (precompute_ == Precompute::kAtCompile) g->Precompute();
  if (precompute_ == Precompute::kBackground) g->PrecomputeInBackground();
  if (entries_.size() >= capacity_) {
    auto oldest = entries_.begin();
    for (auto e = entries_.begin(); e != entries_.end(); ++e)
      if (e->second.second < oldest->second.second) oldest = e;
    entries_.erase(oldest);
  }
  entries_[spec_text] = {g, ++tick_};
  return g;
}

void CheckSpec(const std::string& spec_text) {
  nlohmann::json spec;
  try {
    spec = nlohmann::json::parse(spec_text);
  } catch (const std::exception& e) {
    throw GrammarError(std::string("structured-output spec is not JSON: ") + e.what());
  }
  CompileSpec(spec);
}

}  // namespace dsmesh::structured
