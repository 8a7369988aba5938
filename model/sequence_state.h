// What one sequence carries between steps, per layer (see dsv4-model.md section 4):
//   - ring: the raw K=V rows of the last `sliding_window` positions (slot = position % window);
//   - a compressor state (compressed layers): projected kv/score rows not yet folded into an entry (for the
//     overlapping CSA compressor this includes the previous window, whose first halves the next entry
//     needs), and the emitted entries (normed, roped);
//   - CSA layers also the indexer's compressor state; its entries are the indexer keys.
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
  Tensor pending_kv;          // [overlap ? 2*ratio : ratio, (overlap ? 2 : 1) * dim]
  Tensor pending_score;       // same shape; ape already added
  int64_t pending_rows = 0;   // rows for positions PendingBase() .. length-1
  Tensor entries;             // [capacity, dim]
  int64_t num_entries = 0;    // emitted so far = length / ratio

  int64_t width() const { return (overlap ? 2 : 1) * dim; }
  // Position of pending row 0 given `emitted` entries: the last emitted window is still needed with overlap.
  int64_t PendingBase(int64_t emitted) const {
    return overlap ? std::max<int64_t>(emitted - 1, 0) * ratio : emitted * ratio;
  }
};

struct LayerState {
  Tensor ring;                  // [window, head_dim]
  CompressorState compressor;   // ratio > 0
  CompressorState indexer;      // CSA only
};

struct SequenceStateData {
  Backend* backend = nullptr;
  const void* owner_model = nullptr;  // the ModelImpl that created it (checked by Forward)
  int64_t length = 0;
  std::vector<LayerState> layers;

  // Makes room for `entries` compressed entries (capacity grows geometrically).
  void EnsureEntries(CompressorState* cs, int64_t entries);
};

}  // namespace dsmesh
