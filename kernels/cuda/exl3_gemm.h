// Dense EXL3 linear on the GPU for prefill chunks: y[m, n] = x[m, k] W for any m up to the workspace's
// max_m (meant for m > 16; the GEMV in exl3_gemv.h is the decode path). Two steps on one stream:
//   1. one launch writes W_eff = Ŵ Hn diag(svh) (fp16 [k, n]: the trellis-decoded Ŵ with the output
//      Hadamard and svh folded into its rows, computed in fp32, one fp16 rounding) into a scratch
//      buffer and, in the same launch, xh = Hk(x * suh) (fp16);
//   2. cuBLAS: y = xh W_eff (fp16 tensor cores, fp32 accumulate), written straight into y as fp32 or
//      fp16: y = (xh Ŵ) Hn diag(svh) = xh (Ŵ Hn diag(svh)), so no output pass is needed.
// The weight scratch costs one write and one read of k*n fp16 per call; at m = 512 that is small next
// to the GEMM itself (docs/cuda-kernels.md has the rate against cuBLAS bf16 on the same shapes).
// Precision: W_eff adds one fp16 rounding per weight (~2^-12 relative) to what the GEMV computes; rows
// stay within rel L2 2e-3 of the fp64 reference (exl3_gemm_test). Overflow of W_eff in fp16 is
// impossible for |svh| <= 1447 (exl3_gemm_kernels.h); beyond that the kernel counts saturated weights
// (Exl3GemmWorkspace::SaturatedWeights) and the affected outputs come out inf/NaN, never silently finite.
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
  // 2 max_weights + 2 max_m max_k bytes, plus 32 MiB for cuBLAS), on the current device. max_n only
  // bounds the shapes accepted (no buffer scales with it).
  Exl3GemmWorkspace(int max_m, int64_t max_k, int64_t max_n, int64_t max_weights);
  ~Exl3GemmWorkspace();
  Exl3GemmWorkspace(const Exl3GemmWorkspace&) = delete;
  Exl3GemmWorkspace& operator=(const Exl3GemmWorkspace&) = delete;

  int max_m() const { return max_m_; }

  // Number of W_eff elements that overflowed fp16 in all calls so far (0 unless some |svh| > 1447;
  // exl3_gemm_kernels.h). Synchronizes the device: for health checks and tests, not inside a capture.
  uint64_t SaturatedWeights() const;

 private:
  friend void Exl3Gemm(const Exl3DeviceLinear&, const uint16_t*, int, void*, Exl3Out, Exl3GemmWorkspace&,
                       cudaStream_t);
  int max_m_;
  int64_t max_k_, max_n_, max_weights_;
  int device_ = 0;
  void* cublas_ = nullptr;  // cublasHandle_t (kept out of this header)
  void* cublas_scratch_ = nullptr;
  uint16_t* weff_ = nullptr;          // fp16 [k, n], W_eff = Ŵ Hn diag(svh)
  uint16_t* xh_ = nullptr;            // fp16 [m, k]
  unsigned int* saturated_ = nullptr;  // device counter of W_eff elements that overflowed fp16
  bool bound_ = false;
  cudaStream_t stream_ = nullptr;
};

// y[m, n] (fp32 or fp16, row-major, 16-byte aligned) = x[m, k] (fp16 bit patterns, row-major) W.
// Throws std::runtime_error naming the linear on bad shapes, pointers, a too-small workspace, a
// workspace used on a second stream, or a launch/cuBLAS error.
void Exl3Gemm(const Exl3DeviceLinear& w, const uint16_t* x, int m, void* y, Exl3Out out, Exl3GemmWorkspace& ws,
              cudaStream_t stream);

}  // namespace dsmesh
