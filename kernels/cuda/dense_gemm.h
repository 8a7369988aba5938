// Dense linears of many rows (prefill chunks) through cuBLAS SGEMM: out[m, n] = x[m, k] W^T for a bf16 or
// fp16 weight W [n, k], computed in fp32 from an fp32 copy of W widened into the caller's scratch on each
// call (the router's gate and the indexer's weights_proj: 4 MiB and 1 MiB at V4-Flash's sizes, a few
// microseconds). The hand-written tiled kernel (model_ops_linear.cu) gives such shapes only n/64 x m/64
// blocks (32 for the gate at 512 rows) each walking all of k; cuBLAS picks a split for them.
//
//   DenseGemm gemm;                                  // per backend (one cuBLAS handle, made on first use)
//   if (!DenseGemm::Takes(type, n, k) || !gemm.Run(x, ldx, m, w, type, n, k, scratch, out, ldo, stream)) ...
//
// Not for captured steps (the first call creates the handle).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "kernels/cuda/model_ops.h"

namespace dsmesh {

class DenseGemm {
 public:
  // Largest weight (elements) copied to fp32; bigger ones (the head) stay on the kernel path.
  static constexpr int64_t kMaxWeightElements = int64_t{16} << 20;

  DenseGemm() = default;
  ~DenseGemm();
  DenseGemm(const DenseGemm&) = delete;
  DenseGemm& operator=(const DenseGemm&) = delete;

  // Whether Run takes such a weight (bf16/fp16, at most kMaxWeightElements).
  static bool Takes(cuda_ops::WType type, int64_t n, int64_t k) {
    return type != cuda_ops::WType::kF32 && n * k <= kMaxWeightElements;
  }
  // w_scratch: n * k floats of device memory for the widened weight. Returns false (nothing done) when
  // !Takes(type, n, k) or m <= 0; throws on a cuBLAS or CUDA error.
  bool Run(const float* x, int64_t ldx, int64_t m, const void* w, cuda_ops::WType type, int64_t n, int64_t k,
           float* w_scratch, float* out, int64_t ldo, cudaStream_t stream);

 private:
  std::mutex mu_;
  void* handle_ = nullptr;  // cublasHandle_t
  void* scratch_ = nullptr;
};

}  // namespace dsmesh
