// The prefill GEMM's weight kernel (exl3_gemm_kernels.h): W_eff = Ŵ Hn diag(svh) in fp16, plus, in
// extra CTAs of the same launch, xh = Hk(x * suh).
//
// One warp per item = one tile row of one 128-column block: 16 rows x 128 columns = the 8 trellis tiles
// (i, 8 jb .. 8 jb + 7), which are contiguous in the trellis. H128 = H8 (x) H16 over column bits 4..6
// (the tile index q) and 0..3 (the column inside a tile), so the warp
//   1. issues the loads of all 8 tiles, then decodes them with the GEMV's per-lane decode
//      (DecodeTileLane): lane L holds rows 2(L%4) + {0, 1} (+8) of columns L/4 (+8) of each tile;
//   2. runs the 16-point Hadamard over each tile's columns on the tensor cores: Ŵ tile (16x16) x H16,
//      one mma.m16n8k16 pair per tile, fp16 in (Ŵ is exact in fp16, H16 is +-1, so the products are
//      exact) and fp32 accumulate. The decoded fragments are the transpose of an A operand, so
//      movmatrix.trans turns each 8x8 block into A's layout first;
//   3. runs the 8-point butterflies over q in fp32 registers: after the mma the lane holds the same
//      (row, column-in-tile) of all 8 tiles;
//   4. multiplies by 1/sqrt(128) * svh, rounds to fp16 once, and stores through a small fp16 staging
//      tile so that each lane writes 16 bytes (half a warp covers one row's 256 bytes: whole lines).
// The butterflies are the same Sylvester-ordered H128 as Hadamard128Warp (lower index a+b, upper a-b),
// applied bit by bit in another order, so the result equals OutputHadamard128 on each row of Ŵ up to
// fp32 rounding (checked against an fp64 reference in exl3_gemm_test).
// Measured alternative (docs/cuda-kernels.md, "Prefill GEMM"): all 7 stages on CUDA cores with an fp32 shared-memory
// transpose moved the same bytes but took 35.7 us instead of 27.5 for wq_b K2 (plain Ŵ decode: 21.5),
// so the arithmetic, not the bandwidth, is what this kernel adds.
// CPU reference: the fp64 W_eff in exl3_gemm_test.cc (and for the whole linear, Exl3LinearCpu).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/exl3_device.cuh"
#include "kernels/cuda/exl3_gemm_kernels.h"

namespace dsmesh::exl3cuda {
namespace {

// In-register Sylvester Hadamard (unscaled) over the index bits of v[0..N).
template <int N>
__device__ __forceinline__ void HadamardRegs(float* v) {
#pragma unroll
  for (int h = 1; h < N; h <<= 1)
#pragma unroll
    for (int t = 0; t < N / 2; ++t) {  // pair t: j has bit h clear, j + h is its partner
      const int j = (t / h) * 2 * h + t % h;
      const float a = v[j], b = v[j + h];
      v[j] = a + b;
      v[j + h] = a - b;
    }
}

constexpr int kWarps = 8;  // per CTA: 8 x 4.3 KB staging, 80 registers, 3 CTAs per SM
constexpr int kOutStride = 136;  // fp16 per staged output row (+16 bytes: conflict-free half2 stores)

__device__ __forceinline__ uint32_t MovTrans(uint32_t a) {
  uint32_t d;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
  return d;
}

// fp16 bits of the unscaled Sylvester Hadamard entry H16[a][b] = (-1)^popcount(a & b).
__device__ __forceinline__ uint32_t HEntry(int a, int b) { return (__popc(a & b) & 1) ? 0xBC00u : 0x3C00u; }

template <int K, int CB>
__global__ void __launch_bounds__(kWarps * 32, 3) Exl3GemmWeightKernel(const GemmWeightParams p, int input_blocks) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (static_cast<int>(blockIdx.x) < input_blocks) {
    PrefillInputTransformWarp(p.x, p.suh, p.xh, p.m, p.k, (int64_t)blockIdx.x * kWarps + warp, lane);
    return;
  }
  __shared__ __align__(16) uint16_t staged[kWarps][16 * kOutStride];
  const int nb = p.n >> 7;
  const int64_t items = (int64_t)(p.k >> 4) * nb;
  const int64_t item = (int64_t)(blockIdx.x - input_blocks) * kWarps + warp;
  if (item >= items) return;  // whole warps only; no CTA-wide barrier below
  const int64_t ti = item / nb;
  const int jb = static_cast<int>(item - ti * nb);

  const LaneTileGeom geom = MakeLaneTileGeom<K>(lane);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(p.trellis) + (ti * (p.n >> 4) + jb * 8) * (8 * K);
  uint32_t frag[8][4];
#pragma unroll
  for (int q = 0; q < 8; ++q) DecodeTileLane<K, CB>(words + q * 8 * K, geom, p.one << K, frag[q]);

