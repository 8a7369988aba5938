// What every part of the CUDA backend (cuda_backend.cc and the parts it delegates to: the step arena,
// the graph recorder, the EXL3 weights, the MoE dispatch) shares: the backend's stream, device
// allocations that outlive a step, the per-backend counters behind CudaBackendStatistics(), and the
// small checks and conversions of its ops. Internal to kernels/cuda/.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/tensor.h"
#include "kernels/cuda/cuda_backend.h"  // CudaBackendStatistics
#include "kernels/cuda/model_ops.h"

namespace dsmesh {

// Steps of more rows than this (prefill chunks) run their segments eagerly: decode buckets are 1..4
// sequences x 1..4 rows.
constexpr int64_t kGraphMaxRows = 16;

inline int64_t RowWidth(const Tensor& t) { return t.shape.empty() || t.shape[0] == 0 ? 0 : t.numel() / t.shape[0]; }
inline float* F(const Tensor& t) { return static_cast<float*>(t.data); }
inline const int32_t* I32(const Tensor& t) { return static_cast<const int32_t*>(t.data); }

inline void Require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw std::runtime_error(std::string("cuda backend ") + op + ": " + what);
}

// Throws naming `op` when the last launch failed.
void CheckLaunch(const char* op);

// How a state pool tensor stores its rows (kernels/kv_rows.h): U8 tensors hold the fp8 layout.
cuda_ops::RowKind RowKindOf(DType t);
cuda_ops::WType WTypeOf(DType t, const std::string& what);

// The stream every op of one backend runs on; shared with the deleters of the tensors it allocated so
// that a tensor outliving the backend still frees on a live stream.
struct StreamContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  explicit StreamContext(int d);
  ~StreamContext();
  // Makes the backend's device current (every op calls it before touching the device).
  void Use() const;
};

// A zero-filled tensor from the stream-ordered pool (cudaMallocAsync on ctx's stream), freed the same
// way when the last view drops.
Tensor PoolAlloc(const std::shared_ptr<StreamContext>& ctx, DType dtype, std::vector<int64_t> shape);
// A device copy of a host tensor in its own cudaMalloc (weights: they live as long as the model).
Tensor UploadToDevice(int device, const Tensor& host);

// The backend's counters (CudaBackendStatistics reads them).
struct CudaBackendCounters {
  std::atomic<int64_t> graph_captures{0}, graph_replays{0}, graph_failures{0}, eager_segments{0},
      scratch_overflows{0}, stateful_captures{0}, stateful_replays{0}, stateful_failures{0}, replayed_nodes{0};
  std::atomic<int64_t> fused_moe{0}, per_expert_moe{0}, per_sequence_fallbacks{0};
  std::atomic<int64_t> gemv_batches{0}, gemv_batched_linears{0};
  std::atomic<int64_t> pdl_launches{0};  // pdl_streams.h adds to it on every launch with the attribute
  std::atomic<int64_t> steps{0}, step_wall_ns{0}, step_sync_wait_ns{0};  // CudaStepHostTimes
  std::atomic<int64_t> host_graph_launches{0}, host_graph_launch_ns{0}, host_stateful_ops_ns{0};
  CudaBackendStatistics Snapshot() const;
};

// Adds the host time of its scope to a counter (the step's host-side breakdown, CudaStepHostTimes).
class HostTimer {
 public:
  explicit HostTimer(std::atomic<int64_t>& ns) : ns_(ns), t0_(std::chrono::steady_clock::now()) {}
  ~HostTimer() {
    ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count(),
                  std::memory_order_relaxed);
  }
  HostTimer(const HostTimer&) = delete;
  HostTimer& operator=(const HostTimer&) = delete;

 private:
  std::atomic<int64_t>& ns_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace dsmesh
