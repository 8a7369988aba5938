// The CUDA backend of the model forward: every Backend op (kernels/backend.h) on one CUDA device, f32
// activations in device memory, dense weights kept in their checkpoint dtype, EXL3 linears through the
// GEMV (m <= 16) and GEMM (prefill) kernels, routed experts through the single-launch MoE kernel when the
// layer and row count allow it. All work is enqueued on the backend's own stream; only ToHost waits.
// Decode steps replay CUDA graphs of the forward's per-token segments (see cuda_backend.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/device_stream.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend_options.h"
#include "kernels/cuda/gpu_presence.h"  // RequireCudaDevice

namespace dsmesh {

std::shared_ptr<Backend> MakeCudaBackend(int device, const CudaBackendOptions& options = {});

// The stream every op of `backend` runs on when it is a CUDA backend, else {} (no stream). Work that must
// be ordered with the forward's kernels without waiting for them (the worker's CUDA-IPC collectives) is
// enqueued there.
DeviceStream CudaBackendStream(Backend& backend);

// What the graph segments did: captured, replayed, failed captures (then eager), segments run eagerly
// (first sight of a key, steps too large for graphs, graphs off), and arena overflows.
struct CudaGraphCounts {
  int64_t captures = 0;
  int64_t replays = 0;
  int64_t failures = 0;
  int64_t eager_segments = 0;
  int64_t scratch_overflows = 0;
  // Of the above, the stateful segments' (Backend::StatefulSegment): recorded, replayed, and kept eager
  // because an op in them could not be recorded.
  int64_t stateful_captures = 0;
  int64_t stateful_replays = 0;
  int64_t stateful_failures = 0;
  // Nodes (kernel launches and copies) in the graphs replayed: per step, what a decode step launches.
  int64_t replayed_nodes = 0;
};

// How often the routed-expert layers took the single-launch MoE kernel and how often they ran the
// per-expert path (with the reason logged once per layer).
struct CudaMoePathCounts {
  int64_t fused_launches = 0;
  int64_t per_expert_launches = 0;
};

// Batched EXL3 GEMV launches (Backend::LinearBatch and GroupedLinear of up to 16 rows: several linears in
// one launch) and the linears they ran.
struct CudaGemvBatchCounts {
  int64_t launches = 0;
  int64_t linears = 0;
};

// The host's side of the steps (BeginStep .. EndStep): wall time in all, and the part of it spent blocked
// in a stream synchronization (ToHost, FromHost: waiting for the device). What is left, busy_ms, is the host
// issuing the step (its logic, parameter staging, launches and graph replays), which includes the time a
// launch blocks while the device's launch queue is full: waiting near zero alone does not mean the device
// idles for the host (compare the step with its graphs' device time, `dsmesh bench --profile`).
struct CudaStepHostTimes {
  int64_t steps = 0;
  double wall_ms = 0, sync_wait_ms = 0;
  // Of the busy time: inside cudaGraphLaunch (with a stateful graph's parameter upload), and the stateful
  // segments' host logic (their ops computing and staging launch parameters while replaying).
  int64_t graph_launches = 0;
  double graph_launch_ms = 0, stateful_ops_ms = 0;
  double busy_ms() const { return wall_ms - sync_wait_ms; }
};

// What one CUDA backend did since it was made, for tests, the bench and the worker's log. Steps of several
// sequences whose attention or indexer ran one sequence at a time (Backend::AttentionBatch /
// IndexerTopKBatch past what one launch holds) are per_sequence_fallbacks. pdl_launches: kernel launches
// made with the programmatic-dependent-launch attribute (CudaBackendOptions::pdl), eager or captured into
// a graph (a graph's replays launch nothing through the host and add none).
struct CudaBackendStatistics {
  CudaGraphCounts graphs;
  CudaMoePathCounts moe;
  CudaGemvBatchCounts gemv_batches;
  int64_t per_sequence_fallbacks = 0;
  int64_t pdl_launches = 0;
  CudaStepHostTimes host;
};
// The statistics of `backend` when it is a CUDA backend, else all zero.
CudaBackendStatistics CudaBackendStats(Backend& backend);

}  // namespace dsmesh
