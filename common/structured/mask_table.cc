// CompiledGrammar::Precompute: the masks of every DFA state computed when the grammar is compiled (usually on
// a thread of its own, beside the steps: PrecomputeInBackground), so that no step of decoding walks the
// vocabulary once it is done. Costs one trie walk per class of equivalent states; identical masks of
// different classes are stored once, and so are the budget profiles the same walk yields (token_grammar.h).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <limits>
#include <unordered_map>

#include "common/structured/state_classes.h"
#include "common/structured/token_grammar.h"

namespace dsmesh::structured {
namespace {

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t HashWords(const uint64_t* w, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ w[i]) * 0xBF58476D1CE4E5B9ull + (h >> 29);
  return h;
}

uint64_t HashPairs(const std::vector<std::pair<int32_t, int32_t>>& v) {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (const auto& [a, b] : v) {
    const uint64_t w = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull + (h >> 29);
  }
  return h;
}

}  // namespace

const CompiledGrammar::PrecomputeStats& CompiledGrammar::Precompute(size_t max_states,
                                                                    const std::atomic<bool>* cancel) {
  if (pre_stats_.done) return pre_stats_;
  auto cancelled = [&] { return cancel && cancel->load(std::memory_order_relaxed); };
  auto t0 = std::chrono::steady_clock::now();
  // Every state reachable from the start. Every byte is a token of the vocabulary, so every state can be
  // the state of some step. One transition per class of equivalent bytes (Step fills the class).
  std::vector<uint8_t> reps;
  for (const auto& bytes : class_bytes_) reps.push_back(bytes.front());
  pre_stats_.byte_classes = reps.size();
  for (size_t s = 0; s < sets_.size(); ++s) {
    if (sets_.size() > max_states) {
      pre_stats_.states = sets_.size();
      pre_stats_.expand_ms = MsSince(t0);
      return pre_stats_;  // too big to precompute: stays lazy
    }
    for (uint8_t b : reps) Step(static_cast<int32_t>(s), b);
    if (cancelled()) return pre_stats_;
  }
  const size_t n = sets_.size();
  pre_stats_.states = n;
  pre_stats_.expand_ms = MsSince(t0);

  t0 = std::chrono::steady_clock::now();
  int32_t classes = 0;
  const std::vector<int32_t> cls = EquivalentStates(n, accepting_, trans_.data(), reps, &classes);
  pre_stats_.classes = classes;
  pre_stats_.classes_ms = MsSince(t0);

  // One mask per class, from its first state. Half of the cache bound at most; the rest stays for the
  // lazy path (states left out, budget-tail masks).
  t0 = std::chrono::steady_clock::now();
  const size_t mask_bytes = words_ * sizeof(uint64_t);
  std::vector<int32_t> class_mask(classes, -2);  // -2: not computed yet, -1: over the bound (lazy)
  std::vector<int32_t> class_after(2 * static_cast<size_t>(classes));
  std::unordered_multimap<uint64_t, int32_t> by_hash;
  std::unique_ptr<uint64_t[]> mask = std::make_unique<uint64_t[]>(words_);
  state_mask_.assign(n, -1);
  state_profile_.assign(n, -1);
  std::vector<int32_t> class_profile(classes, -1);
  std::unordered_multimap<uint64_t, int32_t> profile_by_hash;
  std::vector<std::pair<int32_t, int32_t>> walked, sorted;
  std::vector<size_t> counts;
  for (size_t s = 0; s < n; ++s) {
    const int32_t c = cls[s];
    if (class_mask[c] == -2) {
      std::fill(mask.get(), mask.get() + words_, 0);
      int32_t after[2];
      if (cancelled()) return pre_stats_;
      walked.clear();
      collect_ = &walked;
      ComputeMask(static_cast<int32_t>(s), mask.get(), after);
      collect_ = nullptr;
      if (after[1] > after[0] && walked.size() <= kMaxProfileTokens) {
        // Tokens end at different distances: budget masks will be needed; keep the walked tokens.
        // Counting sort by distance (a small range), walk order kept within one distance: a comparison
        // sort of thousands of pairs per class was most of the precomputation.
        const int32_t lo = after[0], range = after[1] - after[0] + 1;
        counts.assign(static_cast<size_t>(range) + 1, 0);
        for (const auto& [d, tok] : walked) ++counts[d - lo + 1];
        for (int32_t r = 0; r < range; ++r) counts[r + 1] += counts[r];
        sorted.resize(walked.size());
        for (const auto& [d, tok] : walked) sorted[counts[d - lo]++] = {d - dist_[s], tok};
        walked.swap(sorted);
        const uint64_t h = HashPairs(walked);
        int32_t p = -1;
        for (auto [it, end] = profile_by_hash.equal_range(h); it != end && p < 0; ++it)
          if (profiles_[it->second] == walked) p = it->second;
        const size_t bytes = walked.size() * sizeof(walked[0]);
        if (p < 0 && pre_stats_.bytes + bytes <= cache_limit_ / 2) {
          p = static_cast<int32_t>(profiles_.size());
          profiles_.push_back(walked);
          profile_by_hash.emplace(h, p);
          pre_stats_.bytes += bytes;
        }
        class_profile[c] = p;
      }
      class_after[2 * c] = after[0];
      class_after[2 * c + 1] = after[1];
      const uint64_t h = HashWords(mask.get(), words_);
      int32_t found = -1;
      for (auto [it, end] = by_hash.equal_range(h); it != end && found < 0; ++it)
        if (std::memcmp(pre_masks_[it->second].get(), mask.get(), mask_bytes) == 0) found = it->second;
      if (found < 0 && pre_stats_.bytes + mask_bytes <= cache_limit_ / 2) {
        found = static_cast<int32_t>(pre_masks_.size());
        pre_masks_.push_back(std::move(mask));
        mask = std::make_unique<uint64_t[]>(words_);
        by_hash.emplace(h, found);
        pre_stats_.bytes += mask_bytes;
      }
      class_mask[c] = found;
    }
    state_mask_[s] = class_mask[c];
    state_profile_[s] = class_profile[c];
    after_min_[s] = class_after[2 * c];
    after_max_[s] = class_after[2 * c + 1];
  }
  pre_stats_.distinct_masks = pre_masks_.size();
  pre_stats_.profiles = profiles_.size();
  pre_stats_.masks_ms = MsSince(t0);
  pre_stats_.done = std::find(class_mask.begin(), class_mask.end(), -1) == class_mask.end();
  return pre_stats_;
}

