// KV memory bookkeeping in fixed-size blocks. The coordinator owns every block table; workers hold the
// memory (model/state_pool.h) and use the tables they are sent. A DeepSeek-V4 sequence state has a
// length-proportional part (compressed entries, indexer keys: blocks) and a fixed part (sliding-window
// ring, compressors' partial windows): one of the workers' preallocated state slots, or, for a geometry
// without slots, a whole number of blocks per state. Blocks may be shared (a prefix snapshot and the
// sequences restored from it list the same blocks); a block is free when no table lists it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dsmesh {

// What one rank reports after loading (WorkerReady).
struct RankKvCapacity {
  int64_t budget_bytes = 0;
  int64_t bytes_per_token = 0;
  int64_t fixed_bytes = 0;
  // The rank's state pool as allocated (0 when it reports only a budget).
  int64_t pool_blocks = 0;
  int block_tokens = 0;
  int state_slots = 0;
  int64_t block_bytes = 0;
};

struct KvGeometry {
  int block_size = 16;         // tokens per block
  int64_t num_blocks = 0;      // pool size (the tightest rank decides)
  int64_t fixed_blocks = 0;    // charged once per live sequence state or snapshot (0 with slots)
  int64_t bytes_per_block = 0;
  int num_slots = 0;           // state slots (live sequences + snapshots); 0: no slot limit
  int64_t pool_tokens() const { return num_blocks * block_size; }
  // Tokens the pool holds when `seqs` sequences each pay their fixed part.
  int64_t tokens_with_seqs(int seqs) const;
  std::string Describe(int max_num_seqs) const;  // the "KV cache size: N tokens" line
};

// State slots the workers' pools keep for `max_num_seqs` running sequences and their prefix snapshots.
inline int StateSlotsFor(int max_num_seqs) { return max_num_seqs + (max_num_seqs > 8 ? max_num_seqs : 8); }

// Throws std::runtime_error when the budget cannot hold even one block plus a fixed part. Ranks that
// report their state pool decide the geometry themselves (block_size is then theirs, and every rank must
// agree on it); the others are planned from their budget in blocks of `block_size`.
KvGeometry PlanKvGeometry(const std::vector<RankKvCapacity>& ranks, int block_size);

class KvBlocks {
 public:
  explicit KvBlocks(const KvGeometry& g);

  // Blocks a state of `tokens` tokens needs (fixed part included).
  int64_t BlocksFor(int64_t tokens) const;
  // Grows owner's table to hold `tokens` tokens (a new owner also takes a slot). Returns false, changing
  // nothing, when short of blocks or slots.
  bool Grow(uint64_t owner, int64_t tokens);
  // A new owner whose table starts with the first `blocks` blocks of `from`'s (shared, not copied).
  // Returns false, changing nothing, when no slot is free.
  bool Share(uint64_t owner, uint64_t from, int64_t blocks);
  void Release(uint64_t owner);
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return geometry_.num_blocks - free_blocks(); }
  int free_slots() const { return static_cast<int>(free_slots_.size()); }
  // Distinct blocks the tables of `owners` list.
  int64_t BlocksOf(const std::vector<uint64_t>& owners) const;
  const std::vector<int32_t>& table(uint64_t owner) const;
  int slot(uint64_t owner) const;  // -1 without slots or for an unknown owner
  const KvGeometry& geometry() const { return geometry_; }

 private:
  bool TakeSlot(uint64_t owner);
  KvGeometry geometry_;
  std::vector<int32_t> free_;
  std::vector<int> refs_;       // tables listing each block
  std::vector<int> free_slots_;
  std::map<uint64_t, std::vector<int32_t>> tables_;
  std::map<uint64_t, int> slots_;
};

}  // namespace dsmesh
