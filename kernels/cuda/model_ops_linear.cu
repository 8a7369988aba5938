// Dense linears (f32 activations against f32/bf16/fp16 weights, f32 accumulation) and the MoE router
// (model_ops.h). CPU twins: cpu::DenseLinear (kernels/cpu/dense_linear.cc) and CpuBackend::MoeRoute.
// Every kernel here but WidenKernel (the weight copy of the cuBLAS path) is launched through PdlLaunch
// (pdl_launch.cuh) and starts with PdlWait() (it reads the previous kernels' output from its first load on;
// its prologue is index math only) and then PdlTrigger(), so that with programmatic dependent launch the
// next kernel's launch overlaps all of it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/model_ops_device.cuh"
#include "kernels/cuda/pdl_launch.cuh"

namespace dsmesh::cuda_ops {
namespace {

constexpr int kGemvMaxRows = 16;
constexpr int kGemvWarps = 8;  // warps per block

// Few rows: `split` warps per output column (1, 2, 4 or 8; kGemvWarps / split columns per block) read its
// weight row once for all m <= kRows rows. The split is for narrow linears (the router's 4096 -> 256,
// the indexer's weights_proj 4096 -> 64), which with one warp per column launch a few dozen blocks and
// leave most multiprocessors idle: their `split` warps take interleaved slices of k, and their sums are
// added in warp order through shared memory (a fixed order: outputs are bitwise reproducible). With
// split = 1 each column is summed exactly as by one warp. kVec: each thread loads 16 bytes of weights at
// a time (k and the row strides multiples of 16 bytes, pointers aligned), four such loads in flight per
// thread (the loop is unrolled by kUnroll), and the activations as float4. kRows: the most rows this
// instantiation takes (loops over rows are unrolled to it; m = 1 pays for no other row).
constexpr int kUnroll = 4;
template <class T, bool kVec, int kRows>
__global__ void __launch_bounds__(kGemvWarps * 32) DenseGemvKernel(const float* x, int64_t ldx, int m, const T* w,
                                                                   int64_t ldw, int64_t n, int64_t k, int split,
                                                                   const float* bias, float* out, int64_t ldo) {
  PdlWait();
  PdlTrigger();
  __shared__ float part[kGemvWarps][kRows];
  constexpr int kPer = kVec ? 16 / static_cast<int>(sizeof(T)) : 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int slice = warp % split;  // this warp's slice of k among the column's warps
  const int64_t col = static_cast<int64_t>(blockIdx.x) * (kGemvWarps / split) + warp / split;
  const bool active = col < n;  // no early return: the block meets at a barrier when split > 1
  const int64_t t = static_cast<int64_t>(slice) * 32 + lane, threads = static_cast<int64_t>(split) * 32;
  float acc[kRows] = {};
  const T* wr = w + (active ? col : 0) * ldw;
  if (active) {
    if constexpr (kVec) {
      const int64_t step = threads * kPer;
      for (int64_t c0 = t * kPer; c0 < k; c0 += step * kUnroll) {
        uint4 raw[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (c0 + u * step < k) raw[u] = __ldg(reinterpret_cast<const uint4*>(wr + c0 + u * step));
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t c = c0 + u * step;
          if (c >= k) break;
          const T* p = reinterpret_cast<const T*>(&raw[u]);
          float wv[kPer];
#pragma unroll
          for (int j = 0; j < kPer; ++j) wv[j] = Load(p, j);
#pragma unroll
          for (int r = 0; r < kRows; ++r)
            if (r < m) {
              const float4* xr = reinterpret_cast<const float4*>(x + r * ldx + c);
#pragma unroll
              for (int j = 0; j < kPer; j += 4) {
                const float4 xv = xr[j / 4];
                acc[r] += xv.x * wv[j] + xv.y * wv[j + 1] + xv.z * wv[j + 2] + xv.w * wv[j + 3];
              }
            }
        }
      }
    } else {
      for (int64_t c = t; c < k; c += threads) {
        const float wv = Load(wr, c);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          if (r < m) acc[r] += x[r * ldx + c] * wv;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = WarpSum(acc[r]);
  if (split == 1) {
    if (active && lane == 0)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (r < m) out[r * ldo + col] = acc[r] + (bias ? bias[col] : 0.0f);
    return;
  }
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kRows; ++r) part[warp][r] = acc[r];
  __syncthreads();
  // The column's first warp adds its warps' sums in warp order, lane r for row r.
  if (active && slice == 0 && lane < m) {
    float v = part[warp][lane];
    for (int s = 1; s < split; ++s) v += part[warp + s][lane];
    out[lane * ldo + col] = v + (bias ? bias[col] : 0.0f);
  }
}

// Warps per output column for a GEMV of n columns and k inputs: the smallest split that launches at least
// kGemvMinBlocks blocks (two per multiprocessor on the H200), as long as every thread of a column still
// gets a load of its own (k >= 32 split per). The split depends on the shape only.
constexpr int64_t kGemvMinBlocks = 256;
int GemvSplit(int64_t n, int64_t k, int64_t per) {
  int split = 1;
  while (split < kGemvWarps && (n * split + kGemvWarps - 1) / kGemvWarps < kGemvMinBlocks &&
         k >= 2 * split * 32 * per)
    split *= 2;
  return split;
}

template <class T, bool kVec>
void LaunchGemv(const float* x, int64_t ldx, int m, const T* w, int64_t ldw, int64_t n, int64_t k, const float* bias,
                float* out, int64_t ldo, cudaStream_t s) {
  const int split = GemvSplit(n, k, kVec ? 16 / sizeof(T) : 1);
  const unsigned grid = static_cast<unsigned>((n * split + kGemvWarps - 1) / kGemvWarps);
  const int threads = kGemvWarps * 32;
  if (m == 1) {
    PdlLaunch(DenseGemvKernel<T, kVec, 1>, grid, threads, 0, s, x, ldx, m, w, ldw, n, k, split, bias, out, ldo);
  } else if (m <= 4) {
    PdlLaunch(DenseGemvKernel<T, kVec, 4>, grid, threads, 0, s, x, ldx, m, w, ldw, n, k, split, bias, out, ldo);
  } else if (m <= 8) {
    PdlLaunch(DenseGemvKernel<T, kVec, 8>, grid, threads, 0, s, x, ldx, m, w, ldw, n, k, split, bias, out, ldo);
  } else {
    PdlLaunch(DenseGemvKernel<T, kVec, kGemvMaxRows>, grid, threads, 0, s, x, ldx, m, w, ldw, n, k, split, bias, out,
              ldo);
  }
}

// Many rows: 64 x 64 output tiles, 16-deep k slabs in shared memory, 4 x 4 outputs per thread.
constexpr int kTile = 64, kSlab = 16;

template <class T>
__global__ void DenseGemmKernel(const float* x, int64_t ldx, int64_t m, const T* w, int64_t ldw, int64_t n, int64_t k,
                                const float* bias, float* out, int64_t ldo) {
  PdlWait();
  PdlTrigger();
  __shared__ float xs[kSlab][kTile + 1];
  __shared__ float ws[kSlab][kTile + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile, col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < k; k0 += kSlab) {
    for (int i = threadIdx.x; i < kSlab * kTile; i += blockDim.x) {
      const int kk = i % kSlab, rr = i / kSlab;
      const int64_t gr = row0 + rr, gc = col0 + rr, gk = k0 + kk;
      xs[kk][rr] = gr < m && gk < k ? x[gr * ldx + gk] : 0.0f;
      ws[kk][rr] = gc < n && gk < k ? Load(w, gc * ldw + gk) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kSlab; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx * 4 + j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = row0 + ty * 4 + i;
    if (r >= m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = col0 + tx * 4 + j;
      if (c < n) out[r * ldo + c] = acc[i][j] + (bias ? bias[c] : 0.0f);
    }
  }
}

template <class T>
void LaunchDense(const float* x, int64_t ldx, int64_t m, const T* w, int64_t ldw, int64_t n, int64_t k,
                 const float* bias, float* out, int64_t ldo, cudaStream_t s) {
  for (int64_t r0 = 0; r0 < m;) {
    if (m - r0 <= kGemvMaxRows) {
      constexpr int64_t per = 16 / sizeof(T);
      const bool vec = k % per == 0 && ldw % per == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 && ldx % 4 == 0 &&
                       reinterpret_cast<uintptr_t>(x + r0 * ldx) % 16 == 0;
      if (vec) {
        LaunchGemv<T, true>(x + r0 * ldx, ldx, static_cast<int>(m - r0), w, ldw, n, k, bias, out + r0 * ldo, ldo, s);
      } else {
        LaunchGemv<T, false>(x + r0 * ldx, ldx, static_cast<int>(m - r0), w, ldw, n, k, bias, out + r0 * ldo, ldo, s);
      }
      return;
    }
    const int64_t rows = std::min<int64_t>(m - r0, 65535LL * kTile);
    dim3 grid(static_cast<unsigned>((n + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
    PdlLaunch(DenseGemmKernel<T>, grid, 256, 0, s, x + r0 * ldx, ldx, rows, w, ldw, n, k, bias, out + r0 * ldo, ldo);
    r0 += rows;
  }
}

// torch.nn.functional.softplus (beta 1, threshold 20).
__device__ __forceinline__ float Softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// One warp per row, no block barriers: scores = sqrt(softplus(logits)) in shared memory (E <= kMaxExperts);
// experts from tid2eid (hash) or k rounds of a warp argmax of score + bias (ties: lower id, as the CPU's
// partial_sort); weights = score (/ sum) * routed_scale, summed in slot order like the CPU op.
// The argmax: lane l owns the contiguous experts [l C, l C + C) (C = ceil(E / 32)) and keeps its best
// untaken one; a round is one __reduce_max_sync over the lanes' order-preserving keys, a ballot for the
// lowest lane holding the maximum (the lowest id among equal scores, the chunks being in id order), and a
// rescan of the winner's chunk. Taken experts become NaN, which no round picks again.
constexpr int kMaxExperts = 4096;
constexpr int kMaxTopK = 16;

// An unsigned key whose order is the float order of v (not NaN; -0 and +0 equal); 0 is below every key.
__device__ __forceinline__ unsigned OrderKey(float v) {
  const unsigned u = v == 0.0f ? 0u : __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(32) MoeRouteKernel(const float* logits, int64_t E, const int32_t* tokens,
                                                     const int32_t* tid2eid, const float* bias, int k, bool normalize,
                                                     float routed_scale, int32_t* idx, float* weight) {
  PdlWait();
  PdlTrigger();
  __shared__ float score[kMaxExperts];
  __shared__ float biased[kMaxExperts];
  const int64_t r = blockIdx.x;
  const int lane = threadIdx.x;
  const float* lg = logits + r * E;
  for (int64_t e = lane; e < E; e += 32) {
    score[e] = sqrtf(Softplus(lg[e]));
    biased[e] = score[e] + (bias ? bias[e] : 0.0f);
  }
  __syncwarp();
  int mine = -1;  // lane i < k: the expert of slot i
  if (tid2eid) {
    if (lane < k) mine = tid2eid[static_cast<int64_t>(tokens[r]) * k + lane];
  } else {
    const int C = static_cast<int>((E + 31) / 32);
    const int e0 = lane * C, e1 = static_cast<int>(E < static_cast<int64_t>(e0) + C ? E : static_cast<int64_t>(e0) + C);
    // This lane's best untaken expert (the lowest id among equal scores), -1 when none is left.
    auto best_of_chunk = [&](float* v) {
      int arg = -1;
      for (int e = e0; e < e1; ++e) {
        const float b = biased[e];
        if (arg < 0 ? !isnan(b) : b > *v) {
          *v = b;
          arg = e;
        }
      }
      return arg;
    };
    float v = 0.0f;
    int arg = best_of_chunk(&v);
    for (int i = 0; i < k; ++i) {
      const unsigned key = arg >= 0 ? OrderKey(v) : 0u;
      const unsigned top = __reduce_max_sync(0xffffffffu, key);
      const unsigned holders = __ballot_sync(0xffffffffu, arg >= 0 && key == top);
      const int winner = holders ? __ffs(holders) - 1 : 0;
      const int e = holders ? __shfl_sync(0xffffffffu, arg, winner) : -1;
      if (lane == i) mine = e;
      if (holders && lane == winner) {
        biased[e] = NAN;  // taken
        v = 0.0f;
        arg = best_of_chunk(&v);
      }
    }
  }
  __syncwarp();
  // Every lane sums the chosen scores in slot order; lane i writes slot i.
  float sum = 0.0f;
  for (int i = 0; i < k; ++i) {
    const int e = __shfl_sync(0xffffffffu, mine, i);
    sum += e >= 0 && e < E ? score[e] : 0.0f;
  }
  if (lane < k) {
    float w = mine >= 0 && mine < E ? score[mine] : 0.0f;
    if (normalize) w /= sum + 1e-20f;
    idx[r * k + lane] = mine;
    weight[r * k + lane] = w * routed_scale;
  }
}

}  // namespace

namespace {
template <class T>
__global__ void WidenKernel(const T* w, int64_t count, float* out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = Load(w, i);
}
}  // namespace

void WidenToF32(const void* w, WType type, int64_t count, float* out, cudaStream_t s) {
  if (count <= 0) return;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((count + 255) / 256, 65535));
  switch (type) {
    case WType::kF32: WidenKernel<<<grid, 256, 0, s>>>(static_cast<const float*>(w), count, out); break;
    case WType::kBF16: WidenKernel<<<grid, 256, 0, s>>>(static_cast<const __nv_bfloat16*>(w), count, out); break;
    case WType::kF16: WidenKernel<<<grid, 256, 0, s>>>(static_cast<const __half*>(w), count, out); break;
  }
}

void DenseLinear(const float* x, int64_t ldx, int64_t m, const void* w, WType type, int64_t ldw, int64_t n,
                 int64_t k, const float* bias, float* out, int64_t ldo, cudaStream_t s) {
  if (m <= 0 || n <= 0) return;
  switch (type) {
    case WType::kF32: LaunchDense(x, ldx, m, static_cast<const float*>(w), ldw, n, k, bias, out, ldo, s); break;
    case WType::kBF16: LaunchDense(x, ldx, m, static_cast<const __nv_bfloat16*>(w), ldw, n, k, bias, out, ldo, s); break;
    case WType::kF16: LaunchDense(x, ldx, m, static_cast<const __half*>(w), ldw, n, k, bias, out, ldo, s); break;
  }
}

void MoeRoute(const float* logits, int64_t n, int64_t E, const int32_t* tokens, const int32_t* tid2eid,
              const float* bias, int k, bool normalize, float routed_scale, int32_t* idx, float* weight,
              cudaStream_t s) {
  if (n <= 0) return;
  if (E > kMaxExperts || k > kMaxTopK)
    throw std::runtime_error("cuda MoeRoute: " + std::to_string(E) + " experts / top-" + std::to_string(k) +
                             " above the kernel's " + std::to_string(kMaxExperts) + " / " + std::to_string(kMaxTopK));
  PdlLaunch(MoeRouteKernel, static_cast<unsigned>(n), 32, 0, s, logits, E, tokens, tid2eid, bias, k,
            normalize, routed_scale, idx, weight);
}

}  // namespace dsmesh::cuda_ops
