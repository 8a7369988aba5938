// Dense linears of many rows (prefill chunks) through cuBLAS SGEMM: out[m, n] = x[m, k] W^T for a bf16 or
// fp16 weight W [n, k], computed in fp32 from an fp32 copy of W made on first use and kept (the router's
// gate and the indexer's weights_proj: 4 MiB and 1 MiB per layer at V4-Flash's sizes). The hand-written
// tiled kernel (model_ops_linear.cu) gives such shapes only n/64 x m/64 blocks (32 for the gate at 512
// rows) each walking all of k; cuBLAS picks a split for them.
//
//   DenseGemm gemm;                                  // per backend (one cuBLAS handle)
//   if (!gemm.Run(x, ldx, m, w, type, n, k, out, ldo, stream)) { ... the kernel path ... }
//
// Not for captured steps: a first use allocates the weight copy and synchronizes the stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
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

  // False (nothing done) when the weight is fp32 or too big; throws on a cuBLAS or CUDA error.
  bool Run(const float* x, int64_t ldx, int64_t m, const void* w, cuda_ops::WType type, int64_t n, int64_t k,
           float* out, int64_t ldo, cudaStream_t stream);

  int64_t copied_bytes() const { return copied_bytes_; }
  int64_t calls() const { return calls_; }

 private:
  const float* Widened(const void* w, cuda_ops::WType type, int64_t count, cudaStream_t stream);

  std::mutex mu_;
  void* handle_ = nullptr;  // cublasHandle_t
  void* scratch_ = nullptr;
  std::map<const void*, float*> copies_;
  int64_t copied_bytes_ = 0, calls_ = 0;
};

}  // namespace dsmesh
