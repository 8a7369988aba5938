// Dense EXL3 linear on the GPU for prefill chunks: y[m, n] = x[m, k] W for any m up to the workspace's
// max_m (meant for m > 16; the GEMV in exl3_gemv.h is the decode path). Three steps on one stream:
//   1. one launch decodes Ŵ (fp16, bit-exact with exllamav3's `reconstruct`) into a scratch buffer and,
//      in the same launch, computes xh = Hk(x * suh) (fp16),
//   2. cuBLAS: yp = xh Ŵ (fp16 tensor cores, fp32 accumulate, fp32 yp),
//   3. y = Hn(yp) * svh (fp32 or fp16 out).
// The decode costs one write and one read of k*n fp16 per call; at m = 512 that is small next to the
// GEMM itself (NOTES.md has the rate against cuBLAS bf16 on the same shapes).
//
//   Exl3GemmWorkspace ws(512, 8192, 32768, 8192LL * 4096);   // once per stream, before any capture
//   Exl3Gemm(linear, x_fp16, m, y, Exl3Out::kF32, ws, stream);
//
// Nothing is allocated, tuned or synchronized during a call (cuBLAS gets the workspace's own scratch),
// so calls can be captured into a CUDA graph. Results are bitwise reproducible run to run on the same
// GPU and cuBLAS version (cuBLAS GEMMs are deterministic there; no float atomics in our kernels).
// CPU reference: kernels/exl3/exl3_linear.h (Exl3LinearCpu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/exl3_gemv.h"

namespace dsmesh {

class Exl3GemmWorkspace {
 public:
  // Scratch for calls with m <= max_m, k <= max_k, n <= max_n and k * n <= max_weights (device memory:
  // 2 max_weights + 2 max_m max_k + 4 max_m max_n bytes, plus 32 MiB for cuBLAS), on the current device.
  Exl3GemmWorkspace(int max_m, int64_t max_k, int64_t max_n, int64_t max_weights);
  ~Exl3GemmWorkspace();
  Exl3GemmWorkspace(const Exl3GemmWorkspace&) = delete;
  Exl3GemmWorkspace& operator=(const Exl3GemmWorkspace&) = delete;

  int max_m() const { return max_m_; }

 private:
  friend void Exl3Gemm(const Exl3DeviceLinear&, const uint16_t*, int, void*, Exl3Out, Exl3GemmWorkspace&,
                       cudaStream_t);
  int max_m_;
  int64_t max_k_, max_n_, max_weights_;
  int device_ = 0;
  void* cublas_ = nullptr;  // cublasHandle_t (kept out of this header)
  void* cublas_scratch_ = nullptr;
  uint16_t* what_ = nullptr;  // fp16 [k, n]
  uint16_t* xh_ = nullptr;    // fp16 [m, k]
  float* yp_ = nullptr;       // fp32 [m, n]
  bool bound_ = false;
  cudaStream_t stream_ = nullptr;
};

// y[m, n] (fp32 or fp16, row-major, 16-byte aligned) = x[m, k] (fp16 bit patterns, row-major) W.
// Throws std::runtime_error naming the linear on bad shapes, pointers, a too-small workspace, a
// workspace used on a second stream, or a launch/cuBLAS error.
void Exl3Gemm(const Exl3DeviceLinear& w, const uint16_t* x, int m, void* y, Exl3Out out, Exl3GemmWorkspace& ws,
              cudaStream_t stream);

}  // namespace dsmesh
