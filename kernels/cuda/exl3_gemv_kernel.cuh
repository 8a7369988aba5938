// The dense EXL3 GEMV kernel: y[m, n] = x[m, k] W for m <= 16, both Hadamard transforms fused.
//
// Grid (strips of every job of the batch, splits). CTA (strip, split) of its job owns output columns [128 strip, 128 strip + 128) and input
// channels of whole 128-blocks [kb0, kb1). It
//   1. starts streaming its trellis tiles (cp.async ring),
//   2. computes its slice of x' = Hk (x * suh) into shared memory (fp16, the MMA A operand),
//   3. decodes and multiplies (TileGemv), reducing the 8 warps' k-splits in a fixed order,
//   4. with one split: applies the output Hadamard and svh and writes y; with several: writes its fp32
//      partial, and the last CTA to arrive on the strip (atomic counter) sums all partials in a fixed
//      order (split order, or for few rows interleaved groups of splits added in group order), so the
//      result does not depend on arrival order, applies the output Hadamard and
//      resets the counter for the next launch. No float atomics: outputs are bitwise reproducible.
// Launched with programmatic dependent launch (pdl_launch.cuh), step 1 and the svh load (weights only)
// overlap the previous kernel's tail: PdlWait() sits between them and the first read of x; PdlTrigger()
// after the main loop, so that the next kernel's CTAs start (and prefetch) while this one reduces and
// stores, but do not take SM slots and bandwidth from the weight stream before.
#pragma once

#include "kernels/cuda/exl3_gemv_params.h"
#include "kernels/cuda/exl3_tile_gemv.cuh"
#include "kernels/cuda/pdl_launch.cuh"

