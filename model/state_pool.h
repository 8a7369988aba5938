// The preallocated memory every sequence state lives in (docs/model-v4.md section 4), sized once:
//   - blocks: the length-proportional part. Block b holds, for every compressed layer, the entries of
//     tokens [j * block_tokens, (j+1) * block_tokens) of whichever sequence lists b as its j-th block
//     (block_tokens / ratio entries per layer), and for CSA layers the indexer keys of the same tokens.
//     Block b is the same row range in every layer's tensor (one block id covers all layers, as vLLM's
//     block tables do), so one table per sequence addresses everything.
//   - slots: the fixed part of one state (per layer the sliding-window ring and the compressors' open
//     windows, the MTP block's ring and input history, with a vision model also the image embeddings of
//     that history), sized for the pool's largest number of
//     speculative rows. A state takes one slot for its whole life.
// Either the pool hands out blocks and slots itself (in-process use: the CLI, tests) or the coordinator's
// block manager does and the worker passes each state the table it was planned with (external mode); the
// pool never allocates memory after construction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/tensor.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/kv_layout.h"

namespace dsmesh {

struct StatePoolOptions {
  int64_t bytes = 0;                // blocks + slots; 0: the slots and 1 GiB of blocks
  int slots = 0;                    // sequence states at once (live + prefix snapshots); 0: 32
  int max_speculative_tokens = -1;  // rows a ring keeps for rollback; -1: 4 when the model has MTP, else 0
  bool external = false;            // the coordinator assigns blocks and slots (worker)
  // Storage of entries and indexer keys (kernels/kv_rows.h); rings and open windows stay f32. bf16 and
  // fp8 need a backend that reads such rows (the CPU backend; the CUDA kernels read f32 only).
  KvCacheDtype kv_dtype = KvCacheDtype::kF32;
};

class StatePool {
 public:
  // Per layer (main layers, then the MTP block's): the geometry of its part of a block and of a slot.
  struct LayerGeometry {
    int ratio = 0;             // 0: window only
    bool overlap = false;      // CSA: the compressor keeps the previous window too
    int64_t dim = 0;           // entry width (head_dim)
    int64_t rope_dim = 0;      // an entry's trailing rope dims (kept in bf16 by the fp8 layout)
    int64_t index_dim = 0;     // indexer key width (CSA), else 0
    int64_t ring_rows = 0;     // sliding_window + max spare
    int64_t pending_rows = 0, index_pending_rows = 0;  // compressor open windows (+ spare)
  };

  // has_mtp: slots also hold the MTP block's layer and input history (when max spare > 0).
  StatePool(const ModelConfig& c, bool has_mtp, const StatePoolOptions& options, Backend* backend);

  int block_tokens() const { return block_tokens_; }
  int64_t num_blocks() const { return num_blocks_; }
  int num_slots() const { return num_slots_; }
  int max_spare() const { return max_spare_; }
  bool external() const { return external_; }
  int64_t block_bytes() const { return block_bytes_; }   // one block across all layers
  int64_t slot_bytes() const { return slot_bytes_; }     // one state's fixed part
  KvCacheDtype kv_dtype() const { return kv_dtype_; }
  int64_t entries_per_block(int ratio) const { return ratio > 0 ? block_tokens_ / ratio : 0; }
  const std::vector<LayerGeometry>& layers() const { return layers_; }
  // "state pool: N blocks of T tokens (B bytes/block), S slots of F bytes; capacity C tokens" and so on.
  std::string Describe() const;

  // Storage: per layer, entries [num_blocks * entries_per_block(ratio), dim] and indexer keys; per layer
  // and slot the fixed tensors (views of one tensor per kind).
  const Tensor& entries(int layer) const { return entries_[layer]; }
  const Tensor& index_keys(int layer) const { return index_keys_[layer]; }
  Tensor Ring(int layer, int slot, int rows) const;
  Tensor Pending(int layer, bool indexer, bool score, int slot, int rows) const;
  Tensor MtpHidden(int slot, int rows) const;
  int64_t mtp_history_rows() const { return mtp_rows_; }
  // Vision models: the image embeddings of the same history rows [rows, hidden_size] (model/mtp.cc).
  Tensor MtpImage(int slot, int rows) const;
  // MTP block `block` >= 1's input history (block block-1's outputs, one position on).
  Tensor MtpChain(int slot, int block, int rows) const;
  int64_t mtp_chain_rows() const { return mtp_chain_rows_; }

  // Local allocation (not external): throws naming the shortage when the pool is full.
  int AllocateSlot();
  int32_t AllocateBlock();
  void Ref(int32_t block) { ++block_refs_.at(block); }
  void Unref(int32_t block);
  void FreeSlot(int slot);
  int64_t free_blocks() const { return static_cast<int64_t>(free_blocks_.size()); }
  int free_slots() const { return static_cast<int>(free_slots_.size()); }

  // Rows [first, first + n) of a block's part of `layer` (entries or indexer keys), as a tensor view.
  Tensor BlockRows(int layer, bool indexer, int32_t block) const;

 private:
  Backend* backend_;
  int block_tokens_ = 0, num_slots_ = 0, max_spare_ = 0;
  bool external_ = false;
  KvCacheDtype kv_dtype_ = KvCacheDtype::kF32;
  int64_t num_blocks_ = 0, block_bytes_ = 0, slot_bytes_ = 0;
  std::vector<LayerGeometry> layers_;
  std::vector<Tensor> entries_, index_keys_;              // per layer (empty for window-only layers)
  std::vector<Tensor> rings_, pending_kv_, pending_score_, index_kv_, index_score_;  // per layer, all slots
  Tensor mtp_hidden_;                                     // all slots
  Tensor mtp_image_;                                      // all slots (vision models)
  Tensor mtp_chain_;                                      // all slots, MTP blocks 1..n-1
  int64_t mtp_rows_ = 0, mtp_width_ = 0, mtp_chain_rows_ = 0, mtp_image_width_ = 0;
  int mtp_layers_ = 0;
  std::vector<int32_t> free_blocks_;
  std::vector<int> block_refs_;
  std::vector<int> free_slots_;
};

}  // namespace dsmesh
