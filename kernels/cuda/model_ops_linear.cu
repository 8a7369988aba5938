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

constexpr int kGemvMaxRows = 8;

// Few rows: one warp per output column reads its weight row once for all m rows. kVec: each lane loads
// 16 bytes of weights at a time (k and the row strides multiples of 16 bytes, pointers aligned), four
// such loads in flight per lane (the loop is unrolled by kUnroll), and the activations as float4.
constexpr int kUnroll = 4;
template <class T, bool kVec>
__global__ void DenseGemvKernel(const float* x, int64_t ldx, int m, const T* w, int64_t ldw, int64_t n, int64_t k,
                                const float* bias, float* out, int64_t ldo) {
  PdlWait();
  PdlTrigger();
  constexpr int kPer = kVec ? 16 / static_cast<int>(sizeof(T)) : 1;
  const int lane = threadIdx.x & 31;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (col >= n) return;
  float acc[kGemvMaxRows] = {};
  const T* wr = w + col * ldw;
  if constexpr (kVec) {
    constexpr int64_t kStep = 32 * kPer;
    for (int64_t c0 = static_cast<int64_t>(lane) * kPer; c0 < k; c0 += kStep * kUnroll) {
      uint4 raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (c0 + u * kStep < k) raw[u] = __ldg(reinterpret_cast<const uint4*>(wr + c0 + u * kStep));
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + u * kStep;
        if (c >= k) break;
        const T* p = reinterpret_cast<const T*>(&raw[u]);
        float wv[kPer];
#pragma unroll
        for (int j = 0; j < kPer; ++j) wv[j] = Load(p, j);
#pragma unroll
        for (int r = 0; r < kGemvMaxRows; ++r)
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
    for (int64_t c = lane; c < k; c += 32) {
      const float wv = Load(wr, c);
#pragma unroll
      for (int r = 0; r < kGemvMaxRows; ++r)
        if (r < m) acc[r] += x[r * ldx + c] * wv;
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) {
    if (r >= m) break;
    float v = acc[r];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) out[r * ldo + col] = v + (bias ? bias[col] : 0.0f);
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
      const int warps = 8;
      const unsigned grid = static_cast<unsigned>((n + warps - 1) / warps);
      constexpr int64_t per = 16 / sizeof(T);
      const bool vec = k % per == 0 && ldw % per == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 && ldx % 4 == 0 &&
                       reinterpret_cast<uintptr_t>(x + r0 * ldx) % 16 == 0;
      if (vec) {
        PdlLaunch(DenseGemvKernel<T, true>, grid, warps * 32, 0, s, x + r0 * ldx, ldx, static_cast<int>(m - r0), w, ldw,
                  n, k, bias, out + r0 * ldo, ldo);
      } else {
        PdlLaunch(DenseGemvKernel<T, false>, grid, warps * 32, 0, s, x + r0 * ldx, ldx, static_cast<int>(m - r0), w,
                  ldw, n, k, bias, out + r0 * ldo, ldo);
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

constexpr int kRouteThreads = 256;

// One block per row: scores = sqrt(softplus(logits)) in shared memory (E <= kMaxExperts); experts from
// tid2eid (hash) or k rounds of a block argmax of score + bias (ties: lower id); weights = score
// (/ sum) * routed_scale, summed in slot order like the CPU op.
constexpr int kMaxExperts = 4096;
constexpr int kMaxTopK = 16;

__global__ void MoeRouteKernel(const float* logits, int64_t E, const int32_t* tokens, const int32_t* tid2eid,
                               const float* bias, int k, bool normalize, float routed_scale, int32_t* idx,
                               float* weight) {
  PdlWait();
  PdlTrigger();
  __shared__ float score[kMaxExperts];
  __shared__ float biased[kMaxExperts];
  __shared__ float best_v[kRouteThreads / 32];
  __shared__ int best_e[kRouteThreads / 32];
  __shared__ int chosen[kMaxTopK];
  const int64_t r = blockIdx.x;
  const float* lg = logits + r * E;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    score[e] = sqrtf(Softplus(lg[e]));
    biased[e] = score[e] + (bias ? bias[e] : 0.0f);
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int i = 0; i < k; ++i) {
    if (tid2eid) {
      if (threadIdx.x == 0) chosen[i] = tid2eid[static_cast<int64_t>(tokens[r]) * k + i];
      continue;
    }
    float v = -INFINITY;
    int arg = -1;
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
      if (biased[e] > v || (arg < 0 && biased[e] == -INFINITY)) {
        v = biased[e];
        arg = static_cast<int>(e);
      }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oa = __shfl_xor_sync(0xffffffffu, arg, o);
      if (oa >= 0 && (arg < 0 || ov > v || (ov == v && oa < arg))) {
        v = ov;
        arg = oa;
      }
    }
    if (lane == 0) {
      best_v[warp] = v;
      best_e[warp] = arg;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float bv = best_v[0];
      int be = best_e[0];
      for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
        if (best_e[w] >= 0 && (be < 0 || best_v[w] > bv || (best_v[w] == bv && best_e[w] < be))) {
          bv = best_v[w];
          be = best_e[w];
        }
      chosen[i] = be;
      biased[be] = -INFINITY;  // taken
    }
    __syncthreads();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum += score[chosen[i]];
    for (int i = 0; i < k; ++i) {
      float w = score[chosen[i]];
      if (normalize) w /= sum + 1e-20f;
      idx[r * k + i] = chosen[i];
      weight[r * k + i] = w * routed_scale;
    }
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
  PdlLaunch(MoeRouteKernel, static_cast<unsigned>(n), kRouteThreads, 0, s, logits, E, tokens, tid2eid, bias, k,
            normalize, routed_scale, idx, weight);
}

}  // namespace dsmesh::cuda_ops
