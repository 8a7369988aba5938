// String -> id hash table with the keys in one arena: far fewer allocations than
// std::unordered_map<std::string, int> for the 130k-token vocabularies, which keeps loading fast.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsmesh {

inline uint64_t HashBytes(std::string_view s) {
  auto rotl = [](uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
  uint64_t h = 0x243F6A8885A308D3ull ^ s.size();
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (rotl(h, 5) ^ w) * 0x517CC1B727220A95ull;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  h = (rotl(h, 5) ^ w) * 0x517CC1B727220A95ull;
  h ^= h >> 29;
  return h | 1;  // never 0, which marks empty slots
}

class StringIdTable {
 public:
  explicit StringIdTable(size_t expected = 16) {
    size_t cap = 16;
    while (cap < expected * 2) cap <<= 1;
    slots_.assign(cap, Slot{});
  }

  // Inserts key -> id, replacing the id of an existing equal key.
  void Set(std::string_view key, int32_t id) {
    if ((used_ + 1) * 2 > slots_.size()) Grow();
    const uint64_t h = HashBytes(key);
    Slot* s = Probe(key, h);
    if (s->hash == 0) {
      *s = Slot{h, uint32_t(arena_.size()), uint32_t(key.size()), id};
      arena_.append(key);
      ++used_;
    } else {
      s->id = id;
    }
  }

  std::optional<int32_t> Find(std::string_view key) const { return Find(key, HashBytes(key)); }

  // Batched lookups hide memory latency: hash and Prefetch a group of keys, then Find each.
  void Prefetch(uint64_t hash) const { __builtin_prefetch(&slots_[hash & (slots_.size() - 1)]); }
  std::optional<int32_t> Find(std::string_view key, uint64_t hash) const {
    const Slot* s = const_cast<StringIdTable*>(this)->Probe(key, hash);
    if (s->hash == 0) return std::nullopt;
    return s->id;
  }

  size_t size() const { return used_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0, length = 0;
    int32_t id = 0;
  };
  Slot* Probe(std::string_view key, uint64_t h) {
    const size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.hash == 0) return &s;
      if (s.hash == h && s.length == key.size() && std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0)
        return &s;
    }
  }
  void Grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.size() * 2, Slot{});
    const size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.hash == 0) continue;
      size_t i = s.hash & mask;
      while (slots_[i].hash != 0) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  size_t used_ = 0;
  std::string arena_;
};

}  // namespace dsmesh
