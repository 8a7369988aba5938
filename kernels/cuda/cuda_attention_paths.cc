#include "kernels/cuda/cuda_attention_paths.h"

#include <cstdio>

#include "kernels/cuda/cuda_backend_util.h"
#include "kernels/cuda/model_ops.h"

namespace dsmesh {

using PrefillAttention = CudaBackendOptions::PrefillAttention;

void AttentionPaths::Run(const Tensor& q, int64_t heads, int64_t d, int64_t start, const Tensor& ring,
                         const Tensor& new_kv, int window, const PagedRows* entries, int64_t num_entries, int ratio,
                         const Tensor* topk, const Tensor& sinks, float softmax_scale, Tensor* out,
                         cudaStream_t stream) {
  Tensor table;
  const cuda_ops::PagedRowsDev paged = entries ? arena_.Paged(*entries, num_entries, d, &table) : cuda_ops::PagedRowsDev{};
  // Prefill chunks (more rows than a decode bucket) take the tensor-core kernel unless the knob or the
  // head_dim / device says otherwise; decode steps the split kernel.
  const bool prefill = q.shape[0] > kGraphMaxRows;
  const PrefillAttention attention = prefill_;
  const bool fp16 = attention == PrefillAttention::kMmaFp16;
  const bool mma = prefill && (fp16 || attention == PrefillAttention::kMma) &&
                   cuda_ops::AttentionPrefillSupported(d, fp16);
  if (prefill && !logged_prefill_) {
    const char* path = mma && fp16 ? "tensor cores, fp16 operands, fp32 accumulation"
                       : mma       ? "tensor cores, fp16 high + low operand parts (3 mma per product), fp32 "
                                     "accumulation"
                       : attention == PrefillAttention::kPerRow ? "one block per (row, head), f32"
                       : attention == PrefillAttention::kSplit  ? "split over keys in 16-row slices, f32"
                                                                : "split over keys in 16-row slices, f32 (no "
                                                                  "tensor-core kernel for this head_dim on this "
                                                                  "device)";
    std::fprintf(stderr, "[cuda] prefill attention (steps of more than %d rows): %s (head_dim %lld)\n",
                 static_cast<int>(kGraphMaxRows), path, static_cast<long long>(d));
    logged_prefill_ = true;
  }
  if (mma) {
    arena_.Unrecordable("Attention", "a prefill chunk");
    cuda_ops::AttentionPrefill(F(q), q.shape[0], heads, d, start, F(ring), ring.shape[0], F(new_kv), window, paged,
                               num_entries, ratio, topk ? I32(*topk) : nullptr, topk ? RowWidth(*topk) : 0, F(sinks),
                               softmax_scale, fp16, F(*out), stream);
    CheckLaunch("Attention");
    return;
  }
  const bool split_keys = !prefill || attention != PrefillAttention::kPerRow;
  const int64_t split_floats = split_keys ? cuda_ops::AttentionSplitScratchFloats(q.shape[0], heads, d) : 0;
  Tensor split = split_floats > 0 ? arena_.Temp(DType::kF32, {split_floats}) : Tensor{};
  cuda_ops::Attention(F(q), q.shape[0], heads, d, start, F(ring), ring.shape[0], F(new_kv), window,
                      paged, num_entries, ratio,
                      topk ? I32(*topk) : nullptr, topk ? RowWidth(*topk) : 0, F(sinks), softmax_scale, F(*out),
                      split_floats > 0 ? F(split) : nullptr, arena_.stager(), stream);
  CheckLaunch("Attention");
}

}  // namespace dsmesh
