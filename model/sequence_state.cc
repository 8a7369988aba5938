#include "model/sequence_state.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/model.h"

namespace dsmesh {
namespace {

size_t Bytes(const Tensor& t) { return t.data ? t.nbytes() : 0; }

void CopyTensor(Backend& be, const Tensor& src, Tensor* dst) {
  if (src.data && !src.shape.empty() && src.shape[0] > 0) be.CopyRows(src, 0, dst, 0, src.shape[0]);
}

}  // namespace

void RingPut(Backend& be, const Tensor& src, int64_t src_row, int64_t pos, int64_t n, Tensor* ring) {
  const int64_t slots = ring->shape[0];
  if (n > slots) throw std::logic_error("RingPut: more rows than slots");
  const int64_t first = pos % slots, head = std::min(n, slots - first);
  if (head > 0) be.CopyRows(src, src_row, ring, first, head);
  if (n > head) be.CopyRows(src, src_row + head, ring, 0, n - head);
}

void RingGet(Backend& be, const Tensor& ring, int64_t pos, int64_t n, Tensor* dst, int64_t dst_row) {
  const int64_t slots = ring.shape[0];
  if (n > slots) throw std::logic_error("RingGet: more rows than slots");
  const int64_t first = pos % slots, head = std::min(n, slots - first);
  if (head > 0) be.CopyRows(ring, first, dst, dst_row, head);
  if (n > head) be.CopyRows(ring, 0, dst, dst_row + head, n - head);
}

SequenceStateData::~SequenceStateData() {
  if (!pool || pool->external()) return;
  for (int32_t b : blocks) pool->Unref(b);
  pool->FreeSlot(slot);
}

void SequenceStateData::EnsureBlocks(int64_t tokens) {
  if (!pool || pool->block_bytes() == 0) return;
  const int64_t T = pool->block_tokens();
  const int64_t need = (tokens + T - 1) / T;
  if (static_cast<int64_t>(blocks.size()) >= need) return;
  if (pool->external())
    throw std::runtime_error("sequence state: its block table holds " + std::to_string(blocks.size() * T) +
                             " tokens, the step needs " + std::to_string(tokens) +
                             " (the coordinator plans blocks of " + std::to_string(T) + " tokens)");
  while (static_cast<int64_t>(blocks.size()) < need) blocks.push_back(pool->AllocateBlock());
}

PagedRows SequenceStateData::Entries(int layer, bool indexer, const int32_t* table) const {
  const StatePool::LayerGeometry& g = pool->layers()[layer];
  return PagedRows{indexer ? &pool->index_keys(layer) : &pool->entries(layer), pool->entries_per_block(g.ratio),
                   table ? table : blocks.data(), static_cast<int64_t>(blocks.size()), indexer ? 0 : g.rope_dim};
}

SequenceState::SequenceState(std::unique_ptr<SequenceStateData> data) : data_(std::move(data)) {}
SequenceState::~SequenceState() = default;

int64_t SequenceState::length() const { return data_->length; }
int SequenceState::speculative_tokens() const { return data_->spare; }

std::unique_ptr<SequenceState> SequenceState::Clone() const {
  const SequenceStateData& from = *data_;
  StatePool& pool = *from.pool;
  if (pool.external()) throw std::logic_error("Clone: the coordinator plans this pool's snapshots (CloneInto)");
  // Blocks that neither state writes again are shared: those whose tokens all lie below the lowest
  // length a rollback can reach. The rest are copied into fresh blocks.
  const int64_t frozen = std::max<int64_t>(0, from.length - from.spare) / pool.block_tokens();
  const int slot = pool.AllocateSlot();
  std::vector<int32_t> blocks;
  try {
    for (size_t j = 0; j < from.blocks.size(); ++j) {
      if (static_cast<int64_t>(j) < frozen) pool.Ref(from.blocks[j]);
      blocks.push_back(static_cast<int64_t>(j) < frozen ? from.blocks[j] : pool.AllocateBlock());
    }
  } catch (...) {
    for (int32_t b : blocks) pool.Unref(b);
    pool.FreeSlot(slot);
    throw;
  }
  return CopyInto(slot, std::move(blocks));
}

std::unique_ptr<SequenceState> SequenceState::CloneInto(int slot, std::vector<int32_t> blocks) const {
  const SequenceStateData& from = *data_;
  if (!from.pool->external()) throw std::logic_error("CloneInto: this state pool allocates its own (Clone)");
  if (slot < 0 || slot >= from.pool->num_slots() || slot == from.slot)
    throw std::runtime_error("snapshot: state slot " + std::to_string(slot) + " is not a free slot of the pool's " +
                             std::to_string(from.pool->num_slots()));
  for (int32_t b : blocks)
    if (b < 0 || b >= from.pool->num_blocks())
      throw std::runtime_error("snapshot: block id " + std::to_string(b) + " outside the pool's " +
                               std::to_string(from.pool->num_blocks()) + " blocks");
  return CopyInto(slot, std::move(blocks));
}

std::unique_ptr<SequenceState> SequenceState::CopyInto(int slot, std::vector<int32_t> blocks) const {
  const SequenceStateData& from = *data_;
  StatePool& pool = *from.pool;
  Backend& be = *from.backend;
  auto d = std::make_unique<SequenceStateData>();
  d->backend = from.backend;
  d->owner_model = from.owner_model;
  d->pool = from.pool;
  d->slot = slot;
  d->length = from.length;
  d->spare = from.spare;
  // A block listed under the same id is shared; any other block the original has written is copied.
  const int64_t T = pool.block_tokens();
  const size_t written = std::min<size_t>(from.blocks.size(), static_cast<size_t>((from.length + T - 1) / T));
  for (size_t j = 0; j < std::min(written, blocks.size()); ++j) {
    if (blocks[j] == from.blocks[j]) continue;
    for (size_t l = 0; l < pool.layers().size(); ++l) {
      if (pool.layers()[l].ratio == 0) continue;
      for (bool ix : {false, true}) {
        if (ix && pool.layers()[l].index_dim == 0) continue;
        Tensor dst = pool.BlockRows(static_cast<int>(l), ix, blocks[j]);
        be.CopyRows(pool.BlockRows(static_cast<int>(l), ix, from.blocks[j]), 0, &dst, 0, dst.shape[0]);
      }
    }
  }
  d->blocks = std::move(blocks);
  for (size_t l = 0; l < from.layers.size(); ++l) {
    const LayerState& src = from.layers[l];
    LayerState c = src;
    c.ring = pool.Ring(static_cast<int>(l), slot, static_cast<int>(src.ring.shape[0]));
    CopyTensor(be, src.ring, &c.ring);
    for (bool ix : {false, true}) {
      const CompressorState& sc = ix ? src.indexer : src.compressor;
      CompressorState& cc = ix ? c.indexer : c.compressor;
      if (sc.ratio == 0) continue;
      cc.pending_kv = pool.Pending(static_cast<int>(l), ix, false, slot, static_cast<int>(sc.slots()));
      cc.pending_score = pool.Pending(static_cast<int>(l), ix, true, slot, static_cast<int>(sc.slots()));
      CopyTensor(be, sc.pending_kv, &cc.pending_kv);
      CopyTensor(be, sc.pending_score, &cc.pending_score);
    }
    d->layers.push_back(std::move(c));
  }
  d->mtp.length = from.mtp.length;
  d->mtp.tokens = from.mtp.tokens;
  d->mtp.is_image = from.mtp.is_image;
  if (from.mtp.enabled()) {
    d->mtp.hidden = pool.MtpHidden(slot, static_cast<int>(from.mtp.hidden.shape[0]));
    CopyTensor(be, from.mtp.hidden, &d->mtp.hidden);
  }
  if (from.mtp.image.data) {
    d->mtp.image = pool.MtpImage(slot, static_cast<int>(from.mtp.image.shape[0]));
    CopyTensor(be, from.mtp.image, &d->mtp.image);
  }
  for (size_t j = 0; j < from.mtp.chain.size(); ++j) {
    d->mtp.chain.push_back(pool.MtpChain(slot, static_cast<int>(j) + 1, static_cast<int>(from.mtp.chain[j].shape[0])));
    CopyTensor(be, from.mtp.chain[j], &d->mtp.chain.back());
  }
  return std::make_unique<SequenceState>(std::move(d));
}

void SequenceState::Rollback(int64_t length) {
  SequenceStateData& d = *data_;
  if (length < 0 || length > d.length)
    throw std::runtime_error("Rollback: length " + std::to_string(length) + " outside [0, " +
                             std::to_string(d.length) + "]");
  if (d.length - length > d.spare)
    throw std::runtime_error("Rollback: " + std::to_string(d.length - length) + " positions to forget, the state keeps " +
                             std::to_string(d.spare) + " spare rows");
  d.length = length;
  for (LayerState& l : d.layers)
    for (CompressorState* c : {&l.compressor, &l.indexer})
      if (c->ratio > 0) c->num_entries = std::min(c->num_entries, length / c->ratio);
  // The MTP row for position t was fed token t+1, so the row length-1 saw a forgotten token: it is
  // recomputed (and with it what MTP block j >= 1 keeps for position `length`).
  d.mtp.length = std::min(d.mtp.length, std::max<int64_t>(length - 1, 0));
}

size_t SequenceState::MemoryBytes() const {
  size_t total = 0;
  for (const LayerState& l : data_->layers) {
    total += Bytes(l.ring);
    for (const CompressorState* c : {&l.compressor, &l.indexer}) total += Bytes(c->pending_kv) + Bytes(c->pending_score);
  }
  total += Bytes(data_->mtp.hidden) + data_->mtp.tokens.size() * sizeof(int32_t);
  total += Bytes(data_->mtp.image) + data_->mtp.is_image.size() * sizeof(uint8_t);
  for (const Tensor& t : data_->mtp.chain) total += Bytes(t);
  if (data_->pool) total += data_->blocks.size() * static_cast<size_t>(data_->pool->block_bytes());
  return total;
}

void SequenceState::Reserve(int64_t total_tokens) { data_->EnsureBlocks(total_tokens); }

const std::vector<int32_t>& SequenceState::block_table() const { return data_->blocks; }

void SequenceState::SetBlockTable(std::vector<int32_t> blocks) {
  SequenceStateData& d = *data_;
  if (!d.pool->external()) throw std::logic_error("SetBlockTable: the state pool allocates its own blocks");
  const int64_t T = d.pool->block_tokens();
  const int64_t written = (d.length + T - 1) / T;
  for (int64_t j = 0; j < std::min<int64_t>(written, blocks.size()); ++j)
    if (j < static_cast<int64_t>(d.blocks.size()) && blocks[j] != d.blocks[j])
      throw std::runtime_error("block table: block " + std::to_string(j) + " of a live sequence changed from " +
                               std::to_string(d.blocks[j]) + " to " + std::to_string(blocks[j]));
  for (int32_t b : blocks)
    if (b < 0 || b >= d.pool->num_blocks())
      throw std::runtime_error("block table: block id " + std::to_string(b) + " outside the pool's " +
                               std::to_string(d.pool->num_blocks()) + " blocks");
  d.blocks = std::move(blocks);
}

}  // namespace dsmesh
