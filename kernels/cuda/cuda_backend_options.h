// How a CUDA backend is chosen and tuned: the --device flag, CudaBackendOptions, and the one place the
// DSMESH_CUDA_* / DSMESH_EXL3_* A/B variables are read from the environment (the CLI, the worker and
// dsmesh-kernel-bench call the *FromEnvironment functions; tests set the options directly).
#pragma once

#include <cstddef>
#include <string>

#include "kernels/cuda/exl3_gemv.h"  // Exl3GemvTuning
#include "kernels/cuda/exl3_moe.h"   // Exl3MoeTuning

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

  // ---- A/B variants and tunings (CudaBackendOptionsFromEnvironment reads them for the CLI and the worker) ----
  // The stateful part of decode steps (compressors, indexer, attention: Backend::StatefulSegment) replays
  // CUDA graphs too; false keeps it eager between the graph segments (DSMESH_CUDA_STATEFUL_GRAPHS=off).
  bool stateful_graphs = true;
  // The decode chain's kernels (model_ops_*.cu, kv_rows.cu, sampling_ops.cu, the EXL3 GEMV and MoE kernels)
  // launch with programmatic dependent launch on the backend's stream (pdl_launch.cuh): each may start
  // while the kernel before it drains, its prologue overlapping that tail; captured graphs hold
  // programmatic edges. sm_90 and later (DSMESH_CUDA_PDL=1). Off by default: not yet measured.
  bool pdl = false;
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
  // The EXL3 kernels' launch tuning (exl3_gemv.h, exl3_moe.h): every GEMV and MoE workspace the backend
  // makes takes it (DSMESH_EXL3_GEMV_CTAS_PER_SM, DSMESH_EXL3_MOE_*).
  Exl3GemvTuning gemv;
  Exl3MoeTuning moe;
  // A decode block's segments (attention inputs, the stateful part, attention output + FFN: one rank, no
  // collective between them) are recorded as one CUDA graph per block (Backend::BlockSegment) after each
  // part has recorded alone, so a step launches one graph and one parameter upload per block
  // (DSMESH_CUDA_BLOCK_GRAPHS=on). Off by default: not yet measured. (Last, so that an earlier build's
  // libraries read the fields before it where they were: run_gpu.sh's base mode.)
  bool block_graphs = false;
};

// `options` with the A/B variants and tunings the environment names (DSMESH_CUDA_STATEFUL_GRAPHS,
// DSMESH_CUDA_BLOCK_GRAPHS, DSMESH_CUDA_PREFILL_MOE, DSMESH_CUDA_PREFILL_ATTENTION, DSMESH_CUDA_PDL,
// DSMESH_EXL3_GEMV_CTAS_PER_SM, DSMESH_EXL3_MOE_*): how the CLI and the worker set them. Throws naming the variable on a value it does not know.
CudaBackendOptions CudaBackendOptionsFromEnvironment(CudaBackendOptions options = {});
// The A/B variants `options` takes in words ("" for the defaults); the backend logs it when made.
std::string CudaBackendVariants(const CudaBackendOptions& options);

// The EXL3 kernels' tuning from DSMESH_EXL3_GEMV_CTAS_PER_SM (1..16) and DSMESH_EXL3_MOE_ITEMS_PER_SM
// (1..64), _DOWN_WIDE (-1..1), _FUSED_FINISH (-1..1), _SPLITS (0..64); unset variables keep `tuning`'s
// values. Throws naming the variable, the value and the range.
Exl3GemvTuning Exl3GemvTuningFromEnvironment(Exl3GemvTuning tuning = {});
Exl3MoeTuning Exl3MoeTuningFromEnvironment(Exl3MoeTuning tuning = {});

}  // namespace dsmesh
