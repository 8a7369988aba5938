// The CUDA backend's routed experts (Backend::MoeExperts): which path a layer's experts take, and the
// launches of each.
//
// - Decode steps (at most kExl3MoeMaxRows rows): the single-launch MoE kernel (exl3_moe.h) when every
//   expert of the layer is a full-width MCG EXL3 linear of one K without bias; its device layer (pointer
//   tables into the Exl3Weights parts) and workspace are built on first use per layer (FusedFor).
// - Prefill chunks: the (row, slot) pairs sorted by expert on the device and run in one launch
//   (SortedPairs); or, with CudaBackendOptions::prefill_moe, the single-launch kernel on slices of rows or
//   the per-expert path.
// - Any other layer (dense experts, other codebooks, biases): per expert, the routing copied to the host
//   once and each expert's rows run through the backend's own Linear.
// CudaBackendStats().moe counts the fused launches and the per-expert calls. It lives apart from the op
// dispatch because the fused routed-expert paths grow here.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_backend_util.h"
#include "kernels/cuda/cuda_exl3_weights.h"
#include "kernels/cuda/cuda_step_arena.h"
#include "kernels/cuda/exl3_moe.h"

namespace dsmesh {

class MoeDispatch {
 public:
  // Its MoE workspaces take `tuning`.
  MoeDispatch(std::shared_ptr<StreamContext> ctx, StepArena& arena, Exl3Weights& exl3, CudaBackendCounters& counters,
              CudaBackendOptions::PrefillMoe prefill, const Exl3MoeTuning& tuning);
  MoeDispatch(const MoeDispatch&) = delete;
  MoeDispatch& operator=(const MoeDispatch&) = delete;

  // Backend::MoeExperts (accumulate) or MoeExpertsInto, with the backend's device current. The
  // single-launch kernel's rows go straight into out when not accumulating (the other paths zero out first
  // through ops.Zero). The per-expert path copies the routing through ops.ToHost and runs each expert's
  // linears through ops.Linear (`ops` is the backend itself).
  void Run(const Tensor& x, const Tensor& idx, const Tensor& weight, const std::vector<ExpertWeights>& experts,
           float limit, Tensor* out, bool accumulate, Backend& ops);

 private:
  struct FusedMoe {
    std::unique_ptr<Exl3DeviceMoeLayer> layer;
    std::unique_ptr<Exl3MoeWorkspace> workspace;
    int topk = 0;
  };

  // The single-launch kernel for this layer's experts, or null (with the reason logged once) when the
  // experts are not all full-width MCG EXL3 of one K.
  FusedMoe* FusedFor(const std::vector<ExpertWeights>& experts, float limit, int topk);
  // Routed experts of a prefill chunk (model_ops_moe.cu): the n x k (row, slot) pairs sorted by expert on
  // the device, all of them in one launch of the routed-expert kernel (Exl3MoeForwardSorted: each expert
  // decoded once per 16 of its pairs), the pairs' outputs (routing weight applied) summed back into their
  // rows in slot order. No host sync. The workspace is shared by the layers (same stream) and grows with
  // the largest chunk (outside any capture: prefill chunks run eagerly). Run calls it on parts of at most
  // kMoeSortMaxPairs pairs.
  void SortedPairs(const Tensor& x, const Tensor& idx, const Tensor& weight, FusedMoe& fused, Tensor* out);
  // One expert of the per-expert path on its rows (gathered, run, scattered back with their weights).
  void RunExpert(const Tensor& x, const std::vector<int32_t>& rows, const std::vector<float>& wts,
                 const ExpertWeights& e, float limit, Tensor* out, Backend& ops);

  std::shared_ptr<StreamContext> ctx_;
  StepArena& arena_;
  Exl3Weights& exl3_;
  CudaBackendCounters& counters_;
  const CudaBackendOptions::PrefillMoe prefill_;
  const Exl3MoeTuning tuning_;
  std::mutex moe_mu_;
  // Keyed by the experts vector (it lives as long as the model's weights), top-k and clamp limit.
  std::map<std::tuple<const void*, int, float>, std::unique_ptr<FusedMoe>> fused_;
  std::unique_ptr<Exl3MoeWorkspace> sorted_ws_;  // SortedPairs' (grown to the largest chunk)
  bool logged_many_rows_ = false, logged_sorted_pairs_ = false;
};

}  // namespace dsmesh
