// CompiledGrammar::Precompute: the masks of every DFA state computed when the grammar is compiled (usually on
// a thread of its own, beside the steps: token_grammar.h), so that no step of decoding walks the
// vocabulary once it is done. Costs one trie walk per class of equivalent states; identical masks of
// different classes are stored once, and so are the budget profiles the same walk yields (token_grammar.h).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <limits>
#include <thread>
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

const CompiledGrammar::PrecomputeStats& CompiledGrammar::Precompute(size_t max_states) {
  std::unique_lock<std::mutex> lock(mu_);
  if (pre_stats_.done) return pre_stats_;
  auto t0 = std::chrono::steady_clock::now();
  // Every state reachable from the start. Every byte is a token of the vocabulary, so every state can be
  // the state of some step. One transition per class of equivalent bytes (Step fills the class); one
  // state's transitions per piece under the lock.
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
    if (!Handoff(lock)) return pre_stats_;
  }
  const size_t n = sets_.size();
  pre_stats_.states = n;
  pre_stats_.expand_ms = MsSince(t0);
  // Every state's row of transitions is complete now, so no call adds a state or writes a transition
  // (Step only reads): the DFA (sets_, trans_, accepting_, dist_) stays as it is, and the equivalent
  // states and the trie walks below read it without the lock.
  lock.unlock();

  t0 = std::chrono::steady_clock::now();
  int32_t classes = 0;
  const std::vector<int32_t> cls = EquivalentStates(n, accepting_, trans_.data(), reps, &classes);
  // The states of each class, classes in order of their first state (EquivalentStates numbers them so).
  std::vector<int32_t> class_start(static_cast<size_t>(classes) + 1, 0), members(n);
  for (size_t s = 0; s < n; ++s) ++class_start[cls[s] + 1];
  for (int32_t c = 0; c < classes; ++c) class_start[c + 1] += class_start[c];
  {
    std::vector<int32_t> fill(class_start.begin(), class_start.end() - 1);
    for (size_t s = 0; s < n; ++s) members[fill[cls[s]]++] = static_cast<int32_t>(s);
  }
  const double classes_ms = MsSince(t0);

  // One mask per class, from its first state. Half of the cache bound at most; the rest stays for the
  // lazy path (states left out, budget-tail masks). Per class: its text chain under the lock (TextLimit
  // caches it), the walk without it, then the mask, the profile and the class's states stored under it.
  t0 = std::chrono::steady_clock::now();
  lock.lock();
  if (!Handoff(lock)) return pre_stats_;
  pre_stats_.classes = classes;
  pre_stats_.classes_ms = classes_ms;
  const size_t mask_bytes = words_ * sizeof(uint64_t);
  std::unordered_multimap<uint64_t, int32_t> by_hash;
  std::unique_ptr<uint64_t[]> mask = std::make_unique<uint64_t[]>(words_);
  state_mask_.assign(n, -1);
  state_profile_.assign(n, -1);
  std::unordered_multimap<uint64_t, int32_t> profile_by_hash;
  std::vector<int32_t> walk;  // the walk's scratch (the public calls use walk_states_)
  Profile walked, sorted;
  std::vector<size_t> counts;
  bool all_stored = true;
  for (int32_t c = 0; c < classes; ++c) {
    const int32_t s = members[class_start[c]];
    TextLimit(s);
    lock.unlock();
    std::fill(mask.get(), mask.get() + words_, 0);
    int32_t after[2];
    walked.clear();
    ComputeMask(s, mask.get(), after, &walk, &walked);
    const bool profile = after[1] > after[0] && walked.size() <= kMaxProfileTokens;
    if (profile) {
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
    }
    const uint64_t profile_hash = profile ? HashPairs(walked) : 0;
    const uint64_t h = HashWords(mask.get(), words_);
    lock.lock();
    int32_t p = -1;
    if (profile) {
      for (auto [it, end] = profile_by_hash.equal_range(profile_hash); it != end && p < 0; ++it)
        if (profiles_[it->second] == walked) p = it->second;
      const size_t bytes = walked.size() * sizeof(walked[0]);
      if (p < 0 && pre_stats_.bytes + bytes <= cache_limit_ / 2) {
        p = static_cast<int32_t>(profiles_.size());
        profiles_.push_back(walked);
        profile_by_hash.emplace(profile_hash, p);
        pre_stats_.bytes += bytes;
      }
    }
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
    all_stored &= found >= 0;
    for (int32_t k = class_start[c]; k < class_start[c + 1]; ++k) {
      const int32_t m = members[k];
      state_mask_[m] = found;
      state_profile_[m] = p;
      after_min_[m] = after[0];
      after_max_[m] = after[1];
    }
    if (!Handoff(lock)) return pre_stats_;
  }
  pre_stats_.distinct_masks = pre_masks_.size();
  pre_stats_.profiles = profiles_.size();
  pre_stats_.masks_ms = MsSince(t0);
  pre_stats_.done = all_stored;
  return pre_stats_;
}

bool CompiledGrammar::Handoff(std::unique_lock<std::mutex>& lock) {
  if (waiting_.load(std::memory_order_acquire) > 0) {
    lock.unlock();
    while (waiting_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
    lock.lock();
  }
  return !cancel_.load(std::memory_order_acquire);
}

void CompiledGrammar::PrecomputeInBackground() {
  if (started_) return;
  started_ = true;
  ready_.store(false, std::memory_order_release);
  background_ = std::async(std::launch::async, [this] {
    try {
      Precompute();
    } catch (...) {
      // Out of memory, say: the states without a mask in the table stay lazy.
    }
    ready_.store(true, std::memory_order_release);
  });
}

void CompiledGrammar::WaitForPrecompute() const {
  if (background_.valid()) background_.wait();
}

CompiledGrammar::~CompiledGrammar() {
  cancel_.store(true, std::memory_order_release);
  WaitForPrecompute();
}

}  // namespace dsmesh::structured
