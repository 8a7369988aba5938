#include "model/state_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <stdexcept>
#include <string>

#include "kernels/kv_rows.h"

namespace dsmesh {
namespace {

// Pool memory. Host pools are anonymous mappings: zero pages that cost nothing until a state writes
// them, so a CPU worker can reserve its whole budget up front.
Tensor PoolTensor(Backend* be, std::vector<int64_t> shape, DType dtype = DType::kF32) {
  if (!be->host_memory()) return be->Alloc(dtype, std::move(shape));
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const size_t bytes = std::max<size_t>(t.nbytes(), 64);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw std::runtime_error("state pool: cannot reserve " + std::to_string(bytes) + " bytes of host memory");
  t.data = p;
  t.owner = std::shared_ptr<void>(p, [bytes](void* q) { munmap(q, bytes); });
  return t;
}

// The pool tensor's dtype for rows of the given storage (kernels/kv_rows.h).
DType RowStorage(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::kBf16: return DType::kBF16;
    case KvCacheDtype::kFp8: return DType::kU8;
    default: return DType::kF32;
  }
}

// [rows, dim] values as the storage keeps them: F32 and BF16 rows of dim values, fp8 rows of bytes.
std::vector<int64_t> RowShape(KvCacheDtype d, int64_t rows, int64_t dim, int64_t rope_dim) {
  const DType s = RowStorage(d);
  return {rows, s == DType::kU8 ? KvRowBytes(s, dim, rope_dim) : dim};
}

std::string MiB(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  return buf;
}

}  // namespace

StatePool::StatePool(const ModelConfig& c, bool has_mtp, const StatePoolOptions& o, Backend* backend)
    : backend_(backend), external_(o.external), kv_dtype_(o.kv_dtype) {
  max_spare_ = o.max_speculative_tokens >= 0 ? o.max_speculative_tokens : (has_mtp ? 4 : 0);
  num_slots_ = o.slots > 0 ? o.slots : 32;
  const bool mtp = has_mtp && max_spare_ > 0;

  // A block spans a multiple of every compression ratio (each window's entry lies in one block) and at
  // least 256 tokens, vLLM's logical block for V4.
  const int layers = c.num_layers + (mtp ? c.num_mtp_layers : 0);
  int64_t lcm = 1;
  for (int l = 0; l < layers; ++l)
    if (c.compress_ratio(l) > 0) lcm = std::lcm(lcm, static_cast<int64_t>(c.compress_ratio(l)));
  block_tokens_ = static_cast<int>((256 + lcm - 1) / lcm * lcm);

  for (int l = 0; l < layers; ++l) {
    LayerGeometry g;
    g.ring_rows = c.sliding_window + max_spare_;
    if (c.attention_kind(l) != AttentionKind::kSliding) {
      g.ratio = c.compress_ratio(l);
      g.overlap = c.attention_kind(l) == AttentionKind::kCompressedSparse;
      g.dim = c.head_dim;
      g.rope_dim = c.rope_dim;
      g.pending_rows = (g.overlap ? 2 : 1) * g.ratio + max_spare_;
      if (g.overlap) {
        g.index_dim = c.index_head_dim;
        g.index_pending_rows = 2 * g.ratio + max_spare_;
      }
    }
    layers_.push_back(g);
    const int64_t f = sizeof(float);
    const DType storage = RowStorage(kv_dtype_);
    if (g.ratio > 0)
      block_bytes_ += entries_per_block(g.ratio) *
                      (KvRowBytes(storage, g.dim, g.rope_dim) + (g.index_dim > 0 ? KvRowBytes(storage, g.index_dim, 0) : 0));
    slot_bytes_ += (g.ring_rows * c.head_dim + g.pending_rows * 2 * (g.overlap ? 2 : 1) * g.dim +
                    g.index_pending_rows * 2 * 2 * g.index_dim) * f;
  }
  if (mtp) {
    // With several MTP blocks, block j's window is fed by block j-1's outputs, which need block j-1's own
    // window before them: the target history reaches back one window per block (model/mtp.cc).
    mtp_rows_ = static_cast<int64_t>(c.num_mtp_layers) * c.sliding_window + max_spare_;
    mtp_chain_rows_ = c.sliding_window + max_spare_;
    mtp_width_ = static_cast<int64_t>(c.hc_mult) * c.hidden_size;
    slot_bytes_ += (mtp_rows_ + (c.num_mtp_layers - 1) * mtp_chain_rows_) * mtp_width_ * sizeof(float);
    mtp_layers_ = c.num_mtp_layers;
    // A vision model's history also keeps the image embedding of each row that was an image row.
    if (c.vision.enabled()) {
      mtp_image_width_ = c.hidden_size;
      slot_bytes_ += mtp_rows_ * mtp_image_width_ * static_cast<int64_t>(sizeof(float));
    }
  }

  // Without a budget: the slots and 1 GiB of blocks (at least 64).
  const int64_t fixed = slot_bytes_ * num_slots_;
  const int64_t budget = o.bytes > 0 ? o.bytes : fixed + std::max<int64_t>(int64_t{1} << 30, 64 * block_bytes_);
  if (fixed + block_bytes_ > budget)
    throw std::runtime_error("state pool: " + MiB(budget) + " cannot hold " + std::to_string(num_slots_) +
                             " sequence states of " + MiB(slot_bytes_) + " and one block of " + MiB(block_bytes_) +
                             "; raise --kv-memory or lower the number of state slots");
  // A model whose state does not grow with length gets table entries that address no memory.
  num_blocks_ = block_bytes_ > 0 ? (budget - fixed) / block_bytes_ : int64_t{1} << 20;

  const auto n_slots = static_cast<int64_t>(num_slots_);
  for (int l = 0; l < layers; ++l) {
    const LayerGeometry& g = layers_[l];
    const int64_t epb = entries_per_block(g.ratio);
    const DType storage = RowStorage(kv_dtype_);
    entries_.push_back(g.ratio > 0 ? PoolTensor(backend, RowShape(kv_dtype_, num_blocks_ * epb, g.dim, g.rope_dim), storage)
                                   : Tensor{});
    index_keys_.push_back(g.index_dim > 0 ? PoolTensor(backend, RowShape(kv_dtype_, num_blocks_ * epb, g.index_dim, 0), storage)
                                          : Tensor{});
    rings_.push_back(PoolTensor(backend, {n_slots * g.ring_rows, c.head_dim}));
    const int64_t w = (g.overlap ? 2 : 1) * g.dim;
    pending_kv_.push_back(g.ratio > 0 ? PoolTensor(backend, {n_slots * g.pending_rows, w}) : Tensor{});
    pending_score_.push_back(g.ratio > 0 ? PoolTensor(backend, {n_slots * g.pending_rows, w}) : Tensor{});
    index_kv_.push_back(g.index_dim > 0 ? PoolTensor(backend, {n_slots * g.index_pending_rows, 2 * g.index_dim})
                                        : Tensor{});
    index_score_.push_back(g.index_dim > 0 ? PoolTensor(backend, {n_slots * g.index_pending_rows, 2 * g.index_dim})
                                           : Tensor{});
  }
  if (mtp) mtp_hidden_ = PoolTensor(backend, {n_slots * mtp_rows_, mtp_width_});
  if (mtp_image_width_ > 0) mtp_image_ = PoolTensor(backend, {n_slots * mtp_rows_, mtp_image_width_});
  if (mtp && mtp_layers_ > 1) mtp_chain_ = PoolTensor(backend, {n_slots * (mtp_layers_ - 1) * mtp_chain_rows_, mtp_width_});

  block_refs_.assign(static_cast<size_t>(num_blocks_), 0);
  if (!external_) {
    // Handed out from the highest id down, so that no table is the identity by accident.
    for (int64_t b = 0; b < num_blocks_; ++b) free_blocks_.push_back(static_cast<int32_t>(b));
    for (int s = num_slots_ - 1; s >= 0; --s) free_slots_.push_back(s);
  }
}

