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
constexpr size_t kCacheMaxRecordWords = 4 << 20;

}  // namespace

BpeScratch::BpeScratch() : slots_(kCacheSlots) {}

size_t BpeScratch::SlotOf(std::string_view key, uint64_t* tag) const {
  uint64_t h;
  if (key.size() <= 8) {
    *tag = 0;
    std::memcpy(tag, key.data(), key.size());
    h = (*tag ^ (uint64_t(key.size()) << 59)) * 0x9E3779B97F4A7C15ull;
  } else {
    *tag = HashBytes(key);
    h = *tag * 0x9E3779B97F4A7C15ull;
  }
  return h >> (64 - __builtin_ctzll(slots_.size()));
}

const int32_t* BpeScratch::Find(std::string_view key, uint32_t* length) const {
  uint64_t tag;
  const size_t mask = slots_.size() - 1;
  for (size_t i = SlotOf(key, &tag);; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.key_length == 0) return nullptr;
    if (s.tag != tag || s.key_length != key.size()) continue;
    *length = s.value_length;
    if (key.size() <= 8) return s.value_length == 1 ? reinterpret_cast<const int32_t*>(&s.value) : &records_[s.value];
    const int32_t* record = &records_[s.value];
    if (std::memcmp(record, key.data(), key.size()) == 0) return record + (key.size() + 3) / 4;
  }
}

void BpeScratch::Insert(std::string_view key, const int32_t* ids, uint32_t length) {
  if (used_ >= kCacheMaxEntries || records_.size() > kCacheMaxRecordWords) {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    used_ = 0;
    records_.clear();
  }
  uint64_t tag;
  const size_t mask = slots_.size() - 1;
  size_t i = SlotOf(key, &tag);
  while (slots_[i].key_length != 0) i = (i + 1) & mask;
  Slot& s = slots_[i];
  s.tag = tag;
  s.key_length = uint16_t(key.size());
  s.value_length = uint16_t(length);
  if (key.size() <= 8 && length == 1) {
    s.value = uint32_t(ids[0]);
  } else {
    s.value = uint32_t(records_.size());
    if (key.size() > 8) {
      const size_t words = (key.size() + 3) / 4;
      records_.resize(records_.size() + words, 0);
      std::memcpy(&records_[s.value], key.data(), key.size());
    }
    records_.insert(records_.end(), ids, ids + length);
  }
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
  std::vector<int32_t>& merged = s->merged_;
  size_t n = sym.size();
  rank.resize(n);
  merged.resize(n);
  for (size_t i = 0; i + 1 < n; ++i) rank[i] = Rank(sym[i], sym[i + 1], &merged[i]);
  while (n > 1) {
    size_t best = 0;
    uint32_t best_rank = rank[0];
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < best_rank) best_rank = rank[i], best = i;
    if (best_rank == kNoRank) break;
    sym[best] = merged[best];
    const size_t tail = n - best - 2;
    std::memmove(&sym[best + 1], &sym[best + 2], tail * sizeof(int32_t));
    std::memmove(&rank[best + 1], &rank[best + 2], tail * sizeof(uint32_t));
    std::memmove(&merged[best + 1], &merged[best + 2], tail * sizeof(int32_t));
    --n;
    if (best > 0) rank[best - 1] = Rank(sym[best - 1], sym[best], &merged[best - 1]);
    if (best + 1 < n) rank[best] = Rank(sym[best], sym[best + 1], &merged[best]);
  }
  sym.resize(n);
}

// O(n log n) for long pre-tokens: a tournament tree over symbol positions holds, for each live
// symbol, (rank of the pair it starts) << 32 | position, so the root is the lowest rank and, among
// equal ranks, the leftmost pair. A merge updates three leaves; nothing goes stale.
void BpeModel::MergeLarge(BpeScratch* s) const {
  std::vector<int32_t>& sym = s->symbols_;
  const size_t n = sym.size();
  std::vector<int32_t>& prev = s->prev_;
  std::vector<int32_t>& next = s->next_;
  std::vector<int32_t>& merged_id = s->merged_;
  std::vector<uint64_t>& tree = s->heap_;
  size_t m = 1;
  while (m < n) m <<= 1;
  prev.resize(n);
  next.resize(n);
  merged_id.resize(n);
  tree.assign(2 * m, UINT64_MAX);
  auto key = [&](int32_t pos) -> uint64_t {
    if (pos < 0 || next[pos] < 0) return UINT64_MAX;
    const uint32_t r = Rank(sym[pos], sym[next[pos]], &merged_id[pos]);
    return r == kNoRank ? UINT64_MAX : (uint64_t(r) << 32) | uint32_t(pos);
  };
  auto update = [&](int32_t pos, uint64_t v) {
    size_t k = m + size_t(pos);
    tree[k] = v;
    for (k >>= 1; k >= 1; k >>= 1) {
      const uint64_t best = std::min(tree[2 * k], tree[2 * k + 1]);
      if (tree[k] == best) break;  // nothing above changes either
      tree[k] = best;
    }
  };
  for (size_t i = 0; i < n; ++i) {
    prev[i] = int32_t(i) - 1;
    next[i] = i + 1 < n ? int32_t(i + 1) : -1;
  }
  for (size_t i = 0; i < n; ++i) tree[m + i] = key(int32_t(i));
  for (size_t k = m - 1; k >= 1; --k) tree[k] = std::min(tree[2 * k], tree[2 * k + 1]);
  while (tree[1] != UINT64_MAX) {
    const int32_t pos = int32_t(tree[1] & 0xFFFFFFFFu);
    const int32_t right = next[pos];
    sym[pos] = merged_id[pos];
    sym[right] = -1;
    next[pos] = next[right];
    if (next[pos] >= 0) prev[next[pos]] = pos;
    update(right, UINT64_MAX);
    update(pos, key(pos));
    if (prev[pos] >= 0) update(prev[pos], key(prev[pos]));
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
  if (cacheable) {
    uint32_t length;
    if (const int32_t* ids = s->Find(bytes, &length)) {
      if (length == 1) {
        out->push_back(ids[0]);
      } else {
        out->insert(out->end(), ids, ids + length);
      }
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
  if (cacheable) s->Insert(bytes, sym.data(), uint32_t(sym.size()));
  out->insert(out->end(), sym.begin(), sym.end());
}

}  // namespace dsmesh
