// The CUDA backend's EXL3 linears: what a LinearWeight's EXL3 handle holds on this device, and the launches
// that apply them.
//
// - Slices and parts: a rank's slice of a checkpoint linear (or a synthetic one) is built on first use as
//   device parts, one per output range used (the whole slice, or a group of a GroupedLinear): the Hadamard
//   blocks the range touches, with its offsets inside them. The parts are the only device copy (the MoE
//   kernel's pointer tables point into them).
// - Apply: one part on x, through the GEMV (m <= kExl3GemvMaxRows) or the prefill GEMM, whose workspace is
//   sized for the largest block range loaded.
// - GEMV batching: independent linears of the same K, codebook, k and rows (Backend::LinearBatch, the
//   groups of a grouped linear) share launches (Exl3GemvBatch), counted in CudaBackendStats().gemv_batches.
// - The shared expert's decode rows as one fused path (SharedExpertRows).
// It lives apart from the op dispatch because the fused decode paths grow here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend_util.h"
#include "kernels/cuda/cuda_step_arena.h"
#include "kernels/cuda/exl3_device_weights.h"
#include "kernels/cuda/exl3_gemm.h"
#include "kernels/cuda/exl3_gemv.h"
#include "kernels/exl3/exl3_linear.h"

namespace dsmesh {

// A slice of an EXL3 linear as its own device linear: the Hadamard blocks the slice touches
// ([k0, k1) x [n0, n1), multiples of 128), with the slice's offsets inside them.
struct Exl3Part {
  std::unique_ptr<Exl3DeviceLinearBuffers> buffers;
  int64_t x_col0 = 0, kin = 0;   // input columns of the slice inside the block range
  int64_t y_col0 = 0, nout = 0;  // output columns of the slice inside the block range
  Tensor bias;                   // f32 [nout] device, or empty
};

// The checkpoint's EXL3 tensors (host views) or a synthetic linear's seed, and the slice this rank uses;
// device parts are built on first use and are the only device copy (the MoE kernel's pointer tables
// point into them).
struct CudaExl3Linear {
  Exl3Weight weight;  // synthetic: sizes, K, codebook and name only (no host tensors)
  Exl3Slice slice;
  bool synthetic = false;
  uint64_t seed = 0;
  std::mutex mu;
  std::unique_ptr<Exl3Part> whole;
  std::map<int64_t, std::unique_ptr<Exl3Part>> groups;  // GroupedLinear: out_begin -> part
};

class Exl3Weights {
 public:
  // Its GEMV workspace takes `gemv`.
  Exl3Weights(std::shared_ptr<StreamContext> ctx, StepArena& arena, CudaBackendCounters& counters,
              const Exl3GemvTuning& gemv);
  Exl3Weights(const Exl3Weights&) = delete;
  Exl3Weights& operator=(const Exl3Weights&) = delete;

  // Backend::LoadExl3Linear: host views of the checkpoint's tensors; device parts come on first use.
  LinearWeight Load(const Checkpoint& ckpt, const std::string& prefix, int64_t out_features, int64_t in_features,
                    int64_t out_begin, int64_t out_end, int64_t in_begin, int64_t in_end);
  // Backend::SyntheticExl3Linear: the slice's part is generated on the device now (the device is current).
  LinearWeight Synthetic(const std::string& name, int64_t out_features, int64_t in_features, int64_t out_begin,
                         int64_t out_end, int64_t in_begin, int64_t in_end, int K, uint64_t seed);

  static CudaExl3Linear& Of(const LinearWeight& w) { return *static_cast<CudaExl3Linear*>(w.exl3.get()); }
  // The device part of e's output columns [out_begin, out_end), built on first use.
  Exl3Part& PartFor(CudaExl3Linear& e, int64_t out_begin, int64_t out_end);

  // out[m, nout] (row stride ldo; += when accumulate) = x[m, kin] (row stride ldx) W_part.
  void Apply(const Exl3Part& part, const float* x, int64_t ldx, int64_t m, float* out, int64_t ldo, bool accumulate);
  // The GEMV workspace of the backend's stream.
  Exl3GemvWorkspace& MainGemvWorkspace();

  // The EXL3 jobs of at most 16 rows whose slice is a whole linear written straight into its output, in
  // sets that share a batched GEMV launch (same K, codebook, k and rows, at most kExl3GemvMaxBatch each),
  // and the jobs left (other linears), in their order.
  struct GemvBatchPlan {
    struct Taken {
      const Backend::LinearJob* job;
      const Exl3DeviceLinear* lin;
    };
    std::vector<Taken> taken;
    std::vector<std::vector<const Taken*>> sets;  // point into `taken`
    std::vector<Backend::LinearJob> rest;
    // False when no two linears can share a launch (then nothing is gained by batching).
    bool shares_a_launch() const { return sets.size() != taken.size(); }
  };
  GemvBatchPlan PlanGemvBatches(const std::vector<Backend::LinearJob>& jobs);
  // Runs the plan's sets of two or more as batched GEMVs: one fp16 conversion per distinct input, one launch
  // per set. Returns the jobs it left (the plan's rest, then the sets of one), for the caller to run.
  std::vector<Backend::LinearJob> RunGemvBatches(const GemvBatchPlan& plan);
  // A grouped EXL3 linear of m <= 16 rows as one group-major fp16 conversion, one batched GEMV launch over
  // the groups and (m > 1) one scatter back into rows. False when a group's slice is not a whole EXL3
  // linear (the caller then runs them group by group).
  bool GroupedRows(const Tensor& x, const LinearWeight& w, int groups, Tensor* out);
  // The shared expert of m <= 16 rows, out += w2(SwiGLU(w1 x, w3 x)), in four launches: x to fp16, w1 and
  // w3 in one batched GEMV, SwiGLU with its fp16 rounding in one kernel, and w2's GEMV adding into out (the
  // same values as the composed op: its SwiGlu, ToHalfPadded and Add do the same arithmetic). False when
  // the three are not whole EXL3 linears that can run so (the caller then composes the op).
  bool SharedExpertRows(const Tensor& x, const ExpertWeights& e, float limit, Tensor* out);

 private:
  // The GEMM workspace is sized for the largest EXL3 block range loaded.
  void NoteSlice(const Exl3Slice& sl);
  // The device linear of an EXL3 linear whose slice is the whole of its part and of w.in x w.out, no bias;
  // else null.
  const Exl3DeviceLinear* WholeLinear(const LinearWeight& w);
  // One batched GEMV launch on the main stream, counted (CudaBackendStats().gemv_batches) and announced once.
  void LaunchGemvBatch(const Exl3GemvJob* jobs, int count, int m);

  std::shared_ptr<StreamContext> ctx_;
  StepArena& arena_;
  CudaBackendCounters& counters_;
  const Exl3GemvTuning gemv_tuning_;
  int64_t max_k_ = 128, max_n_ = 128, max_weights_ = 128 * 128;
  std::unique_ptr<Exl3GemvWorkspace> gemv_ws_;
  std::unique_ptr<Exl3GemmWorkspace> gemm_ws_;
  int64_t gemm_ws_k_ = 0, gemm_ws_n_ = 0, gemm_ws_weights_ = 0;
  bool logged_gemv_batch_ = false;
};

}  // namespace dsmesh