void CompiledGrammar::PrecomputeInBackground() {
  if (started_) return;
  started_ = true;
  background_ = std::async(std::launch::async, [this] {
    // Reads only what does not change after construction (nfa_, trie_, cache_limit_) and writes only
    // table_, published by ready_.
    auto table = std::make_unique<Table>();
    try {
      CompiledGrammar builder(nfa_, trie_, cache_limit_);
      builder.Precompute(kMaxPrecomputeStates, &cancel_);
      table->stats = builder.pre_stats_;
      table->index = std::move(builder.index_);
      table->mask = std::move(builder.state_mask_);
      table->profile = std::move(builder.state_profile_);
      table->after_min = std::move(builder.after_min_);
      table->after_max = std::move(builder.after_max_);
      table->masks = std::move(builder.pre_masks_);
      table->profiles = std::move(builder.profiles_);
    } catch (...) {
      // Out of memory, say: no table, the masks stay lazy.
      table = std::make_unique<Table>();
    }
    table_ = std::move(table);
    ready_.store(true, std::memory_order_release);
  });
}

void CompiledGrammar::Adopt() {
  adopted_ = true;
  pre_stats_ = table_->stats;
  pre_masks_ = std::move(table_->masks);
  profiles_ = std::move(table_->profiles);
  state_mask_.assign(sets_.size(), -1);
  state_profile_.assign(sets_.size(), -1);
  for (size_t s = 0; s < sets_.size(); ++s) {
    const std::vector<int32_t>& set = sets_[s];
    MapState(static_cast<int32_t>(s), std::string(reinterpret_cast<const char*>(set.data()), set.size() * sizeof(int32_t)));
  }
}

void CompiledGrammar::MapState(int32_t s, const std::string& key) {
  auto it = table_->index.find(key);
  if (it == table_->index.end()) return;  // not built by the precomputation (it stopped early): lazy
  const size_t t = static_cast<size_t>(it->second);
  if (t < table_->profile.size()) state_profile_[s] = table_->profile[t];
  if (t < table_->mask.size() && table_->mask[t] >= 0) {
    state_mask_[s] = table_->mask[t];
    after_min_[s] = table_->after_min[t];
    after_max_[s] = table_->after_max[t];
  }
}

void CompiledGrammar::WaitForPrecompute() const {
  if (background_.valid()) background_.wait();
}

CompiledGrammar::~CompiledGrammar() {
  cancel_.store(true, std::memory_order_relaxed);
  WaitForPrecompute();
}

}  // namespace dsmesh::structured