std::string StatePool::Describe() const {
  return "state pool: " + std::to_string(num_blocks_) + " blocks of " + std::to_string(block_tokens_) +
         " tokens (" + MiB(block_bytes_) + " each, entries and indexer keys as " + KvCacheDtypeName(kv_dtype_) + ", " +
         std::to_string(num_blocks_ * block_tokens_) + " tokens of context in all), " + std::to_string(num_slots_) + " state slots of " + MiB(slot_bytes_) +
         " (windows and open compressor windows, " + std::to_string(max_spare_) + " speculative rows); " +
         MiB(static_cast<double>(num_blocks_) * block_bytes_ + static_cast<double>(num_slots_) * slot_bytes_) +
         " on " + backend_->name();
}

Tensor StatePool::Ring(int layer, int slot, int rows) const {
  return RowView(rings_[layer], slot * layers_[layer].ring_rows, rows);
}

Tensor StatePool::Pending(int layer, bool indexer, bool score, int slot, int rows) const {
  const LayerGeometry& g = layers_[layer];
  const Tensor& t = indexer ? (score ? index_score_[layer] : index_kv_[layer])
                            : (score ? pending_score_[layer] : pending_kv_[layer]);
  return RowView(t, slot * (indexer ? g.index_pending_rows : g.pending_rows), rows);
}

Tensor StatePool::MtpHidden(int slot, int rows) const { return RowView(mtp_hidden_, slot * mtp_rows_, rows); }

Tensor StatePool::MtpImage(int slot, int rows) const { return RowView(mtp_image_, slot * mtp_rows_, rows); }

Tensor StatePool::MtpChain(int slot, int block, int rows) const {
  return RowView(mtp_chain_, (static_cast<int64_t>(slot) * (mtp_layers_ - 1) + block - 1) * mtp_chain_rows_, rows);
}

Tensor StatePool::BlockRows(int layer, bool indexer, int32_t block) const {
  const int64_t epb = entries_per_block(layers_[layer].ratio);
  return RowView(indexer ? index_keys_[layer] : entries_[layer], static_cast<int64_t>(block) * epb, epb);
}

int StatePool::AllocateSlot() {
  if (external_) throw std::logic_error("state pool: slots are assigned by the coordinator");
  if (free_slots_.empty())
    throw std::runtime_error("state pool: all " + std::to_string(num_slots_) +
                             " sequence state slots are in use (live sequences and prefix snapshots)");
  const int s = free_slots_.back();
  free_slots_.pop_back();
  return s;
}

void StatePool::FreeSlot(int slot) {
  if (!external_ && slot >= 0) free_slots_.push_back(slot);
}

int32_t StatePool::AllocateBlock() {
  if (external_) throw std::logic_error("state pool: blocks are assigned by the coordinator");
  if (free_blocks_.empty())
    throw std::runtime_error("state pool: all " + std::to_string(num_blocks_) + " blocks of " +
                             std::to_string(block_tokens_) + " tokens are in use; raise --kv-memory");
  const int32_t b = free_blocks_.back();
  free_blocks_.pop_back();
  block_refs_[b] = 1;
  return b;
}

void StatePool::Unref(int32_t block) {
  if (external_) return;
  if (--block_refs_.at(block) == 0) free_blocks_.push_back(block);
}

}  // namespace dsmesh
