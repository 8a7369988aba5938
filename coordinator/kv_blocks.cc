#include "coordinator/kv_blocks.h"

#include <algorithm>
#include <stdexcept>

namespace dsmesh {
namespace {
int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

int64_t KvGeometry::tokens_with_seqs(int seqs) const {
  return std::max<int64_t>(0, num_blocks - fixed_blocks * seqs) * block_size;
}

std::string KvGeometry::Describe(int max_num_seqs) const {
  return "KV cache size: " + std::to_string(pool_tokens()) + " tokens (" + std::to_string(num_blocks) +
         " blocks of " + std::to_string(block_size) + " tokens, " + std::to_string(bytes_per_block) +
         " bytes/block/rank; each sequence state also holds " + std::to_string(fixed_blocks) +
         " blocks of fixed state, so " + std::to_string(tokens_with_seqs(max_num_seqs)) + " tokens with " +
         std::to_string(max_num_seqs) + " sequences running)";
}

KvGeometry PlanKvGeometry(const std::vector<RankKvCapacity>& ranks, int block_size) {
  if (ranks.empty()) throw std::runtime_error("kv: no worker capacities");
  if (block_size <= 0) throw std::runtime_error("kv: block size must be positive");
  KvGeometry g;
  g.block_size = block_size;
  g.num_blocks = -1;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto& c = ranks[r];
    // A model whose state does not grow with length still needs a unit; count one byte per token.
    const int64_t per_block = std::max<int64_t>(1, c.bytes_per_token) * block_size;
    const int64_t blocks = c.budget_bytes / per_block;
    g.fixed_blocks = std::max(g.fixed_blocks, CeilDiv(c.fixed_bytes, per_block));
    g.bytes_per_block = std::max(g.bytes_per_block, per_block);
    if (g.num_blocks < 0 || blocks < g.num_blocks) g.num_blocks = blocks;
  }
  if (g.num_blocks < g.fixed_blocks + 1)
    throw std::runtime_error("kv: the memory budget (" + std::to_string(ranks[0].budget_bytes) +
                             " bytes on rank 0) holds " + std::to_string(g.num_blocks) +
                             " blocks but one sequence needs at least " + std::to_string(g.fixed_blocks + 1) +
                             "; raise --kv-memory");
  return g;
}

KvBlocks::KvBlocks(const KvGeometry& g) : geometry_(g) {
  free_.reserve(g.num_blocks);
  for (int64_t b = g.num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int64_t KvBlocks::BlocksFor(int64_t tokens) const {
  return geometry_.fixed_blocks + CeilDiv(std::max<int64_t>(tokens, 1), geometry_.block_size);
}

bool KvBlocks::Grow(uint64_t owner, int64_t tokens) {
  auto& t = tables_[owner];
  const int64_t need = BlocksFor(tokens) - static_cast<int64_t>(t.size());
  if (need <= 0) return true;
  if (need > free_blocks()) {
    if (t.empty()) tables_.erase(owner);
    return false;
  }
  for (int64_t i = 0; i < need; ++i) {
    t.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void KvBlocks::Release(uint64_t owner) {
  auto it = tables_.find(owner);
  if (it == tables_.end()) return;
  for (int32_t b : it->second) free_.push_back(b);
  tables_.erase(it);
}

const std::vector<int32_t>& KvBlocks::table(uint64_t owner) const {
  static const std::vector<int32_t> empty;
  auto it = tables_.find(owner);
  return it == tables_.end() ? empty : it->second;
}

}  // namespace dsmesh
