// Device helpers of dsmesh-kernel-bench: fill buffers with pseudo-random words on the GPU (random int16
// is a valid EXL3 trellis) and a plain integer-throughput probe.
#include <cuda_runtime.h>

#include <cstdint>

namespace dsmesh::bench {

__global__ void FillRandomKernel(uint32_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B9u ^ seed ^ static_cast<uint32_t>(i >> 32) * 0x85EBCA6Bu;
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    p[i] = x;
  }
}

int FillRandom(void* p, int64_t words, uint32_t seed, cudaStream_t s) {
  FillRandomKernel<<<1024, 256, 0, s>>>(static_cast<uint32_t*>(p), words, seed);
  return static_cast<int>(cudaGetLastError());
}

// Eight independent LOP3 chains per thread (the anchors' method): ops = threads * iters * 8.
__global__ void Lop3ChainKernel(uint32_t* out, int iters, uint32_t seed) {
  uint32_t v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = seed + threadIdx.x * 8 + i;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) asm volatile("lop3.b32 %0, %0, %1, %2, 0x6A;" : "+r"(v[i]) : "r"(v[(i + 1) & 7]), "n"(0x3B603B60));
  }
  uint32_t acc = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) acc ^= v[i];
  if (acc == 0x12345678u) out[0] = acc;
}

int Lop3Chains(uint32_t* out, int blocks, int iters, cudaStream_t s) {
  Lop3ChainKernel<<<blocks, 256, 0, s>>>(out, iters, 1);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace dsmesh::bench

namespace dsmesh::bench {

// Random bf16 values of magnitude 2^-7..2 with random signs (a cuBLAS baseline on realistic bits:
// random words would include NaNs and infinities).
__global__ void FillRandomBf16Kernel(uint16_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B9u ^ seed;
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    p[i] = static_cast<uint16_t>((x & 0x807Fu) | ((0x78u + ((x >> 8) & 7u)) << 7));
  }
}

int FillRandomBf16(void* p, int64_t count, uint32_t seed, cudaStream_t s) {
  FillRandomBf16Kernel<<<1024, 256, 0, s>>>(static_cast<uint16_t*>(p), count, seed);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace dsmesh::bench

namespace dsmesh::bench {

// The cost of a kernel boundary inside a CUDA graph: a grid like the GEMV's (blocks x 256 threads)
// that does nothing but keep its launch from being optimized away. Small GEMVs are measured against it.
__global__ void EmptyKernel(int* sink, int value) {
  if (value == 0x7fffffff && threadIdx.x == 0) sink[blockIdx.x] = value;
}

int EmptyLaunch(int* sink, int blocks, cudaStream_t s) {
  EmptyKernel<<<blocks, 256, 0, s>>>(sink, 1);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace dsmesh::bench
