#include "common/structured/token_grammar.h"

#include <algorithm>
#include <deque>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/structured/schema_compiler.h"

namespace dsmesh::structured {

// ---- vocabulary trie -----------------------------------------------------------------------

VocabTrie::VocabTrie(const Tokenizer& tok, int64_t vocab_size, bool with_added) : vocab_size_(vocab_size) {
  if (tok.eos_id()) eos_ = *tok.eos_id();
  bytes_.resize(vocab_size);
  struct TmpNode {
    std::vector<std::pair<uint8_t, uint32_t>> children;
    int32_t token = -1;
  };
  std::vector<TmpNode> tmp(1);
  std::vector<int32_t> next_same(vocab_size, -1);
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
    uint32_t node = 0;
    for (unsigned char c : b) {
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
    next_same[id] = tmp[node].token;
    tmp[node].token = id;
  }
  // Flatten breadth first, children sorted by byte.
  std::vector<uint32_t> order = {0}, new_index(tmp.size());
  new_index[0] = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    auto& ch = tmp[order[i]].children;
    std::sort(ch.begin(), ch.end());
    for (auto& [byte, idx] : ch) {
      new_index[idx] = static_cast<uint32_t>(order.size());
      order.push_back(idx);
    }
  }
  first_.assign(order.size() + 1, 0);
  node_token_.resize(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const TmpNode& t = tmp[order[i]];
    node_token_[i] = t.token;
    first_[i] = static_cast<uint32_t>(child_node_.size());
    for (auto& [byte, idx] : t.children) {
      child_byte_.push_back(byte);
      child_node_.push_back(new_index[idx]);
    }
  }
  first_[order.size()] = static_cast<uint32_t>(child_node_.size());
  next_same_ = std::move(next_same);
}

// ---- grammar -------------------------------------------------------------------------------