  // Overflow is only possible where some |svh| of this block exceeds kWeffSafeSvh: one vote decides
  // whether the staged outputs get checked (exl3_gemm_kernels.h).
  const __half* svh = reinterpret_cast<const __half*>(p.svh) + jb * 128;
  bool check = false;
  if (p.saturated) {
    const uint2 sr = *reinterpret_cast<const uint2*>(svh + lane * 4);
    const half2 s0 = *reinterpret_cast<const half2*>(&sr.x), s1 = *reinterpret_cast<const half2*>(&sr.y);
    const float mx = fmaxf(fmaxf(fabsf(__low2float(s0)), fabsf(__high2float(s0))),
                           fmaxf(fabsf(__low2float(s1)), fabsf(__high2float(s1))));
    check = __any_sync(0xFFFFFFFFu, !(mx <= kWeffSafeSvh));
  }

  const int g = lane >> 2, t4 = lane & 3;
  uint32_t a[8][4];
#pragma unroll
  for (int q = 0; q < 8; ++q)
#pragma unroll
    for (int f = 0; f < 4; ++f) a[q][f] = MovTrans(frag[q][f]);  // frag f: rows +8(f%2), cols +8(f/2) = A reg f

  uint16_t* st = staged[warp];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    // B = columns 8j..8j+7 of H16: b0 = rows 2 t4 + {0, 1}, b1 = rows 2 t4 + 8 + {0, 1}, column 8j + g.
    const int hc = 8 * j + g;
    const uint32_t b0 = HEntry(2 * t4, hc) | HEntry(2 * t4 + 1, hc) << 16;
    const uint32_t b1 = HEntry(2 * t4 + 8, hc) | HEntry(2 * t4 + 9, hc) << 16;
    float c[8][4];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      c[q][0] = c[q][1] = c[q][2] = c[q][3] = 0.f;
      Mma16816(c[q], a[q][0], a[q][1], a[q][2], a[q][3], b0, b1);
    }
    // c[q]: rows g (0, 1) and g + 8 (2, 3) of columns 16q + 8j + 2 t4 + {0, 1}: butterflies over q.
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) v[q] = c[q][e];
      HadamardRegs<8>(v);
#pragma unroll
      for (int q = 0; q < 8; ++q) c[q][e] = v[q];
    }
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const int col = 16 * q + 8 * j + 2 * t4;
      const half2 s = *reinterpret_cast<const half2*>(svh + col);
      const float s0 = kHadScale * __low2float(s), s1 = kHadScale * __high2float(s);
      const half2 top = __floats2half2_rn(c[q][0] * s0, c[q][1] * s1);
      const half2 bottom = __floats2half2_rn(c[q][2] * s0, c[q][3] * s1);
      // Word (row * 68 + col / 2): bank 4 g + t4 + const, 32 distinct banks per store.
      *reinterpret_cast<half2*>(st + g * kOutStride + col) = top;
      *reinterpret_cast<half2*>(st + (g + 8) * kOutStride + col) = bottom;
    }
  }
  __syncwarp();
  const int cg = lane & 15;
  uint16_t* out = p.weff + (ti * 16) * (int64_t)p.n + jb * 128 + cg * 8;
  unsigned int overflowed = 0;
#pragma unroll
  for (int it = 0; it < 8; ++it) {
    const int r = 2 * it + (lane >> 4);
    const uint4 v = *reinterpret_cast<const uint4*>(st + r * kOutStride + cg * 8);
    if (check) {  // fp16 inf or NaN: exponent field all ones
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) overflowed += ((w[i] & 0x7C00u) == 0x7C00u) + ((w[i] & 0x7C000000u) == 0x7C000000u);
    }
    *reinterpret_cast<uint4*>(out + (int64_t)r * p.n) = v;
  }
  if (check && overflowed) atomicAdd(p.saturated, overflowed);
}

template <int CB>
int LaunchForCodebook(int K, const GemmWeightParams& p, unsigned grid, int input_blocks, cudaStream_t s) {
  return DispatchK(K, static_cast<int>(cudaErrorInvalidValue), [&](auto k) {
    Exl3GemmWeightKernel<decltype(k)::value, CB><<<grid, kWarps * 32, 0, s>>>(p, input_blocks);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace

int LaunchGemmWeight(int K, int codebook, const GemmWeightParams& p, void* stream) {
  if (p.k <= 0 || p.n <= 0 || p.k % 128 || p.n % 128) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t items = (int64_t)(p.k / 16) * (p.n / 128);
  // The first CTAs do the input transform, one warp per (row, 128-block) of x.
  const int input_blocks = p.x ? (int)(((int64_t)p.m * (p.k / 128) + kWarps - 1) / kWarps) : 0;
  const unsigned grid = (unsigned)((items + kWarps - 1) / kWarps + input_blocks);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (codebook) {
    case kCb3Inst: return LaunchForCodebook<kCb3Inst>(K, p, grid, input_blocks, s);
    case kCbMcg: return LaunchForCodebook<kCbMcg>(K, p, grid, input_blocks, s);
    case kCbMul1: return LaunchForCodebook<kCbMul1>(K, p, grid, input_blocks, s);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace dsmesh::exl3cuda