namespace dsmesh::exl3cuda {


// Writes one finished 128-column row slice (lane holds columns 4 lane .. 4 lane + 3) as fp32 or fp16, or
// adds it to the fp32 values there (y_accumulate: each output has one writer, so y + v in one rounding, as
// a separate Add would).
__device__ __forceinline__ void StoreGemvRow(const GemvParams& p, int row, int strip, int lane, const float v[4]) {
  const int64_t yofs = (int64_t)row * p.n + strip * 128 + lane * 4;
  if (p.y_fp16) {
    const half2 h0 = __floats2half2_rn(v[0], v[1]), h1 = __floats2half2_rn(v[2], v[3]);
    uint2 u;
    u.x = *reinterpret_cast<const uint32_t*>(&h0);
    u.y = *reinterpret_cast<const uint32_t*>(&h1);
    *reinterpret_cast<uint2*>(reinterpret_cast<__half*>(p.y) + yofs) = u;
  } else {
    float4* y = reinterpret_cast<float4*>(reinterpret_cast<float*>(p.y) + yofs);
    float4 r = make_float4(v[0], v[1], v[2], v[3]);
    if (p.y_accumulate) {
      const float4 o = *y;
      r = make_float4(o.x + r.x, o.y + r.y, o.z + r.z, o.w + r.w);
    }
    *y = r;
  }
}

// kFew: the decode core's few-rows form (m <= 8, 3INST/MCG; UsesFewRowsLoop), one instantiation each so
// that each kernel holds one main loop (both in one kernel cost m = 16 2-5%: register allocation).
template <int K, int CB, bool kFew>
__global__ void __launch_bounds__(kThreads, 3) Exl3GemvKernel(const __grid_constant__ GemvBatch b) {
  extern __shared__ __align__(16) uint8_t smem[];
  int job = 0;  // uniform per CTA: at most kMaxJobs compares against the parameter bank
  while (job + 1 < b.jobs && static_cast<int>(blockIdx.x) >= b.strip_begin[job + 1]) ++job;
  const GemvParams& p = b.job[job];
  using Core = TileGemv<K, CB, 1>;
  uint8_t* ring = smem;
  __half* act = reinterpret_cast<__half*>(smem + RingBytes(K));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int strip = blockIdx.x - b.strip_begin[job], split = blockIdx.y;
  const int nblk = p.k >> 7;
  const int kb0 = split * nblk / p.splits, kb1 = (split + 1) * nblk / p.splits;
  const int nb = kb1 - kb0;
  const int m = p.m;
  const int64_t tiles_n = p.n >> 4;

  typename Core::Source src;
  src.row_stride = tiles_n * Core::kTileBytes;
  src.base[0] = reinterpret_cast<const uint8_t*>(p.trellis) +
                ((int64_t)kb0 * 8 * tiles_n + (int64_t)strip * 8) * Core::kTileBytes;
  const int KT = nb * 8;
  Core::Prologue(src, KT, ring);
  // The strip's svh goes to shared memory now, off the critical path: loaded at the end it would add
  // an L2 round trip after the split-K sum. The last warp rarely has an input-transform task.
  __shared__ uint2 s_svh[32];
  if (warp == kThreads / 32 - 1) s_svh[lane] = *reinterpret_cast<const uint2*>(reinterpret_cast<const __half*>(p.svh) + strip * 128 + lane * 4);
  // Above: weights only. Below: x (the previous kernel's output), then y, the partials and the counters.
  PdlWait();

  // x' = Hk (x * suh) for this CTA's input range, one warp per (row, 128-block).
  const __half* x = reinterpret_cast<const __half*>(p.x);
  const __half* suh = reinterpret_cast<const __half*>(p.suh);
  // Shuffle butterflies cost ~110 instructions per (row, block) and warp, the tensor-core version ~500
  // per block for all rows: the tensor cores take over when the busiest warp would have more than 5x
  // as many shuffle tasks as blocks (e.g. m = 16 x 8 blocks: 16 tasks per warp before, one block per
  // warp after; wq_b/wo_b m16 -6..8%). A threshold of 3x measured worse: m = 4 x 8 blocks +7..10%
  // (docs/bench/cuda-kernels/v8_dense_*.log).
  const int warps = kThreads / 32;
  if (5 * ((nb + warps - 1) / warps) < (m * nb + warps - 1) / warps) {
    for (int b = warp; b < nb; b += warps) {
      const int64_t kofs = (int64_t)(kb0 + b) * 128;
      InputHadamard128Rows16Mma(x + kofs, p.k, m, suh + kofs, act + b * 128, kGemvAStride, lane);
    }
  } else {
    InputHadamardTasks(warp, warps, m * nb, lane, [&](int t) {
      const int row = t / nb, b = t - row * nb;
      const int64_t kofs = (int64_t)(kb0 + b) * 128 + lane * 4;
      return InputTask{x + (int64_t)row * p.k + kofs, suh + kofs, act + row * kGemvAStride + b * 128 + lane * 4};
    });
  }

  float acc[Core::kAccTiles][2][4];
  const __half* a[1] = {act};
  Core::template Loop<kFew>(src, KT, a, kGemvAStride, m, ring, acc, p.one, false);
  PdlTrigger();
  float* out = reinterpret_cast<float*>(act);  // [m][128], the activations are no longer needed
  Core::ReduceOnePass(acc, m, reinterpret_cast<float*>(ring), out);

  const __half* svh = reinterpret_cast<const __half*>(s_svh + lane);  // published by MainLoop's first barrier
  if (p.splits > 1) {
    float* part = p.partial + (int64_t)split * m * p.n + strip * 128;
    for (int i = tid; i < m * 32; i += kThreads) {
      const int row = i >> 5, c = (i & 31) * 4;
      *reinterpret_cast<float4*>(part + (int64_t)row * p.n + c) = *reinterpret_cast<const float4*>(out + row * 128 + c);
    }
    // Publish the partial: the barrier orders every thread's stores before thread 0's arrival, an
    // acq_rel atomic at GPU scope: its release half makes the CTA's partial visible before the count
    // (cumulativity), its acquire half orders the last CTA's partial loads (L2, __ldcg, after the next
    // barrier) after every other CTA's release. One atomic per CTA and no fences
    // (measured 1.83x vs 1.78x geomean against fences in every thread or around a relaxed atomicAdd).
    __shared__ int s_last;
    __syncthreads();
    if (tid == 0) s_last = ArriveAcqRelGpu(p.counters + strip) == p.splits - 1;
    __syncthreads();
    if (!s_last) return;
    // Few rows and many splits (m1 with 16-32 splits): G thread groups each sum the splits g, g + G, ...
    // of one output (8 or more loads per thread, all in flight), then the G group sums are added in
    // group order: one L2 round trip where one warp summing all S splits in 8-load batches takes S / 8
    // (wkv/wq_a m1 -8%). Otherwise one thread per output sums the splits in split order (this unit-
    // stride loop measured faster than the batched one when G = 1). Either order is fixed: outputs are
    // bitwise reproducible.
    const int outs = m * 32;  // float4 outputs of the strip
    const int G = max(1, min(kThreads / outs, p.splits / 8));
    if (G == 1) {
      for (int i = tid; i < outs; i += kThreads) {
        const int row = i >> 5, c = (i & 31) * 4;
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
        for (int s = 0; s < p.splits; ++s)
          AddTo(sum, __ldcg(reinterpret_cast<const float4*>(p.partial + ((int64_t)s * m + row) * p.n + strip * 128 + c)));
        *reinterpret_cast<float4*>(out + row * 128 + c) = sum;
      }
    } else {
      float4* gsum = reinterpret_cast<float4*>(ring);  // [G][outs], free since the k-split reduction
      const int g = tid / outs, i = tid - g * outs, row = i >> 5, c = (i & 31) * 4;
      if (g < G) {
        const float* part0 = p.partial + (int64_t)row * p.n + strip * 128 + c;
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
        StridedSum<float4>(
            g, G, p.splits,
            [&](int s) { return __ldcg(reinterpret_cast<const float4*>(part0 + (int64_t)s * m * p.n)); },
            [&](const float4& v) { AddTo(sum, v); });
        gsum[tid] = sum;
      }
      __syncthreads();
      if (tid < outs) {
        float4 sum = gsum[tid];
        for (int q = 1; q < G; ++q) AddTo(sum, gsum[q * outs + tid]);
        *reinterpret_cast<float4*>(out + (tid >> 5) * 128 + (tid & 31) * 4) = sum;
      }
    }
    if (tid == 0) p.counters[strip] = 0;
    __syncthreads();
  }

  for (int row = warp; row < m; row += kThreads / 32) {
    const float4 o = *reinterpret_cast<const float4*>(out + row * 128 + lane * 4);
    float v[4] = {o.x, o.y, o.z, o.w};
    OutputHadamard128(v, svh, lane);
    StoreGemvRow(p, row, strip, lane, v);
  }
}

// Ŵ (the rotated-basis fp16 weight, k x n row-major) from the trellis. It runs the same per-lane decode
// as the GEMV, so its bit-exactness against exllamav3's `reconstruct` covers the GEMV's weights too.
// Each warp decodes TPW adjacent tiles of one tile row (TPW = 4 when n/16 is a multiple of 4, else 1):
// all their trellis loads are issued before any decode (more bytes in flight per warp: the launch is
// memory-bound when Ŵ feeds the prefill GEMM), the fragments go through a small shared-memory tile and
// each lane writes 16 contiguous bytes (TPW = 4: a warp writes 4 rows x 128 bytes per store, whole
// cache lines). The first `input_blocks` CTAs instead do the prefill input transform
// xh = Hk(x * suh), one warp per (row, 128-block), so that the GEMM needs no separate launch for it.
template <int K, int CB, int TPW>
__global__ void __launch_bounds__(kThreads) Exl3ReconstructKernel(const ReconstructParams p, int input_blocks) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (static_cast<int>(blockIdx.x) < input_blocks) {
    PrefillInputTransformWarp(p.x, p.suh, p.xh, p.m, p.k, (int64_t)blockIdx.x * (kThreads / 32) + warp, lane);
    return;
  }
  constexpr int kStride = TPW * 16 + 8;  // fp16 per staged row (+16 bytes: conflict-free fragment stores)
  __shared__ __align__(16) uint16_t staged[kThreads / 32][16 * kStride];
  const int64_t tiles_n = p.n >> 4, total = (int64_t)(p.k >> 4) * tiles_n;
  const int64_t tile0 = ((int64_t)(blockIdx.x - input_blocks) * (kThreads / 32) + warp) * TPW;
  if (tile0 >= total) return;  // whole warps only; the kernel uses no CTA-wide barrier
  const LaneTileGeom geom = MakeLaneTileGeom<K>(lane);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(p.trellis) + tile0 * 8 * K;
  uint32_t frag[TPW][4];
#pragma unroll
  for (int q = 0; q < TPW; ++q) DecodeTileLane<K, CB>(words + q * 8 * K, geom, p.one << K, frag[q]);
  uint16_t* st = staged[warp];
#pragma unroll
  for (int q = 0; q < TPW; ++q)
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int r = 2 * (lane % 4) + (e % 2) + 8 * ((e / 2) % 2), c = lane / 4 + 8 * (e / 4);
      st[r * kStride + q * 16 + c] = static_cast<uint16_t>(frag[q][e / 2] >> (16 * (e % 2)));
    }
  __syncwarp();
  const int64_t i = tile0 / tiles_n, j = tile0 - i * tiles_n;
  constexpr int kChunksPerRow = 2 * TPW;  // 16-byte chunks
