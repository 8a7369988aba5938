// The CUDA backend's step state: what the ops of one step take and where their host metadata goes.
//
// - Scratch: a fixed arena, bump-allocated (Temp) and released by mark, so that a step's addresses depend
//   only on its shapes (a replayed graph reads and writes the same addresses its capture did). Beyond the
//   arena, and outside a step, temporaries come from the stream-ordered pool (counted and logged once).
// - Step metadata: the step's token ids, positions and block tables are copied once per step (Begin) into
//   fixed device buffers that later ops recognise by host address (StepTokens, StepPositions, Paged); other
//   host metadata is copied per call (Staged).
// - Launch parameters (cuda_ops::ParamStager): staged into the stateful record being recorded or replayed
//   (StagedParams, owned by the graph recorder), else into an eager ring copied to the device in stream
//   order.
// - The recording mode the graph recorder sets: while a capture is in progress nothing may come from the
//   pool or from per-call host copies; while a stateful segment is probed, recorded or replayed, an op
//   whose launches a record cannot hold is noted (probing) or refused (Unrecordable).
// It lives here because every one of these rules is about what a step may take from the arena.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/tensor.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/model_ops.h"

namespace dsmesh {

// What the ops of a step are run for: plainly, or for a stateful segment's record (Backend::StatefulSegment):
// probing its first run (noting whether every op can be recorded), recording it, or replaying it (the ops
// only stage their parameters; the record's graph launches).
enum class StatefulMode { kNone, kProbing, kRecording, kReplaying };

// The parameter half of a stateful record: the pinned and device buffers its launches' parameter blocks
// are staged in (one upload per replay), and the launch shapes beyond the record's key (LaunchShape).
struct StagedParams {
  static constexpr size_t kBytes = size_t{32} << 10;  // a layer stages ~6 KiB at 8 sequences
  void* host = nullptr;  // pinned
  void* dev = nullptr;
  size_t used = 0, captured = 0;
  std::vector<int64_t> shapes;  // LaunchShape's values, in order
  size_t shapes_seen = 0;
};

class StepArena {
 public:
  StepArena(std::shared_ptr<StreamContext> ctx, size_t scratch_bytes, CudaBackendCounters& counters);
  ~StepArena();
  StepArena(const StepArena&) = delete;
  StepArena& operator=(const StepArena&) = delete;

  // ---- step scope ----
  // Opens a step: the arena from offset 0 and the step's metadata uploaded (Backend::BeginStep).
  void Begin(const Backend::StepMetadata& step);
  void End();
  bool in_step() const { return in_step_; }
  int64_t step_rows() const { return step_n_; }
  // The step's largest position + 1, rounded up to a power of two (at least 1024).
  int64_t key_bucket() const { return step_key_bucket_; }

  // ---- scratch ----
  // A temporary of the current step from the arena (contents undefined), or, outside a step or beyond
  // the arena, a zero-filled pool allocation (an overflow is logged once and counted).
  Tensor Temp(DType dtype, std::vector<int64_t> shape);
  size_t top() const { return arena_top_; }
  void SetTop(size_t top) { arena_top_ = top; }
  size_t bytes() const { return arena_bytes_; }

  // ---- host metadata ----
  // A device copy of a small host array, valid for this step.
  template <class T>
  Tensor Staged(const T* host, int64_t n) {
    Unrecordable("host metadata", "copied per call");
    if (capturing_) throw std::runtime_error("host metadata is copied inside a graph segment");
    Tensor t = Temp(sizeof(T) == 8 ? DType::kI64 : DType::kI32, {std::max<int64_t>(n, 1)});
    if (n > 0)
      CudaCheck(cudaMemcpyAsync(t.data, host, static_cast<size_t>(n) * sizeof(T), cudaMemcpyHostToDevice, ctx_->stream),
                "metadata upload");
    return t;
  }
  // The device copy of host metadata: the step's own arrays (Begin) without a copy, else a copy kept in *keep.
  const int32_t* StepTokens(const int32_t* host, int64_t n, Tensor* keep);
  const int64_t* StepPositions(const int64_t* host, int64_t n, Tensor* keep);
  const int32_t* StepTables(const int32_t* host, int64_t n, Tensor* keep);
  // Paged rows with the block table on the device (only the blocks `rows` rows touch are copied).
  // An empty pool (no rows yet) gives a null pool pointer.
  cuda_ops::PagedRowsDev Paged(const PagedRows& p, int64_t rows, int64_t dim, Tensor* keep);

