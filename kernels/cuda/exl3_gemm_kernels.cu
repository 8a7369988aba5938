// The prefill GEMM's output transform (exl3_gemm.h): y = Hn(yp) * svh per 128-column block, one warp per
// (row, block), with the same Hadamard, scale and svh rounding as the GEMV's epilogue (exl3_device.cuh).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/exl3_device.cuh"
#include "kernels/cuda/exl3_gemv_params.h"

namespace dsmesh::exl3cuda {

__global__ void __launch_bounds__(256) Exl3GemmOutputKernel(const float* yp, const uint16_t* svh, void* y, int m, int n,
                                                          int y_fp16) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nb = n >> 7;
  const int64_t t = (int64_t)blockIdx.x * 8 + warp;
  if (t >= (int64_t)m * nb) return;
  const int64_t row = t / nb, b = t - row * nb;
  const int64_t ofs = row * n + b * 128 + lane * 4;
  const float4 o = __ldcs(reinterpret_cast<const float4*>(yp + ofs));  // read once: don't keep it in L2
  float v[4] = {o.x, o.y, o.z, o.w};
  OutputHadamard128(v, reinterpret_cast<const __half*>(svh) + b * 128 + lane * 4, lane);
  if (y_fp16) {
    const half2 h0 = __floats2half2_rn(v[0], v[1]), h1 = __floats2half2_rn(v[2], v[3]);
    uint2 u;
    u.x = *reinterpret_cast<const uint32_t*>(&h0);
    u.y = *reinterpret_cast<const uint32_t*>(&h1);
    *reinterpret_cast<uint2*>(reinterpret_cast<__half*>(y) + ofs) = u;
  } else {
    *reinterpret_cast<float4*>(reinterpret_cast<float*>(y) + ofs) = make_float4(v[0], v[1], v[2], v[3]);
  }
}

int LaunchGemmOutput(const float* yp, const uint16_t* svh, void* y, int m, int n, int y_fp16, void* stream) {
  const int64_t warps = (int64_t)m * (n / 128);
  Exl3GemmOutputKernel<<<(unsigned)((warps + 7) / 8), 256, 0, static_cast<cudaStream_t>(stream)>>>(yp, svh, y, m, n,
                                                                                                  y_fp16);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace dsmesh::exl3cuda
