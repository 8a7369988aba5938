// What one sequence carries between steps, per layer (see docs/model-v4.md section 4), all of it in the
// model's StatePool (model/state_pool.h):
//   - in the state's slot: the ring of raw K=V rows of the last positions, slot = position % slots, where
//     slots = sliding_window + spare: `spare` rows may be written past the sequence's length and then
//     forgotten (speculative rows that were rejected) without overwriting a row the window still needs;
//     for compressed layers the compressor's ring of projected kv/score rows not yet folded into an
//     entry (for the overlapping CSA compressor also the previous window, whose first halves the next
//     entry needs), plus `spare` rows for the same reason; CSA layers the same for the indexer; with
//     speculation the MTP block's layers (after the main ones) and its input history (MtpState);
//   - in the state's blocks (its block table): the emitted entries (normed, roped) and the indexer keys,
//     entry e of a ratio-r layer in block blocks[e * r / block_tokens]; entries past length / ratio are
//     stale and ignored.
// Every piece is addressed by position, so rolling a sequence back to an earlier length only rewinds
// counters (SequenceState::Rollback); nothing is copied. All rows are f32.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/tensor.h"
#include "kernels/backend.h"
#include "model/state_pool.h"

namespace dsmesh {

struct CompressorState {
  int ratio = 0;
  bool overlap = false;
  int64_t dim = 0;            // entry width d_out
  Tensor pending_kv;          // ring [(overlap ? 2 : 1) * ratio + spare, width()]
  Tensor pending_score;       // same shape; ape already added
  int64_t num_entries = 0;    // emitted so far = length / ratio

  int64_t width() const { return (overlap ? 2 : 1) * dim; }
  int64_t slots() const { return pending_kv.shape[0]; }
};

struct LayerState {
  Tensor ring;                  // [sliding_window + spare, head_dim]
  CompressorState compressor;   // ratio > 0
  CompressorState indexer;      // CSA only
};

// The MTP block's input history. Its row for position t is (target residual X_t, token t+1), where an
// image row's token stands for its image embedding (the target's input row there); the block has consumed
// positions < length (its window ring, in SequenceStateData::layers, holds them).
struct MtpState {
  int64_t length = 0;
  Tensor hidden;                // ring [n * sliding_window + spare, hc*D]: the target's last-block residual
                                // (n MTP blocks; block j's exact window needs j windows more history)
  std::vector<int32_t> tokens;  // host ring of the same slots: the token fed at each position
  std::vector<uint8_t> is_image;  // vision models: host ring of the same slots, 1 where that position was an
                                  // image row (empty for a text model)
  Tensor image;                 // vision models: ring of the same slots [.., D], the image embedding of each
                                // position flagged in is_image (other slots hold stale rows, never read)
  std::vector<Tensor> chain;    // MTP block j >= 1 (chain[j-1]): ring [sliding_window + spare, hc*D] whose
                                // slot for position t holds block j-1's output for position t-1
  bool enabled() const { return hidden.data != nullptr; }
};

struct SequenceStateData {
  ~SequenceStateData();  // returns the slot and blocks of a locally allocated state to the pool

  Backend* backend = nullptr;
  const void* owner_model = nullptr;  // the ModelImpl that created it (checked by Forward)
  std::shared_ptr<StatePool> pool;
  int slot = -1;
  std::vector<int32_t> blocks;        // the block table: block j holds tokens [j, j+1) * block_tokens
  int64_t length = 0;
  int spare = 0;                      // positions that may be rolled back (speculative tokens)
  std::vector<LayerState> layers;     // main blocks, then the MTP blocks when speculation is on
  MtpState mtp;

  // Makes the block table cover `tokens` tokens: a local state takes blocks from the pool (throws when it
  // is full); an externally planned one must already hold them (throws naming the shortfall).
  void EnsureBlocks(int64_t tokens);
  // The entries (indexer keys with indexer) of `layer` as paged rows for the attention ops; `table`, when
  // given, is this state's block table as the step uploaded it (Backend::StepMetadata).
  PagedRows Entries(int layer, bool indexer, const int32_t* table = nullptr) const;
};

// Ring copies by position: rows for positions pos .. pos+n-1 at slot p % ring.shape[0] (n <= slots).
// (The forward's rings of a whole step go through Backend::RingWriteBatch instead.)
void RingPut(Backend& be, const Tensor& src, int64_t src_row, int64_t pos, int64_t n, Tensor* ring);
void RingGet(Backend& be, const Tensor& ring, int64_t pos, int64_t n, Tensor* dst, int64_t dst_row);

}  // namespace dsmesh
