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
  if (num_slots > 0)
    return "KV cache size: " + std::to_string(pool_tokens()) + " tokens (" + std::to_string(num_blocks) +
           " blocks of " + std::to_string(block_size) + " tokens, " + std::to_string(bytes_per_block) +
           " bytes/block/rank; " + std::to_string(num_slots) + " sequence state slots for " +
           std::to_string(max_num_seqs) + " running sequences and prefix snapshots)";
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
  if (ranks[0].pool_blocks > 0 || ranks[0].state_slots > 0) {
    g.block_size = ranks[0].block_tokens;
    g.num_blocks = ranks[0].pool_blocks;
    g.num_slots = ranks[0].state_slots;
    for (size_t r = 0; r < ranks.size(); ++r) {
      const auto& c = ranks[r];
      if (c.block_tokens != g.block_size)
        throw std::runtime_error("kv: rank " + std::to_string(r) + " plans blocks of " +
                                 std::to_string(c.block_tokens) + " tokens, rank 0 of " + std::to_string(g.block_size));
      g.num_blocks = std::min(g.num_blocks, c.pool_blocks);
      g.num_slots = std::min(g.num_slots, c.state_slots);
      g.bytes_per_block = std::max(g.bytes_per_block, c.block_bytes);
    }
    if (g.block_size <= 0 || g.num_blocks < 1 || g.num_slots < 1)
      throw std::runtime_error("kv: the workers' state pool holds " + std::to_string(g.num_blocks) + " blocks and " +
                               std::to_string(g.num_slots) + " state slots; one sequence needs a slot and a block; "
                               "raise --kv-memory");
    return g;
  }
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
  refs_.assign(static_cast<size_t>(g.num_blocks), 0);
  for (int s = g.num_slots - 1; s >= 0; --s) free_slots_.push_back(s);
}

bool KvBlocks::TakeSlot(uint64_t owner) {
  if (geometry_.num_slots == 0 || slots_.count(owner)) return true;
  if (free_slots_.empty()) return false;
  slots_[owner] = free_slots_.back();
  free_slots_.pop_back();
  return true;
}

int KvBlocks::slot(uint64_t owner) const {
  auto it = slots_.find(owner);
  return it == slots_.end() ? -1 : it->second;
}

bool KvBlocks::Share(uint64_t owner, uint64_t from, int64_t blocks) {
  if (tables_.count(owner)) throw std::logic_error("KvBlocks::Share: owner already holds blocks");
  const std::vector<int32_t> src = table(from);
  if (blocks > static_cast<int64_t>(src.size())) throw std::logic_error("KvBlocks::Share: more blocks than the source");
  if (!TakeSlot(owner)) return false;
  auto& t = tables_[owner];
  for (int64_t j = 0; j < blocks; ++j) {
    t.push_back(src[j]);
    ++refs_[src[j]];
  }
  return true;
}

int64_t KvBlocks::BlocksOf(const std::vector<uint64_t>& owners) const {
  std::vector<bool> seen(refs_.size(), false);
  int64_t n = 0;
  for (uint64_t o : owners)
    for (int32_t b : table(o))
      if (!seen[b]) {
        seen[b] = true;
        ++n;
      }
  return n;
}

int64_t KvBlocks::BlocksFor(int64_t tokens) const {
  return geometry_.fixed_blocks + CeilDiv(std::max<int64_t>(tokens, 1), geometry_.block_size);
}

bool KvBlocks::Grow(uint64_t owner, int64_t tokens) {
  const bool is_new = !tables_.count(owner);
  auto& t = tables_[owner];
  const int64_t need = BlocksFor(tokens) - static_cast<int64_t>(t.size());
  if (need > free_blocks() || !TakeSlot(owner)) {
    if (is_new) tables_.erase(owner);
    return false;
  }
  for (int64_t i = 0; i < need; ++i) {
    t.push_back(free_.back());
    refs_[free_.back()] = 1;
    free_.pop_back();
  }
  return true;
}

void KvBlocks::Release(uint64_t owner) {
  auto it = tables_.find(owner);
  if (it != tables_.end()) {
    for (int32_t b : it->second)
      if (--refs_[b] == 0) free_.push_back(b);
    tables_.erase(it);
  }
  auto s = slots_.find(owner);
  if (s != slots_.end()) {
    free_slots_.push_back(s->second);
    slots_.erase(s);
  }
}

const std::vector<int32_t>& KvBlocks::table(uint64_t owner) const {
  static const std::vector<int32_t> empty;
  auto it = tables_.find(owner);
  return it == tables_.end() ? empty : it->second;
}

}  // namespace dsmesh