#pragma unroll
  for (int idx = lane; idx < 32 * TPW; idx += 32) {
    const int r = idx / kChunksPerRow, ch = idx % kChunksPerRow;
    const uint4 v = *reinterpret_cast<const uint4*>(st + r * kStride + ch * 8);
    *reinterpret_cast<uint4*>(p.what + (16 * i + r) * (int64_t)p.n + 16 * j + ch * 8) = v;
  }
}

// Launches the GEMV kernel of (K, CB) for p.m rows: the few-rows form when UsesFewRowsLoop.
template <int CB>
int LaunchGemvKernel(int K, const GemvBatch& b, int grid_x, int grid_y, void* stream) {
  return DispatchK(K, static_cast<int>(cudaErrorInvalidValue), [&](auto k) {
    constexpr int kK = decltype(k)::value;
    const dim3 grid(grid_x, grid_y);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    if constexpr (HasFewRowsLoop(CB)) {
      if (UsesFewRowsLoop(CB, b.job[0].m)) {
        PdlLaunch(Exl3GemvKernel<kK, CB, true>, grid, kThreads, GemvSmemBytes(kK), s, b);
        return static_cast<int>(cudaGetLastError());
      }
    }
    PdlLaunch(Exl3GemvKernel<kK, CB, false>, grid, kThreads, GemvSmemBytes(kK), s, b);
    return static_cast<int>(cudaGetLastError());
  });
}

