#include "common/tokenizer/bpe.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "common/tokenizer/string_id_table.h"

namespace dsmesh {
namespace {

// Pre-tokens longer than this are not cached (they rarely repeat) and use the heap-based merge loop.
constexpr size_t kMaxCachedLength = 256;
constexpr size_t kSmallWord = 64;
// The cache is dropped and rebuilt when it holds this many entries or key bytes.
constexpr size_t kCacheSlots = 1 << 18;
constexpr size_t kCacheMaxEntries = kCacheSlots / 2;
constexpr size_t kCacheMaxKeyBytes = 8 << 20;

}  // namespace

BpeScratch::BpeScratch() : slots_(kCacheSlots) {}

const int32_t* BpeScratch::Find(std::string_view key, uint64_t hash, uint32_t* length) const {
  size_t i = hash & (slots_.size() - 1);
  while (true) {
    const Slot& s = slots_[i];
    if (s.hash == 0) return nullptr;
    if (s.hash == hash && s.key_length == key.size() && std::memcmp(keys_.data() + s.key_offset, key.data(), key.size()) == 0) {
      *length = s.value_length;
      return values_.data() + s.value_offset;
    }
    i = (i + 1) & (slots_.size() - 1);
  }
}

void BpeScratch::Insert(std::string_view key, uint64_t hash, const int32_t* ids, uint32_t length) {
  if (used_ >= kCacheMaxEntries || keys_.size() + key.size() > kCacheMaxKeyBytes) {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    used_ = 0;
    keys_.clear();
    values_.clear();
  }
  size_t i = hash & (slots_.size() - 1);
  while (slots_[i].hash != 0) i = (i + 1) & (slots_.size() - 1);
  slots_[i] = Slot{hash, uint32_t(keys_.size()), uint32_t(key.size()), uint32_t(values_.size()), length};
  keys_.append(key);
  values_.insert(values_.end(), ids, ids + length);
  ++used_;
}

BpeModel::BpeModel(const int32_t (&byte_ids)[256], const std::vector<Merge>& merges,
                   std::unordered_map<std::string, int32_t> whole_words, bool ignore_merges)
    : whole_words_(std::move(whole_words)), ignore_merges_(ignore_merges) {
  std::memcpy(byte_ids_, byte_ids, sizeof(byte_ids_));
  size_t capacity = 16;
  while (capacity < merges.size() * 2) capacity <<= 1;
  table_.assign(capacity, Entry{0, 0, 0});
  mask_ = capacity - 1;
  shift_ = 64 - __builtin_ctzll(capacity);
  for (size_t r = 0; r < merges.size(); ++r) {
    const Merge& m = merges[r];
    const uint64_t key = ((uint64_t(uint32_t(m.left)) << 32) | uint32_t(m.right)) + 1;
    size_t i = (key * 0x9E3779B97F4A7C15ull) >> shift_;
    while (table_[i].key != 0 && table_[i].key != key) i = (i + 1) & mask_;
    if (table_[i].key == key) continue;  // a repeated pair keeps its first (lowest) rank
    table_[i] = Entry{key, uint32_t(r), m.merged};
    ++merge_count_;
  }
}

// O(n^2) in the worst case but with tiny constants: fine for the short words that dominate text.
void BpeModel::MergeSmall(BpeScratch* s) const {
  std::vector<int32_t>& sym = s->symbols_;
  std::vector<uint32_t>& rank = s->ranks_;
  size_t n = sym.size();
  rank.resize(n);
  int32_t merged = -1;
  for (size_t i = 0; i + 1 < n; ++i) rank[i] = Rank(sym[i], sym[i + 1], &merged);
  while (n > 1) {
    size_t best = 0;
    uint32_t best_rank = rank[0];
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < best_rank) best_rank = rank[i], best = i;
    if (best_rank == kNoRank) break;
    Rank(sym[best], sym[best + 1], &merged);
    sym[best] = merged;
    std::memmove(&sym[best + 1], &sym[best + 2], (n - best - 2) * sizeof(int32_t));
    std::memmove(&rank[best + 1], &rank[best + 2], (n - best - 2) * sizeof(uint32_t));
    --n;
    if (best > 0) rank[best - 1] = Rank(sym[best - 1], sym[best], &merged);
    if (best + 1 < n) rank[best] = Rank(sym[best], sym[best + 1], &merged);
  }
  sym.resize(n);
}

// O(n log n): a min-heap of (rank, position) over a linked list of symbols, with stale entries
// skipped on pop. Positions are the original byte offsets, so "lower position" = "further left".
void BpeModel::MergeLarge(BpeScratch* s) const {
  std::vector<int32_t>& sym = s->symbols_;
  const size_t n = sym.size();
  std::vector<int32_t>& prev = s->prev_;
  std::vector<int32_t>& next = s->next_;
  std::vector<uint64_t>& heap = s->heap_;  // (rank << 32 | position), min-heap
  prev.resize(n);
  next.resize(n);
  heap.clear();
  for (size_t i = 0; i < n; ++i) {
    prev[i] = int32_t(i) - 1;
    next[i] = i + 1 < n ? int32_t(i + 1) : -1;
  }
  int32_t merged = -1;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    const uint32_t r = Rank(sym[pos], sym[next[pos]], &merged);
    if (r == kNoRank) return;
    heap.push_back((uint64_t(r) << 32) | uint32_t(pos));
    std::push_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
  };
  for (size_t i = 0; i + 1 < n; ++i) push(int32_t(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
    const uint64_t top = heap.back();
    heap.pop_back();
    const uint32_t r = uint32_t(top >> 32);
    const int32_t pos = int32_t(top & 0xFFFFFFFFu);
    if (sym[pos] < 0 || next[pos] < 0) continue;  // merged away, or now the last symbol
    const int32_t right = next[pos];
    // A rank names exactly one pair, so an equal rank means this entry still describes the pair here.
    if (Rank(sym[pos], sym[right], &merged) != r) continue;
    sym[pos] = merged;
    sym[right] = -1;
    next[pos] = next[right];
    if (next[pos] >= 0) prev[next[pos]] = pos;
    push(prev[pos]);
    push(pos);
  }
  size_t k = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) sym[k++] = sym[i];
  sym.resize(k);
}

void BpeModel::Encode(std::string_view bytes, BpeScratch* s, std::vector<int32_t>* out) const {
  if (bytes.size() == 1) {
    out->push_back(byte_ids_[static_cast<unsigned char>(bytes[0])]);
    return;
  }
  if (bytes.empty()) return;
  if (ignore_merges_) {
    const auto it = whole_words_.find(std::string(bytes));
    if (it != whole_words_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const bool cacheable = bytes.size() <= kMaxCachedLength;
  uint64_t hash = 0;
  if (cacheable) {
    hash = HashBytes(bytes);
    uint32_t length;
    if (const int32_t* ids = s->Find(bytes, hash, &length)) {
      out->insert(out->end(), ids, ids + length);
      return;
    }
  }
  std::vector<int32_t>& sym = s->symbols_;
  sym.resize(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) sym[i] = byte_ids_[static_cast<unsigned char>(bytes[i])];
  if (bytes.size() <= kSmallWord) {
    MergeSmall(s);
  } else {
    MergeLarge(s);
  }
  if (cacheable) s->Insert(bytes, hash, sym.data(), uint32_t(sym.size()));
  out->insert(out->end(), sym.begin(), sym.end());
}

}  // namespace dsmesh
