// Device helpers shared by the model_ops kernels: element loads of the weight types, warp and block
// reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace dsmesh::cuda_ops {

template <class T>
__device__ __forceinline__ float Load(const T* p, int64_t i);
template <>
__device__ __forceinline__ float Load<float>(const float* p, int64_t i) { return p[i]; }
template <>
__device__ __forceinline__ float Load<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
template <>
__device__ __forceinline__ float Load<__half>(const __half* p, int64_t i) { return __half2float(p[i]); }

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum (kMax = false) or max; blockDim.x a multiple of 32, <= 1024; every thread gets the
// result. Safe to call repeatedly (it waits for the previous call's readers first).
template <bool kMax>
__device__ float BlockReduce(float v) {
  __shared__ float part[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = kMax ? WarpMax(v) : WarpSum(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < static_cast<int>(blockDim.x >> 5) ? part[lane] : (kMax ? -INFINITY : 0.0f);
    t = kMax ? WarpMax(t) : WarpSum(t);
    if (lane == 0) total = t;
  }
  __syncthreads();
  return total;
}
__device__ __forceinline__ float BlockSum(float v) { return BlockReduce<false>(v); }

}  // namespace dsmesh::cuda_ops
