#include "coordinator/prefix_cache.h"

#include <algorithm>

namespace dsmesh {

std::vector<uint64_t> PrefixCache::ChainHashes(const std::vector<int32_t>& tokens, int64_t max_len) const {
  std::vector<uint64_t> out;
  uint64_t h = 0xcbf29ce484222325ull;
  const int64_t n = std::min<int64_t>(max_len, tokens.size()) / block_size_;
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t i = b * block_size_; i < (b + 1) * block_size_; ++i) {
      h ^= static_cast<uint32_t>(tokens[i]);
      h *= 0x100000001b3ull;
      h ^= h >> 29;
    }
    out.push_back(h);
  }
  return out;
}

std::optional<PrefixCache::Hit> PrefixCache::Lookup(const std::vector<int32_t>& tokens, int64_t max_len) {
  auto hashes = ChainHashes(tokens, max_len);
  for (int64_t b = static_cast<int64_t>(hashes.size()) - 1; b >= 0; --b) {
    auto it = entries_.find(hashes[b]);
    if (it == entries_.end()) continue;
    const auto& e = it->second;
    const int64_t len = (b + 1) * block_size_;
    if (static_cast<int64_t>(e.tokens.size()) != len || !std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin()))
      continue;  // hash collision
    it->second.last_used = ++clock_;
    return Hit{e.id, len};
  }
  return std::nullopt;
}

bool PrefixCache::Contains(const std::vector<int32_t>& tokens, int64_t len) const {
  auto hashes = ChainHashes(tokens, len);
  if (hashes.empty() || static_cast<int64_t>(hashes.size()) * block_size_ != len) return false;
  auto it = entries_.find(hashes.back());
  return it != entries_.end() && std::equal(it->second.tokens.begin(), it->second.tokens.end(), tokens.begin());
}

void PrefixCache::Insert(uint64_t snapshot_id, const std::vector<int32_t>& tokens, int64_t len) {
  auto hashes = ChainHashes(tokens, len);
  entries_[hashes.back()] = Entry{snapshot_id, std::vector<int32_t>(tokens.begin(), tokens.begin() + len), ++clock_};
}

std::optional<uint64_t> PrefixCache::EvictLru(const std::set<uint64_t>& pinned) {
  auto victim = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (!pinned.count(it->second.id) && (victim == entries_.end() || it->second.last_used < victim->second.last_used))
      victim = it;
  if (victim == entries_.end()) return std::nullopt;
  uint64_t id = victim->second.id;
  entries_.erase(victim);
  return id;
}

std::vector<uint64_t> PrefixCache::ids() const {
  std::vector<uint64_t> out;
  for (const auto& [h, e] : entries_) out.push_back(e.id);
  return out;
}

std::vector<uint64_t> PrefixCache::Clear() {
  std::vector<uint64_t> ids;
  for (const auto& [h, e] : entries_) ids.push_back(e.id);
  entries_.clear();
  return ids;
}

}  // namespace dsmesh
