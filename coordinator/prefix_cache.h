// Prefix caching for a model whose per-sequence state is recurrent (DeepSeek-V4's compressors keep
// partial windows), so KV blocks cannot simply be shared between sequences. Instead a worker keeps a
// deep copy of a sequence's whole state taken exactly at a block boundary (a "snapshot"), and a new
// request whose tokens start with that prefix starts from a copy of it. Snapshots are keyed by the
// chained hash of their token blocks (verified token by token), charged to the KV pool like a sequence,
// and evicted least-recently-used when blocks run short.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

namespace dsmesh {

class PrefixCache {
 public:
  explicit PrefixCache(int block_size) : block_size_(block_size) {}

  struct Hit {
    uint64_t snapshot_id;
    int64_t tokens;
  };
  // The longest snapshot whose tokens are a prefix of `tokens` and no longer than `max_len`.
  std::optional<Hit> Lookup(const std::vector<int32_t>& tokens, int64_t max_len);
  bool Contains(const std::vector<int32_t>& tokens, int64_t len) const;
  // Registers a snapshot of tokens[0, len) (len a multiple of the block size).
  void Insert(uint64_t snapshot_id, const std::vector<int32_t>& tokens, int64_t len);
  // Removes and returns the least recently used snapshot not in `pinned`; nullopt when none.
  std::optional<uint64_t> EvictLru(const std::set<uint64_t>& pinned);
  std::vector<uint64_t> Clear();  // all ids
  size_t size() const { return entries_.size(); }
  std::vector<uint64_t> ids() const;

  // Prometheus-style counters, in tokens.
  int64_t queries = 0;
  int64_t hits = 0;

 private:
  struct Entry {
    uint64_t id;
    std::vector<int32_t> tokens;
    uint64_t last_used;
  };
  std::vector<uint64_t> ChainHashes(const std::vector<int32_t>& tokens, int64_t max_len) const;

  int block_size_;
  uint64_t clock_ = 0;
  std::unordered_map<uint64_t, Entry> entries_;  // chained hash -> snapshot
};

}  // namespace dsmesh
