// Byte-pair encoding of one pre-token: start from one symbol per byte, then repeatedly merge the
// adjacent pair with the lowest merge rank (leftmost first on ties) until no pair has a rank. That is
// the rule of HF tokenizers and of the JS reference. Results are cached per pre-token in a per-thread
// table, since natural text repeats the same words constantly.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dsmesh {

// Per-thread cache of pre-token -> ids and reusable buffers, so the hot path does not allocate.
class BpeScratch {
 public:
  BpeScratch();

 private:
  friend class BpeModel;
  // 16-byte slots. Keys of up to 8 bytes live in the slot itself, and so does a single-id value,
  // so the common case (a short word that is one token) costs one memory access.
  struct Slot {
    uint64_t tag = 0;           // the key bytes (zero padded) if key_length <= 8, else its hash
    uint16_t key_length = 0;    // 0 marks an empty slot
    uint16_t value_length = 0;
    uint32_t value = 0;         // the id if inline, else the offset of its record in records_
  };
  // Returns the ids and sets *length, or nullptr.
  const int32_t* Find(std::string_view key, uint32_t* length) const;
  void Insert(std::string_view key, const int32_t* ids, uint32_t length);
  size_t SlotOf(std::string_view key, uint64_t* tag) const;

  std::vector<Slot> slots_;
  size_t used_ = 0;
  // Records of non-inline entries: [key bytes, padded to 4, if key_length > 8][ids].
  std::vector<int32_t> records_;
  // Work buffers of the merge loops.
  std::vector<int32_t> symbols_;
  std::vector<uint32_t> ranks_;
  std::vector<int32_t> prev_, next_, merged_;
  std::vector<uint64_t> heap_;  // MergeLarge's tournament tree
};

class BpeModel {
 public:
  struct Merge {
    int32_t left, right, merged;
  };
  // byte_ids[b]: id of the one-byte token for byte b. merges: in rank order (rank = index).
  BpeModel(const int32_t (&byte_ids)[256], const std::vector<Merge>& merges,
           std::unordered_map<std::string, int32_t> whole_words /* only for ignore_merges */, bool ignore_merges);

  // Appends the ids of pre-token `bytes` to *out.
  void Encode(std::string_view bytes, BpeScratch* scratch, std::vector<int32_t>* out) const;

  size_t merge_count() const { return merge_count_; }

 private:
  static constexpr uint32_t kNoRank = UINT32_MAX;
  struct Entry {
    uint64_t key;  // (left << 32 | right) + 1, so 0 marks an empty slot
    uint32_t rank;
    int32_t merged;
  };

  uint32_t Rank(int32_t left, int32_t right, int32_t* merged) const {
    const uint64_t key = ((uint64_t(uint32_t(left)) << 32) | uint32_t(right)) + 1;
    size_t i = (key * 0x9E3779B97F4A7C15ull) >> shift_;
    while (true) {
      const Entry& e = table_[i];
      if (e.key == key) {
        *merged = e.merged;
        return e.rank;
      }
      if (e.key == 0) return kNoRank;
      i = (i + 1) & mask_;
    }
  }
  void MergeSmall(BpeScratch* s) const;
  void MergeLarge(BpeScratch* s) const;

  int32_t byte_ids_[256];
  std::vector<Entry> table_;
  size_t mask_ = 0;
  int shift_ = 0;
  size_t merge_count_ = 0;
  std::unordered_map<std::string, int32_t> whole_words_;
  bool ignore_merges_;
};

}  // namespace dsmesh
