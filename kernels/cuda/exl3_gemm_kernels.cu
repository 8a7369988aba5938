// The prefill GEMM's output transform (exl3_gemm.h): y = Hn(yp) * svh per 128-column block, one warp per
// (row, block), with the same Hadamard, scale and svh rounding as the GEMV's epilogue (exl3_device.cuh).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/exl3_device.cuh"
#include "kernels/cuda/exl3_gemv_params.h"

namespace dsmesh::exl3cuda {

// Each warp takes kItems consecutive (row, block) items and issues all their loads first (more bytes
// in flight per warp: this launch is memory-bound).
constexpr int kItems = 4;

__global__ void __launch_bounds__(256) Exl3GemmOutputKernel(const float* yp, const uint16_t* svh, void* y, int m, int n,
                                                          int y_fp16) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nb = n >> 7;
  const int64_t total = (int64_t)m * nb;
  const int64_t t0 = ((int64_t)blockIdx.x * 8 + warp) * kItems;
  float v[kItems][4];
#pragma unroll
  for (int q = 0; q < kItems; ++q) {
    const int64_t t = t0 + q;
    if (t < total) {
      const int64_t row = t / nb, b = t - row * nb;
      const float4 o = __ldcs(reinterpret_cast<const float4*>(yp + row * n + b * 128 + lane * 4));  // read once
      v[q][0] = o.x;
      v[q][1] = o.y;
      v[q][2] = o.z;
      v[q][3] = o.w;
    }
  }
#pragma unroll
  for (int q = 0; q < kItems; ++q) {
    const int64_t t = t0 + q;
    if (t >= total) break;  // warp-uniform
    const int64_t row = t / nb, b = t - row * nb;
    const int64_t ofs = row * n + b * 128 + lane * 4;
    OutputHadamard128(v[q], reinterpret_cast<const __half*>(svh) + b * 128 + lane * 4, lane);
    if (y_fp16) {
      const half2 h0 = __floats2half2_rn(v[q][0], v[q][1]), h1 = __floats2half2_rn(v[q][2], v[q][3]);
      uint2 u;
      u.x = *reinterpret_cast<const uint32_t*>(&h0);
      u.y = *reinterpret_cast<const uint32_t*>(&h1);
      *reinterpret_cast<uint2*>(reinterpret_cast<__half*>(y) + ofs) = u;
    } else {
      *reinterpret_cast<float4*>(reinterpret_cast<float*>(y) + ofs) = make_float4(v[q][0], v[q][1], v[q][2], v[q][3]);
    }
  }
}

int LaunchGemmOutput(const float* yp, const uint16_t* svh, void* y, int m, int n, int y_fp16, void* stream) {
  const int64_t warps = ((int64_t)m * (n / 128) + kItems - 1) / kItems;
  Exl3GemmOutputKernel<<<(unsigned)((warps + 7) / 8), 256, 0, static_cast<cudaStream_t>(stream)>>>(yp, svh, y, m, n,
                                                                                                  y_fp16);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace dsmesh::exl3cuda