CompiledGrammar::CompiledGrammar(Nfa nfa, std::shared_ptr<const VocabTrie> trie)
    : nfa_(std::move(nfa)), trie_(std::move(trie)), words_((trie_->vocab_size() + 63) / 64) {
  // Fewest bytes from each NFA state to the accepting one: 0-1 BFS over the reversed graph.
  const size_t n = nfa_.size();
  std::vector<std::vector<std::pair<int32_t, int>>> rev(n);
  for (size_t s = 0; s < n; ++s) {
    for (int32_t t : nfa_.states[s].eps) rev[t].push_back({static_cast<int32_t>(s), 0});
    for (const auto& e : nfa_.states[s].edges) rev[e.to].push_back({static_cast<int32_t>(s), 1});
  }
  const int32_t inf = std::numeric_limits<int32_t>::max() / 2;
  nfa_dist_.assign(n, inf);
  std::deque<int32_t> q;
  nfa_dist_[nfa_.accept] = 0;
  q.push_back(nfa_.accept);
  while (!q.empty()) {
    int32_t s = q.front();
    q.pop_front();
    for (auto [p, w] : rev[s]) {
      if (nfa_dist_[s] + w < nfa_dist_[p]) {
        nfa_dist_[p] = nfa_dist_[s] + w;
        if (w == 0) q.push_front(p);
        else q.push_back(p);
      }
    }
  }
  mark_.assign(n, 0);
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

int32_t CompiledGrammar::Intern(std::vector<int32_t> set) {
  if (set.empty()) return -1;
  std::string key(reinterpret_cast<const char*>(set.data()), set.size() * sizeof(int32_t));
  auto it = index_.find(key);
  if (it != index_.end()) return it->second;
  const int32_t id = static_cast<int32_t>(sets_.size());
  index_.emplace(std::move(key), id);
  bool acc = false;
  int32_t d = std::numeric_limits<int32_t>::max() / 2;
  for (int32_t s : set) {
    acc |= s == nfa_.accept;
    d = std::min(d, nfa_dist_[s]);
  }
  accepting_.push_back(acc);
  dist_.push_back(d);
  sets_.push_back(std::move(set));
  trans_.resize(trans_.size() + 256, -2);
  masks_.emplace_back();
  return id;
}

int32_t CompiledGrammar::Next(int32_t state, uint8_t byte) {
  int32_t& slot = trans_[static_cast<size_t>(state) * 256 + byte];
  if (slot != -2) return slot;
  std::vector<int32_t> next;
  for (int32_t s : sets_[state])
    for (const auto& e : nfa_.states[s].edges)
      if (e.lo <= byte && byte <= e.hi) next.push_back(e.to);
  if (!next.empty()) Closure(&next);
  const int32_t id = Intern(std::move(next));
  trans_[static_cast<size_t>(state) * 256 + byte] = id;  // Intern may have grown trans_
  return id;
}

int32_t CompiledGrammar::AdvanceToken(int32_t state, int32_t token) {
  if (token == trie_->eos()) return Accepting(state) ? state : -1;
  if (token < 0 || token >= trie_->vocab_size()) return -1;
  const std::string& b = trie_->bytes(token);
  if (b.empty()) return -1;
  for (unsigned char c : b) {
    state = Next(state, c);
    if (state < 0) return -1;
  }
  return state;
}

const uint64_t* CompiledGrammar::FullMask(int32_t state) {
  if (masks_[state]) return masks_[state].get();
  auto mask = std::make_unique<uint64_t[]>(words_);
  std::fill(mask.get(), mask.get() + words_, 0);
  const VocabTrie& t = *trie_;
  stack_node_.assign(1, 0);
  stack_state_.assign(1, state);
  while (!stack_node_.empty()) {
    const uint32_t node = stack_node_.back();
    const int32_t st = stack_state_.back();
    stack_node_.pop_back();
    stack_state_.pop_back();
    for (uint32_t c = t.first_[node]; c < t.first_[node + 1]; ++c) {
      const int32_t ns = Next(st, t.child_byte_[c]);
      if (ns < 0) continue;
      const uint32_t child = t.child_node_[c];
      for (int32_t tok = t.node_token_[child]; tok >= 0; tok = t.next_same_[tok]) mask[tok >> 6] |= 1ull << (tok & 63);
      if (t.first_[child] != t.first_[child + 1]) {
        stack_node_.push_back(child);
        stack_state_.push_back(ns);
      }
    }
  }
  if (Accepting(state) && t.eos() >= 0) mask[t.eos() >> 6] |= 1ull << (t.eos() & 63);
  masks_[state] = std::move(mask);
  ++cached_;
  return masks_[state].get();
}

const uint64_t* CompiledGrammar::Mask(int32_t state, int64_t remaining, std::vector<uint64_t>* scratch) {
  const uint64_t* full = FullMask(state);
  // Far from the end of the budget no token can push the shortest completion past it.
  constexpr int64_t kMargin = 64;
  if (remaining > Distance(state) + kMargin) return full;
  // Per state, once: every allowed token with the shortest completion after it, sorted; per (state, limit)
  // the mask of tokens whose completion fits, cached.
  auto& sorted = tail_tokens_[state];
  if (sorted.empty()) {
    for (size_t w = 0; w < words_; ++w) {
      uint64_t bits = full[w];
      while (bits) {
        const int32_t tok = static_cast<int32_t>(w * 64 + __builtin_ctzll(bits));
        bits &= bits - 1;
        if (tok == trie_->eos()) continue;
        const int32_t ns = AdvanceToken(state, tok);
        if (ns >= 0) sorted.push_back({Distance(ns), tok});
      }
    }
    std::sort(sorted.begin(), sorted.end());
    if (sorted.empty()) sorted.push_back({std::numeric_limits<int32_t>::max(), -1});
  }
  const int64_t best = sorted.front().first;
  const int64_t limit = std::max<int64_t>(remaining - 1, best);
  const uint64_t key = (static_cast<uint64_t>(state) << 20) | static_cast<uint64_t>(std::min<int64_t>(limit, 0xFFFFF));
  auto& cached = tail_masks_[key];
  if (!cached) {
    cached = std::make_unique<uint64_t[]>(words_);
    std::fill(cached.get(), cached.get() + words_, 0);
    for (auto [d, tok] : sorted) {
      if (d > limit || tok < 0) break;
      cached[tok >> 6] |= 1ull << (tok & 63);
    }
    if (Accepting(state) && trie_->eos() >= 0) cached[trie_->eos() >> 6] |= 1ull << (trie_->eos() & 63);
  }
  (void)scratch;
  return cached.get();
}

// ---- cache ---------------------------------------------------------------------------------

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
  auto g = std::make_shared<CompiledGrammar>(std::move(nfa), trie);
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