  // ---- launch parameters ----
  // The ParamStager the launchers get.
  cuda_ops::ParamStager& stager() { return stager_; }
  // The indexer's launch covers this many keys per row (IndexerScratchFloats' ld): in a step a graph may
  // record, bucket / ratio, which holds every key a row of the step can see (keys <= (position + 1) /
  // ratio) and changes only when the step's largest position crosses a power of two; else what it holds.
  int64_t IndexerKeysLd(int64_t n, int64_t max_keys, int ratio) const;
  // A value a staged launch's shape depends on beyond the record's key (the indexer's key count): kept
  // while recording, compared while replaying (a mismatch would replay the wrong shape: it throws).
  int64_t LaunchShape(int64_t v);

  // ---- recording mode (set by the graph recorder) ----
  bool capturing() const { return capturing_; }
  void SetCapturing(bool on) { capturing_ = on; }
  StatefulMode mode() const { return stateful_mode_; }
  void SetMode(StatefulMode mode) { stateful_mode_ = mode; }
  // While a block record (GraphRecorder::BlockSegment) captures one of its plain segments, that segment's
  // ops launch with their parameters by value into the capture, as in any Segment, although the record
  // being made is a stateful one.
  bool plain_ops() const { return plain_ops_; }
  void SetPlainOps(bool on) { plain_ops_ = on; }
  // What made the segment being probed unrecordable ("" when nothing did).
  const std::string& unrecordable() const { return unrecordable_; }
  void ClearUnrecordable() { unrecordable_.clear(); }
  // An op (or a path of one) whose launches a stateful record cannot hold: noted while probing a
  // segment's first run (which then is never recorded), an error while recording or replaying one.
  void Unrecordable(const char* op, const char* why);
  // While alive, staged parameters go into `params` and the arena is in `mode` (recording or replaying:
  // in a replay the staged ops do not launch).
  class StagingInto {
   public:
    StagingInto(StepArena* arena, StagedParams* params, StatefulMode mode);
    ~StagingInto();
    StagingInto(const StagingInto&) = delete;
    StagingInto& operator=(const StagingInto&) = delete;

   private:
    StepArena* arena_;
  };

 private:
  // Stages into the current stateful record's buffers, or else into the eager ring.
  class Stager final : public cuda_ops::ParamStager {
   public:
    explicit Stager(StepArena* arena) : arena_(arena) {}
    const void* Stage(const void* host, size_t bytes) override { return arena_->StageParams(host, bytes); }
    bool Launching() const override { return arena_->stateful_mode_ != StatefulMode::kReplaying; }

   private:
    StepArena* arena_;
  };

  const void* StageParams(const void* host, size_t bytes);
  template <class T>
  const T* StepMeta(const T* host, int64_t n, const T* step_host, int64_t step_len, const T* step_device, Tensor* keep);
  void UploadTables(const int32_t* tables, int64_t len);

  std::shared_ptr<StreamContext> ctx_;
  CudaBackendCounters& counters_;
  void* arena_ = nullptr;
  size_t arena_bytes_ = 0, arena_top_ = 0;
  bool in_step_ = false, capturing_ = false, logged_overflow_ = false, plain_ops_ = false;
  const int32_t* step_tokens_ = nullptr;
  const int64_t* step_positions_ = nullptr;
  const int32_t* step_tables_ = nullptr;
  int64_t step_tables_len_ = 0, step_tables_cap_ = 0;
  void *step_tables_dev_ = nullptr, *step_tables_pinned_ = nullptr;
  int64_t step_n_ = 0;
  void *step_tokens_dev_ = nullptr, *step_positions_dev_ = nullptr, *step_pinned_ = nullptr;
  cudaEvent_t step_uploaded_ = nullptr;
  const int32_t* step_tokens_on_device_ = nullptr;
  const int64_t* step_positions_on_device_ = nullptr;
  std::vector<Tensor> step_meta_keep_;
  int64_t step_key_bucket_ = 0;  // Begin: the step's largest position + 1, rounded up to a power of two
  // The stateful mode, what made a probed segment unrecordable, the record parameters are staged into,
  // and where launch parameters are staged outside records (a pinned ring copied to a device ring in
  // stream order).
  StatefulMode stateful_mode_ = StatefulMode::kNone;
  std::string unrecordable_;
  StagedParams* staging_ = nullptr;
  Stager stager_{this};
  static constexpr size_t kEagerParamBytes = size_t{4} << 20;
  void* eager_params_host_ = nullptr;
  void* eager_params_dev_ = nullptr;
  size_t eager_params_top_ = 0;
};

}  // namespace dsmesh
