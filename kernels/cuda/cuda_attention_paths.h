// The kernel one sequence's attention (Backend::Attention) takes on the device, and its launch: decode
// steps (at most kGraphMaxRows rows) the split kernel; prefill chunks the tensor-core kernel
// (cuda_ops::AttentionPrefill, fp16 high + low operand parts or with kMmaFp16 plain fp16) unless
// CudaBackendOptions::prefill_attention asks for an f32 kernel (split over keys, or one block per
// (row, head)) or the head_dim / device has no tensor-core kernel (then the split one). The prefill path
// is logged once. It lives apart from the op dispatch because the attention paths grow here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/tensor.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_step_arena.h"

namespace dsmesh {

class AttentionPaths {
 public:
  AttentionPaths(StepArena& arena, CudaBackendOptions::PrefillAttention prefill) : arena_(arena), prefill_(prefill) {}
  AttentionPaths(const AttentionPaths&) = delete;
  AttentionPaths& operator=(const AttentionPaths&) = delete;

  // Backend::Attention's launches on `stream` (shapes checked by the caller, the backend's device current):
  // the entries' block table staged, the kernel chosen, the launch checked. A prefill chunk on tensor cores
  // is StepArena::Unrecordable (its launch takes its parameters by value).
  void Run(const Tensor& q, int64_t heads, int64_t d, int64_t start, const Tensor& ring, const Tensor& new_kv,
           int window, const PagedRows* entries, int64_t num_entries, int ratio, const Tensor* topk,
           const Tensor& sinks, float softmax_scale, Tensor* out, cudaStream_t stream);

 private:
  StepArena& arena_;
  const CudaBackendOptions::PrefillAttention prefill_;
  bool logged_prefill_ = false;
};

}  // namespace dsmesh
