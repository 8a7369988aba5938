// The CUDA backend of the model forward: every Backend op (kernels/backend.h) on one CUDA device, f32
// activations in device memory, dense weights kept in their checkpoint dtype, EXL3 linears through the
// GEMV (m <= 16) and GEMM (prefill) kernels, routed experts through the single-launch MoE kernel when the
// layer and row count allow it. All work is enqueued on the backend's own stream; only ToHost waits.
// Decode steps replay CUDA graphs of the forward's per-token segments (see cuda_backend.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/backend.h"
#include "kernels/cuda/gpu_presence.h"  // RequireCudaDevice

namespace dsmesh {

// Parses "cuda" (device 0) or "cuda:N"; returns -1 for "cpu"; throws naming `flag` on anything else.
int ParseDeviceFlag(const std::string& value, const std::string& flag = "--device");

struct CudaBackendOptions {
  // Decode steps replay CUDA graphs of the forward's segments (Backend::Segment); false is vLLM's
  // --enforce-eager.
  bool cuda_graphs = true;
  // Device memory set aside for a step's temporaries; a step that needs more (a long prefill chunk)
  // takes the rest from the stream-ordered pool.
  size_t scratch_bytes = size_t{256} << 20;
  // Independent small linears of a step (Backend::LinearBatch, the groups of a one-row grouped linear,
  // the shared expert's gate and up) run concurrently on side streams when true. Off by default: on the
  // full-size model with graphs it measured 8% slower than in order (docs/gpu-forward.md).
  bool concurrent_linears = false;

  // ---- A/B variants (CudaBackendOptionsFromEnvironment reads them for the CLI and the worker) ----
  // The stateful part of decode steps (compressors, indexer, attention: Backend::StatefulSegment) replays
  // CUDA graphs too; false keeps it eager between the graph segments (DSMESH_CUDA_STATEFUL_GRAPHS=off).
  bool stateful_graphs = true;
  // Routed experts of prefill chunks (more rows than a decode bucket): (row, slot) pairs sorted by expert
  // in one launch, or the older paths: per expert with the routing on the host, or the single-launch kernel
  // on slices of rows (DSMESH_CUDA_PREFILL_MOE=per-expert|row-slices).
  enum class PrefillMoe { kSortedPairs, kPerExpert, kRowSlices };
  PrefillMoe prefill_moe = PrefillMoe::kSortedPairs;
  // Attention of prefill chunks: the tensor-core kernel (fp16 high + low operand parts), the same with
  // operands rounded to fp16 once (a third of the mma), the decode kernel split over keys in slices of 16
  // rows, or one block per (row, head) (DSMESH_CUDA_PREFILL_ATTENTION=mma-fp16|split|per-row).
  enum class PrefillAttention { kMma, kMmaFp16, kSplit, kPerRow };
  PrefillAttention prefill_attention = PrefillAttention::kMma;
};

// `options` with the A/B variants the environment names (DSMESH_CUDA_STATEFUL_GRAPHS,
// DSMESH_CUDA_PREFILL_MOE, DSMESH_CUDA_PREFILL_ATTENTION): how the CLI and the worker set them. Logs the
// variants it takes; throws naming the variable on a value it does not know.
CudaBackendOptions CudaBackendOptionsFromEnvironment(CudaBackendOptions options = {});
// The A/B variants `options` takes in words ("" for the defaults); the backend logs it when made.
std::string CudaBackendVariants(const CudaBackendOptions& options);

std::shared_ptr<Backend> MakeCudaBackend(int device, const CudaBackendOptions& options = {});

// The stream (a cudaStream_t) every op of `backend` runs on when it is a CUDA backend, else nullptr. Work
// that must be ordered with the forward's kernels without waiting for them (the worker's CUDA-IPC
// collectives) is enqueued there.
void* CudaBackendStream(Backend& backend);

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

// What one CUDA backend did since it was made, for tests, the bench and the worker's log. Steps of several
// sequences whose attention or indexer ran one sequence at a time (Backend::AttentionBatch /
// IndexerTopKBatch past what one launch holds) are per_sequence_fallbacks.
struct CudaBackendStatistics {
  CudaGraphCounts graphs;
  CudaMoePathCounts moe;
  CudaGemvBatchCounts gemv_batches;
  int64_t per_sequence_fallbacks = 0;
};
// The statistics of `backend` when it is a CUDA backend, else all zero.
CudaBackendStatistics CudaBackendStats(Backend& backend);

}  // namespace dsmesh
