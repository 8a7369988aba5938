#include <cuda_fp16.h>

#include "kernels/cuda/synthetic_exl3_kernels.h"
#include "kernels/exl3/synthetic_hash.h"

namespace dsmesh {
namespace {

__global__ void TrellisKernel(uint16_t* trellis, int64_t i0, int64_t j0, int64_t sub_tiles_n, int64_t tiles_n,
                              int K, uint64_t seed, int64_t words) {
  const int64_t per_tile = 16LL * K;
  for (int64_t x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < words; x += (int64_t)gridDim.x * blockDim.x) {
    const int64_t tile = x / per_tile, w = x % per_tile;
    const int64_t i = i0 + tile / sub_tiles_n, j = j0 + tile % sub_tiles_n;
    trellis[x] = SyntheticTrellisWord(seed, i, j, tiles_n, K, static_cast<int>(w));
  }
}

__global__ void ScaleKernel(uint16_t* out, int64_t begin, int64_t count, uint64_t seed, int which, float magnitude) {
  for (int64_t x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < count; x += (int64_t)gridDim.x * blockDim.x)
    out[x] = __half_as_ushort(__float2half_rn(SyntheticSign(seed, which, begin + x) * magnitude));
}

unsigned Grid(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65536 ? 65536 : b));
}

}  // namespace

void FillSyntheticExl3Block(uint16_t* trellis, uint16_t* suh, uint16_t* svh, int64_t k0, int64_t k1, int64_t n0,
                            int64_t n1, int64_t full_k, int64_t full_n, int K, uint64_t seed, cudaStream_t stream) {
  const int64_t sub_tiles_n = (n1 - n0) / 16, words = (k1 - k0) / 16 * sub_tiles_n * 16 * K;
  TrellisKernel<<<Grid(words), 256, 0, stream>>>(trellis, k0 / 16, n0 / 16, sub_tiles_n, full_n / 16, K, seed, words);
  ScaleKernel<<<Grid(k1 - k0), 256, 0, stream>>>(suh, k0, k1 - k0, seed, 0, SyntheticSuhScale(full_k));
  ScaleKernel<<<Grid(n1 - n0), 256, 0, stream>>>(svh, n0, n1 - n0, seed, 1, 1.0f);
}

}  // namespace dsmesh
