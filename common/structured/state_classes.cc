#include "common/structured/state_classes.h"

#include <cstring>

namespace dsmesh::structured {
namespace {

uint64_t HashRow(const int32_t* row, size_t width) {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < width; ++i) {
    h ^= static_cast<uint32_t>(row[i]);
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  return h;
}

}  // namespace

std::vector<int32_t> EquivalentStates(size_t n, const std::vector<char>& accepting, const int32_t* trans,
                                      const std::vector<uint8_t>& reps, int32_t* num_classes) {
  std::vector<int32_t> cls(n), next(n);
  int32_t count = 0;
  {
    int32_t id[2] = {-1, -1};
    for (size_t s = 0; s < n; ++s) {
      int32_t& c = id[accepting[s] ? 1 : 0];
      if (c < 0) c = count++;
      cls[s] = c;
    }
  }
  // Each round a state's signature is (its class, the class after each representative byte); states with
  // equal signatures stay together. The partition only gets finer, so an unchanged count means stable.
  // Signatures go into an open-addressing table keyed by a hash and compared in full on a hit (exact).
  const size_t width = reps.size() + 1;
  std::vector<int32_t> sig(n * width);
  // The transitions on the representative bytes, gathered once: the rounds then read n x width int32s
  // in order instead of a scattered 1 KiB row per state (most of the time went into those cache misses).
  std::vector<int32_t> compact(n * reps.size());
  for (size_t s = 0; s < n; ++s)
    for (size_t k = 0; k < reps.size(); ++k) compact[s * reps.size() + k] = trans[s * 256 + reps[k]];
  size_t slots = 16;
  while (slots < 2 * n) slots *= 2;
  std::vector<int32_t> table(slots);       // class id + 1 (0: empty)
  std::vector<int32_t> first;              // a state of each new class (its signature)
  std::vector<uint64_t> class_hash;
  for (;;) {
    for (size_t s = 0; s < n; ++s) {
      int32_t* row = &sig[s * width];
      row[0] = cls[s];
      const int32_t* t = &compact[s * reps.size()];
      for (size_t k = 0; k < reps.size(); ++k) row[k + 1] = t[k] < 0 ? -1 : cls[t[k]];
    }
    std::fill(table.begin(), table.end(), 0);
    first.clear();
    class_hash.clear();
    for (size_t s = 0; s < n; ++s) {
      const int32_t* row = &sig[s * width];
      const uint64_t h = HashRow(row, width);
      for (size_t slot = h & (slots - 1);; slot = (slot + 1) & (slots - 1)) {
        const int32_t c = table[slot] - 1;
        if (c < 0) {
          table[slot] = static_cast<int32_t>(first.size()) + 1;
          next[s] = static_cast<int32_t>(first.size());
          first.push_back(static_cast<int32_t>(s));
          class_hash.push_back(h);
          break;
        }
        if (class_hash[c] == h && std::memcmp(&sig[first[c] * width], row, width * sizeof(int32_t)) == 0) {
          next[s] = c;
          break;
        }
      }
    }
    cls.swap(next);
    const int32_t refined = static_cast<int32_t>(first.size());
    if (refined == count) break;
    count = refined;
  }
  *num_classes = count;
  return cls;
}

}  // namespace dsmesh::structured