// Raises the dynamic shared-memory limit of every GEMV kernel of codebook CB (once per process and device).
template <int CB>
int PrepareGemvKernels() {
  for (int K = 1; K <= 8; ++K) {
    const int e = DispatchK(K, static_cast<int>(cudaErrorInvalidValue), [&](auto k) {
      constexpr int kK = decltype(k)::value;
      cudaError_t r = cudaFuncSetAttribute(reinterpret_cast<const void*>(Exl3GemvKernel<kK, CB, false>),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, GemvSmemBytes(kK));
      if constexpr (HasFewRowsLoop(CB)) {
        if (r == cudaSuccess)
          r = cudaFuncSetAttribute(reinterpret_cast<const void*>(Exl3GemvKernel<kK, CB, true>),
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, GemvSmemBytes(kK));
      }
      return static_cast<int>(r);
    });
    if (e != 0) return e;
  }
  return 0;
}

// Launches the Ŵ reconstruction of (K, CB), with the prefill input transform in the same launch when p.x
// is given.
template <int CB>
int LaunchReconstructKernel(int K, const ReconstructParams& p, void* stream) {
  const int64_t tiles = (int64_t)(p.k / 16) * (p.n / 16);
  const bool four = (p.n / 16) % 4 == 0;  // 4 tiles per warp stay inside one tile row
  const int64_t tiles_per_cta = four ? 32 : 8;
  const int input_blocks = p.x ? (int)(((int64_t)p.m * (p.k / 128) + 7) / 8) : 0;
  const dim3 grid((unsigned)((tiles + tiles_per_cta - 1) / tiles_per_cta + input_blocks)), block(kThreads);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return DispatchK(K, static_cast<int>(cudaErrorInvalidValue), [&](auto k) {
    constexpr int kK = decltype(k)::value;
    if (four) {
      Exl3ReconstructKernel<kK, CB, 4><<<grid, block, 0, s>>>(p, input_blocks);
    } else {
      Exl3ReconstructKernel<kK, CB, 1><<<grid, block, 0, s>>>(p, input_blocks);
    }
    return static_cast<int>(cudaGetLastError());
  });
}

// Instantiates K = 1..8 for one codebook and the entry points declared in exl3_gemv_params.h.
#define DSMESH_EXL3_GEMV_CODEBOOK(CB, NAME)                                                              \
  int LaunchGemv##NAME(int K, const GemvBatch& b, int grid_x, int grid_y, void* stream) {              \
    return LaunchGemvKernel<CB>(K, b, grid_x, grid_y, stream);                                          \
  }                                                                                                     \
  int LaunchReconstruct##NAME(int K, const ReconstructParams& p, void* stream) {                        \
    return LaunchReconstructKernel<CB>(K, p, stream);                                                   \
  }                                                                                                     \
  int PrepareGemv##NAME() { return PrepareGemvKernels<CB>(); }

}  // namespace dsmesh::exl3cuda
