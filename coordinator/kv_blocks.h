// KV memory bookkeeping in fixed-size blocks. The coordinator owns every block table; workers hold the
// memory. A DeepSeek-V4 sequence state has a length-proportional part (compressed entries, indexer keys)
// and a fixed part (sliding-window ring, compressors' partial windows); the fixed part is charged as a
// whole number of blocks per state, so "capacity in tokens" is exact for a given memory budget.
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
};

struct KvGeometry {
  int block_size = 16;         // tokens per block
  int64_t num_blocks = 0;      // pool size (the tightest rank decides)
  int64_t fixed_blocks = 0;    // charged once per live sequence state or snapshot
  int64_t bytes_per_block = 0;
  int64_t pool_tokens() const { return num_blocks * block_size; }
  // Tokens the pool holds when `seqs` sequences each pay their fixed part.
  int64_t tokens_with_seqs(int seqs) const;
  std::string Describe(int max_num_seqs) const;  // the "KV cache size: N tokens" line
};

// Throws std::runtime_error when the budget cannot hold even one block plus a fixed part.
KvGeometry PlanKvGeometry(const std::vector<RankKvCapacity>& ranks, int block_size);

class KvBlocks {
 public:
  explicit KvBlocks(const KvGeometry& g);

  // Blocks a state of `tokens` tokens needs (fixed part included).
  int64_t BlocksFor(int64_t tokens) const;
  // Grows owner's table to hold `tokens` tokens. Returns false, changing nothing, when short of blocks.
  bool Grow(uint64_t owner, int64_t tokens);
  void Release(uint64_t owner);
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return geometry_.num_blocks - free_blocks(); }
  const std::vector<int32_t>& table(uint64_t owner) const;
  const KvGeometry& geometry() const { return geometry_; }

 private:
  KvGeometry geometry_;
  std::vector<int32_t> free_;
  std::map<uint64_t, std::vector<int32_t>> tables_;
};

}  // namespace dsmesh
