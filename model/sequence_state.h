// What one sequence carries between steps, per layer (see dsv4-model.md section 4):
//   - ring: the raw K=V rows of the last positions, slot = position % slots, where slots = sliding_window +
//     spare: `spare` rows may be written past the sequence's length and then forgotten (speculative rows
//     that were rejected) without overwriting a row the window still needs;
//   - a compressor state (compressed layers): a ring of projected kv/score rows (slot = position % slots)
//     holding the rows not yet folded into an entry (for the overlapping CSA compressor also the previous
//     window, whose first halves the next entry needs), plus `spare` slots for the same reason, and the
//     emitted entries (normed, roped); entries past length / ratio are stale and ignored;
//   - CSA layers also the indexer's compressor state; its entries are the indexer keys;
//   - with speculation, the MTP block's layers (after the main ones) and its input history (MtpState).
// Every piece is addressed by position, so rolling a sequence back to an earlier length only rewinds
// counters (SequenceState::Rollback); nothing is copied.
// All tensors are f32 in the memory of the backend that made them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/tensor.h"
#include "kernels/backend.h"

namespace dsmesh {

struct CompressorState {
  int ratio = 0;
  bool overlap = false;
  int64_t dim = 0;            // entry width d_out
  Tensor pending_kv;          // ring [(overlap ? 2 : 1) * ratio + spare, width()]
  Tensor pending_score;       // same shape; ape already added
  Tensor entries;             // [capacity, dim]
  int64_t num_entries = 0;    // emitted so far = length / ratio

  int64_t width() const { return (overlap ? 2 : 1) * dim; }
  int64_t slots() const { return pending_kv.shape[0]; }
  // Position of the first pending row given `emitted` entries: the last emitted window is still needed
  // with overlap.
  int64_t PendingBase(int64_t emitted) const {
    return overlap ? std::max<int64_t>(emitted - 1, 0) * ratio : emitted * ratio;
  }
};

struct LayerState {
  Tensor ring;                  // [sliding_window + spare, head_dim]
  CompressorState compressor;   // ratio > 0
  CompressorState indexer;      // CSA only
};

// The MTP block's input history. Its row for position t is (target residual X_t, token t+1); the block
// has consumed positions < length (its window ring, in SequenceStateData::layers, holds them).
struct MtpState {
  int64_t length = 0;
  Tensor hidden;                // ring [sliding_window + spare, hc*D]: the target's last-block residual
  std::vector<int32_t> tokens;  // host ring of the same slots: the token fed at each position
  bool enabled() const { return hidden.data != nullptr; }
};

struct SequenceStateData {
  Backend* backend = nullptr;
  const void* owner_model = nullptr;  // the ModelImpl that created it (checked by Forward)
  int64_t length = 0;
  int spare = 0;                      // positions that may be rolled back (speculative tokens)
  std::vector<LayerState> layers;     // main blocks, then the MTP blocks when speculation is on
  MtpState mtp;

  // Makes room for `entries` compressed entries (capacity grows geometrically).
  void EnsureEntries(CompressorState* cs, int64_t entries);
};

// Ring copies by position: rows for positions pos .. pos+n-1 at slot p % ring.shape[0] (n <= slots).
void RingPut(Backend& be, const Tensor& src, int64_t src_row, int64_t pos, int64_t n, Tensor* ring);
void RingGet(Backend& be, const Tensor& ring, int64_t pos, int64_t n, Tensor* dst, int64_t dst_row);

}  // namespace dsmesh
