// Elementwise, normalisation, rope, hyper-connection and row-movement kernels of the model forward
// (model_ops.h). Each mirrors the CPU op of the same name in kernels/cpu/cpu_backend.cc.
// Every kernel here but SpinKernel (the profiler's) is launched through PdlLaunch (pdl_launch.cuh) and
// starts with PdlWait() (it reads the previous kernels' output from its first load on; its prologue is
// index math only) and then PdlTrigger(), so that with programmatic dependent launch the next kernel's
// launch overlaps all of it.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/model_ops_device.cuh"
#include "kernels/cuda/pdl_launch.cuh"

namespace dsmesh::cuda_ops {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHc = 16;  // hyper-connection streams the fused hc kernels hold in registers/shared memory

inline unsigned Blocks(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 1048576 ? 1048576 : b));
}

// The grid's y dimension over rows (at most 65535; kernels stride over the rest).
inline unsigned RowBlocks(int64_t rows) { return static_cast<unsigned>(rows < 1 ? 1 : (rows > 65535 ? 65535 : rows)); }

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <class T>
__global__ void EmbeddingKernel(const T* table, int64_t dim, const int32_t* tokens, float* out) {
  PdlWait();
  PdlTrigger();
  const int64_t r = blockIdx.x;
  const T* row = table + static_cast<int64_t>(tokens[r]) * dim;
  for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) out[r * dim + k] = Load(row, k);
}

__global__ void RmsNormKernel(const float* x, int64_t dim, const float* w, float eps, float* out) {
  PdlWait();
  PdlTrigger();
  const float* xi = x + blockIdx.x * dim;
  float* o = out + blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) ss += xi[k] * xi[k];
  const float r = 1.0f / sqrtf(BlockSum(ss) / static_cast<float>(dim) + eps);
  for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) o[k] = w ? w[k] * (xi[k] * r) : xi[k] * r;
}

// The same over float4: each thread keeps its (at most kRmsPer) float4 of the row in registers between
// the sum and the scaling, so the row is read once; up to 1024 threads per row (a decode step's norms are
// one row each: latency, not bandwidth, is what counts).
constexpr int kRmsPer = 4;
__global__ void RmsNormVec4Kernel(const float4* x, int64_t dim4, const float4* w, float eps, float inv_dim,
                                  float4* out) {
  PdlWait();
  PdlTrigger();
  const float4* xi = x + blockIdx.x * dim4;
  float4* o = out + blockIdx.x * dim4;
  float4 v[kRmsPer];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kRmsPer; ++i) {
    const int64_t k = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (k < dim4) {
      v[i] = xi[k];
      ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
    }
  }
  const float r = 1.0f / sqrtf(BlockSum(ss) * inv_dim + eps);
#pragma unroll
  for (int i = 0; i < kRmsPer; ++i) {
    const int64_t k = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (k < dim4) {
      float4 y = make_float4(v[i].x * r, v[i].y * r, v[i].z * r, v[i].w * r);
      if (w) {
        const float4 g = w[k];
        y = make_float4(g.x * y.x, g.y * y.y, g.z * y.z, g.w * y.w);
      }
      o[k] = y;
    }
  }
}

__global__ void AddKernel(const float* a, int64_t n, float* acc) {
  PdlWait();
  PdlTrigger();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    acc[i] += a[i];
}

__global__ void ScaleKernel(float* x, int64_t n, float v) {
  PdlWait();
  PdlTrigger();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    x[i] *= v;
}

// One block per row; pairs (head, i) spread over the threads.
__global__ void RopeKernel(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t rope_dim,
                           const int64_t* positions, const float* inv_freq, bool inverse) {
  PdlWait();
  PdlTrigger();
  const int64_t half = rope_dim / 2;
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y)
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < heads * half; t += (int64_t)gridDim.x * blockDim.x) {
    const float pos = static_cast<float>(positions[r]);
    const int64_t h = t / half, i = t % half;
    const float angle = pos * inv_freq[i];
    const float cs = cosf(angle), sn = inverse ? -sinf(angle) : sinf(angle);
    float* p = x + (r * heads + h) * head_dim + (head_dim - rope_dim);
    const float a = p[2 * i], b = p[2 * i + 1];
    p[2 * i] = a * cs - b * sn;
    p[2 * i + 1] = b * cs + a * sn;
  }
}

__global__ void ToHalfPaddedKernel(const float* x, int64_t rows, int64_t cols, int64_t ld_in, uint16_t* out,
                                   int64_t ld_out, int64_t col0) {
  PdlWait();
  PdlTrigger();
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < ld_out; c += (int64_t)gridDim.x * blockDim.x) {
    const int64_t src = c - col0;
    const float v = src >= 0 && src < cols ? x[r * ld_in + src] : 0.0f;
    out[r * ld_out + c] = __half_as_ushort(__float2half_rn(v));
  }
}

// xh[g][r][c] = fp16(x[r][g * in + c]): a grouped linear's input, each group's rows contiguous.
__global__ void GroupMajorToHalfKernel(const float* x, int64_t m, int64_t groups, int64_t in, uint16_t* xh) {
  PdlWait();
  PdlTrigger();
  const int64_t total = m * groups * in;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t c = i % in, gr = i / in, r = gr % m, g = gr / m;
    xh[i] = __half_as_ushort(__float2half_rn(x[(r * groups + g) * in + c]));
  }
}

// out[r][g * cols + c] = yg[g][r][c]: the groups' outputs back into rows.
__global__ void RowMajorFromGroupsKernel(const float* yg, int64_t m, int64_t groups, int64_t cols, float* out) {
  PdlWait();
  PdlTrigger();
  const int64_t total = m * groups * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t c = i % cols, gr = i / cols, r = gr % m, g = gr / m;
    out[(r * groups + g) * cols + c] = yg[i];
  }
}

__global__ void TakeColumnsKernel(const float* y, int64_t rows, int64_t ld_y, int64_t col0, int64_t cols,
                                  const float* bias, float* out, int64_t ld_out, bool accumulate) {
  PdlWait();
  PdlTrigger();
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols; c += (int64_t)gridDim.x * blockDim.x) {
    const float v = y[r * ld_y + col0 + c] + (bias ? bias[c] : 0.0f);
    out[r * ld_out + c] = accumulate ? out[r * ld_out + c] + v : v;
  }
}

__global__ void GatherRowsKernel(const float* src, const int32_t* rows, int64_t width, float* dst) {
  PdlWait();
  PdlTrigger();
  const int64_t i = blockIdx.x;
  const float* s = src + static_cast<int64_t>(rows[i]) * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) dst[i * width + c] = s[c];
}

__global__ void ScatterAddRowsKernel(const float* src, const int32_t* rows, const float* w, int64_t width,
                                     float* dst) {
  PdlWait();
  PdlTrigger();
  const int64_t i = blockIdx.x;
  float* d = dst + static_cast<int64_t>(rows[i]) * width;
  const float wi = w ? w[i] : 1.0f;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) d[c] += wi * src[i * width + c];
}

__device__ __forceinline__ float SwiGluValue(float gv, float uv, float limit) {
  if (limit > 0) {
    gv = fminf(gv, limit);
    uv = fminf(fmaxf(uv, -limit), limit);
  }
  return gv / (1.0f + expf(-gv)) * uv;
}

__global__ void SwiGluKernel(float* g, const float* u, int64_t n, float limit) {
  PdlWait();
  PdlTrigger();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    g[i] = SwiGluValue(g[i], u[i], limit);
}

// SwiGluKernel's value rounded as ToHalfPaddedKernel rounds (the fp16 input of an EXL3 down projection).
__global__ void SwiGluToHalfKernel(const float* g, const float* u, int64_t n, float limit, uint16_t* gh) {
  PdlWait();
  PdlTrigger();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    gh[i] = __half_as_ushort(__float2half_rn(SwiGluValue(g[i], u[i], limit)));
}

// mixes[r, k] = rsqrt(mean(X_r^2) + eps) * (fn[k] . X_r): one block per (row, k), so the K dot products
// of a row (each hc*D long) spread over K multiprocessors.
// The loop is unrolled so that several loads are in flight per thread; each thread still adds its
// elements in index order (the sums the CPU twin is compared with do not move).
__global__ void HcMixesKernel(const float* X, int64_t w, const float* fn, int K, float norm_eps, float* mixes) {
  PdlWait();
  PdlTrigger();
  const int64_t r = blockIdx.x;
  const int k = blockIdx.y;
  const float* x = X + r * w;
  const float* f = fn + k * w;
  float ss = 0.0f, dot = 0.0f;
  const int n = static_cast<int>(w);
#pragma unroll 8
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = x[i];
    ss += v * v;
    dot += __ldg(f + i) * v;
  }
  ss = BlockSum(ss);
  dot = BlockSum(dot);
  if (threadIdx.x == 0) mixes[r * K + k] = (1.0f / sqrtf(ss / static_cast<float>(w) + norm_eps)) * dot;
}

// comb's softmax rows (+ eps) and Sinkhorn normalisation (columns, then rows and columns iters - 1 times)
// on the cells c[hc x hc] in shared memory; thread t < hc * hc owns cell t and returns its value. Every
// row and column sum is taken in the CPU op's order (j, resp. i, ascending). `sync` is the barrier of the
// threads taking part (one warp when the cells fit in it, else the block).
template <class Sync>
__device__ float SinkhornCells(float* c, float v, int hc, int iters, float eps, Sync sync) {
  const int t = threadIdx.x, i = t / hc, j = t % hc;
  const bool owner = t < hc * hc;
  if (owner) c[t] = v;
  sync();
  if (owner) {  // softmax over the row, + eps
    float mx = -INFINITY;
    for (int jj = 0; jj < hc; ++jj) mx = fmaxf(mx, c[i * hc + jj]);
    float sum = 0.0f;
    for (int jj = 0; jj < hc; ++jj) sum += expf(c[i * hc + jj] - mx);
    v = expf(v - mx) / sum + eps;
  }
  sync();
  if (owner) c[t] = v;
  sync();
  for (int it = 0; it < (iters > 0 ? iters : 1); ++it) {
    if (it > 0) {  // rows, then columns again (the first pass normalises columns only)
      float sum = 0.0f;
      if (owner)
        for (int jj = 0; jj < hc; ++jj) sum += c[i * hc + jj];
      sync();
      if (owner) c[t] = v = v / (sum + eps);
      sync();
    }
    float sum = 0.0f;
    if (owner)
      for (int ii = 0; ii < hc; ++ii) sum += c[ii * hc + j];
    sync();
    if (owner) c[t] = v = v / (sum + eps);
    sync();
  }
  return v;
}

// The same normalisation in registers, for hc * hc <= 32 cells (hc <= kWarpSinkhornHc): lane l < hc * hc of
// the calling warp owns cell l (row l / hc, column l % hc) and gets its value back; the row and column
// sums gather the cells with shuffles and add them in the CPU op's order. The whole warp calls it (the
// other lanes compute on wrapped lanes' values and ignore the result). Per pass the chain is one round of
// shuffles, hc - 1 adds and a divide, with no barrier: the 2 iters passes are the latency.
constexpr int kWarpSinkhornHc = 5;
__device__ float WarpSinkhorn(float v, int hc, int iters, float eps) {
  const int lane = threadIdx.x & 31, i = lane / hc, j = lane % hc;
  float e[kWarpSinkhornHc];
  float mx = -INFINITY;
#pragma unroll
  for (int jj = 0; jj < kWarpSinkhornHc; ++jj)
    if (jj < hc) {
      e[jj] = __shfl_sync(0xffffffffu, v, i * hc + jj);
      mx = fmaxf(mx, e[jj]);
    }
  float sum = 0.0f;
#pragma unroll
  for (int jj = 0; jj < kWarpSinkhornHc; ++jj)
    if (jj < hc) sum += expf(e[jj] - mx);
  v = expf(v - mx) / sum + eps;  // softmax over the row, + eps
  // pass(stride, first): v /= (sum over the cells first + m * stride, m = 0..hc-1, in m order) + eps.
  auto pass = [&](int first, int stride) {
    float g[kWarpSinkhornHc];
#pragma unroll
    for (int m = 0; m < kWarpSinkhornHc; ++m)
      if (m < hc) g[m] = __shfl_sync(0xffffffffu, v, first + m * stride);
    float s = 0.0f;
#pragma unroll
    for (int m = 0; m < kWarpSinkhornHc; ++m)
      if (m < hc) s += g[m];
    v = v / (s + eps);
  };
  pass(j, hc);  // columns (the first pass normalises columns only)
  for (int it = 1; it < iters; ++it) {
    pass(i * hc, 1);  // rows
    pass(j, hc);      // columns
  }
  return v;
}

// HcPre in one launch. A cluster of kHcParts blocks per (role, group of R rows): block p of the cluster
// takes the p-th of kHcParts column ranges of D, in every stream (its "units": V-wide pieces of the row's
// hc D values), and computes the row's sum of squares and the dot products fn[k] . x of its role's mixes
// over them: role 0 the pre and post mixes (k < 2 hc), role 1 the comb cells (the rest), so that the
// comb's Sinkhorn chain starts as soon as the comb mixes are in, beside y. fn is streamed once per
// cluster with V-wide loads, KC mixes at a time, and the first KC are loaded before PdlWait (fn is a
// weight). After a cluster barrier every block reads the kHcParts partial sums (rank order) from its
// peers' shared memory. Role 0: every block takes pre (sigmoid + eps) and writes its columns of y =
// sum_i pre_i X_i; rank 0 also writes post (2 sigmoid). Role 1: rank 0 writes comb (softmax + Sinkhorn,
// one warp per row when the cells fit in a warp). A row's sums do not depend on R, KC or the other rows
// (the same units per thread, the same shuffle tree per group of 8 mixes, warps and ranks in order), so a
// row computes the same bits alone as in a batch.
constexpr int kHcParts = 8;          // blocks per cluster (the portable cluster size)
constexpr int kHcPreThreads = 512;   // a V4-Flash row (hc 4 x D 4096) is 512 float4 per block: one per thread
constexpr int kHcPreWarps = kHcPreThreads / 32;

template <int V>
struct HcVec;
template <>
struct HcVec<4> {
  using T = float4;
  static __device__ __forceinline__ T Zero() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
  static __device__ __forceinline__ T Load(const float* p) { return *reinterpret_cast<const float4*>(p); }
  static __device__ __forceinline__ T Weight(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
  static __device__ __forceinline__ float Dot(T a, T b, float acc) {
    return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
  }
  static __device__ __forceinline__ T Axpy(float a, T x, T acc) {
    return make_float4(fmaf(a, x.x, acc.x), fmaf(a, x.y, acc.y), fmaf(a, x.z, acc.z), fmaf(a, x.w, acc.w));
  }
  static __device__ __forceinline__ void Store(float* p, T v) { *reinterpret_cast<float4*>(p) = v; }
  // RmsNorm's scaling (RmsNormVec4Kernel's expression): g * (v * r), or v * r without a weight.
  static __device__ __forceinline__ T Norm(T v, float r, const float* g) {
    T o = make_float4(v.x * r, v.y * r, v.z * r, v.w * r);
    if (g) {
      const float4 gv = *reinterpret_cast<const float4*>(g);
      o = make_float4(gv.x * o.x, gv.y * o.y, gv.z * o.z, gv.w * o.w);
    }
    return o;
  }
};
template <>
struct HcVec<1> {
  using T = float;
  static __device__ __forceinline__ T Zero() { return 0.0f; }
  static __device__ __forceinline__ T Load(const float* p) { return *p; }
  static __device__ __forceinline__ T Weight(const float* p) { return __ldg(p); }
  static __device__ __forceinline__ float Dot(T a, T b, float acc) { return fmaf(a, b, acc); }
  static __device__ __forceinline__ T Axpy(float a, T x, T acc) { return fmaf(a, x, acc); }
  static __device__ __forceinline__ void Store(float* p, T v) { *p = v; }
  static __device__ __forceinline__ T Norm(T v, float r, const float* g) { return g ? *g * (v * r) : v * r; }
};

// The warp's sum of a[(lane >> 2) & 7] over its 32 lanes, for lanes with lane % 4 == 0: eight sums in 9
// shuffles (each halving step sends the half of the values the partner keeps).
__device__ __forceinline__ float TransposedWarpSum8(const float (&a)[8]) {
  const int lane = threadIdx.x & 31;
  float b[4], c[2];
  bool hi = lane & 16;
#pragma unroll
  for (int m = 0; m < 4; ++m) b[m] = (hi ? a[m + 4] : a[m]) + __shfl_xor_sync(0xffffffffu, hi ? a[m] : a[m + 4], 16);
  hi = lane & 8;
#pragma unroll
  for (int m = 0; m < 2; ++m) c[m] = (hi ? b[m + 2] : b[m]) + __shfl_xor_sync(0xffffffffu, hi ? b[m] : b[m + 2], 8);
  hi = lane & 4;
  float d = (hi ? c[1] : c[0]) + __shfl_xor_sync(0xffffffffu, hi ? c[0] : c[1], 4);
  d += __shfl_xor_sync(0xffffffffu, d, 2);
  d += __shfl_xor_sync(0xffffffffu, d, 1);
  return d;
}

// f[kk] = fn[kbase + kk] at the unit's offset (zero past k_end).
template <int V, int KC>
__device__ __forceinline__ void LoadHcWeights(typename HcVec<V>::T (&f)[KC], const float* fn, int64_t w, int kbase,
                                              int k_end, int64_t offset) {
#pragma unroll
  for (int kk = 0; kk < KC; ++kk)
    f[kk] = kbase + kk < k_end ? HcVec<V>::Weight(fn + (kbase + kk) * w + offset) : HcVec<V>::Zero();
}

template <int V, int R, int KC>
__global__ void __cluster_dims__(kHcParts, 1, 1) __launch_bounds__(kHcPreThreads, 1)
    HcPreKernel(const float* X, int64_t n, int64_t D, int hc, const float* fn, const float* base, const float* scale,
                int iters, float eps, float norm_eps, bool normalize, const float* norm_w, float rms_eps, float* y,
                float* post, float* comb) {
  static_assert(KC % 8 == 0, "the mixes are reduced in groups of 8");
  using Vec = HcVec<V>;
  __shared__ float part_dot[kMaxHc * kMaxHc * R];  // [k - k_begin][r]: this block's sums, read by the cluster
  __shared__ float part_ss[R];
  __shared__ float part_yy[R];  // role 0 with normalize: this block's sums of y^2
  __shared__ float red[kHcPreWarps][R * KC];
  __shared__ float red_ss[kHcPreWarps][R];
  __shared__ float pre[R][kMaxHc];
  __shared__ float cells[R][kMaxHc * kMaxHc];
  __shared__ float sinkhorn[kMaxHc * kMaxHc];
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, role = blockIdx.y;
  const unsigned rank = cluster.block_rank();
  const int64_t row0 = static_cast<int64_t>(blockIdx.z) * R, w = hc * D, Dv = D / V;
  const int K = (2 + hc) * hc, k_begin = role == 0 ? 0 : 2 * hc, k_end = role == 0 ? 2 * hc : K;
  const int64_t c0 = rank * Dv / kHcParts, cols = (rank + 1) * Dv / kHcParts - c0, units = hc * cols;
  // Unit u: stream u / cols, column range c0 + u % cols; its offset in a row of X (and of fn's rows).
  auto offset = [&](int64_t u) { return (u / cols) * D + (c0 + u % cols) * V; };

  typename Vec::T f[KC];
  if (t < units) LoadHcWeights<V, KC>(f, fn, w, k_begin, k_end, offset(t));
  PdlWait();
  PdlTrigger();
  float ss[R];
#pragma unroll
  for (int r = 0; r < R; ++r) ss[r] = 0.0f;
  for (int kbase = k_begin; kbase < k_end; kbase += KC) {
    float acc[R][KC / 8][8];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int kk = 0; kk < KC; ++kk) acc[r][kk / 8][kk % 8] = 0.0f;
    for (int64_t u = t; u < units; u += kHcPreThreads) {
      const int64_t off = offset(u);
      if (kbase != k_begin || u != t) LoadHcWeights<V, KC>(f, fn, w, kbase, k_end, off);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const typename Vec::T x = row0 + r < n ? Vec::Load(X + (row0 + r) * w + off) : Vec::Zero();
        if (kbase == k_begin) ss[r] = Vec::Dot(x, x, ss[r]);
#pragma unroll
        for (int kk = 0; kk < KC; ++kk) acc[r][kk / 8][kk % 8] = Vec::Dot(f[kk], x, acc[r][kk / 8][kk % 8]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int g = 0; g < KC / 8; ++g) {
        const float v = TransposedWarpSum8(acc[r][g]);
        if (lane % 4 == 0) red[warp][r * KC + g * 8 + lane / 4] = v;
      }
    if (kbase == k_begin)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float v = WarpSum(ss[r]);
        if (lane == 0) red_ss[warp][r] = v;
      }
    __syncthreads();
    if (t < R * KC && kbase + t % KC < k_end) {
      float s = 0.0f;
      for (int q = 0; q < kHcPreWarps; ++q) s += red[q][t];
      part_dot[(kbase + t % KC - k_begin) * R + t / KC] = s;
    }
    if (kbase == k_begin && t < R) {
      float s = 0.0f;
      for (int q = 0; q < kHcPreWarps; ++q) s += red_ss[q][t];
      part_ss[t] = s;
    }
    __syncthreads();  // red is refilled by the next KC mixes
  }
  __cluster_barrier_arrive();  // release: this block's part_dot / part_ss ...
  __cluster_barrier_wait();    // ... and the peers' are visible (every block of the cluster has started)

  // Mix k (its index among the role's) of row r: the kHcParts partial sums in rank order.
  const float inv_w = 1.0f / static_cast<float>(w);
  auto mix = [&](int k, int r) {
    float s = 0.0f, dot = 0.0f;
    for (unsigned q = 0; q < kHcParts; ++q) {
      s += *cluster.map_shared_rank(&part_ss[r], q);
      dot += *cluster.map_shared_rank(&part_dot[k * R + r], q);
    }
    return (1.0f / sqrtf(s * inv_w + norm_eps)) * dot;
  };
  if (role == 0) {
    const int nk = rank == 0 ? 2 * hc : hc;  // rank 0 also writes post
    for (int j = t; j < R * nk; j += kHcPreThreads) {
      const int r = j / nk, k = j % nk;
      const float m = mix(k, r);
      if (k < hc) pre[r][k] = Sigmoid(m * scale[0] + base[k]) + eps;
      else if (row0 + r < n) post[(row0 + r) * hc + k - hc] = 2.0f * Sigmoid(m * scale[1] + base[k]);
    }
    __cluster_barrier_arrive();  // done with the peers' shared memory
    __syncthreads();
    // Thread t takes columns t, t + 512, ... of every row of the group (the same columns whatever R is, so
    // y's sums of squares, like the mixes, do not depend on the batch); the loads of all R rows and hc
    // streams are straight-line code, in flight together.
    float yy[R];  // this thread's sum of y^2 per row (the RmsNorm of y)
#pragma unroll
    for (int r = 0; r < R; ++r) yy[r] = 0.0f;
    for (int64_t j = t; j < cols; j += kHcPreThreads) {
      const int64_t col = (c0 + j) * V;
      typename Vec::T acc[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        acc[r] = Vec::Zero();
#pragma unroll
        for (int i = 0; i < kMaxHc; ++i)
          if (i < hc && row0 + r < n) acc[r] = Vec::Axpy(pre[r][i], Vec::Load(X + (row0 + r) * w + i * D + col), acc[r]);
      }
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (row0 + r < n) {
          Vec::Store(y + (row0 + r) * D + col, acc[r]);
          yy[r] = Vec::Dot(acc[r], acc[r], yy[r]);
        }
    }
    if (normalize) {  // y = norm_w * (y * rsqrt(mean(y^2) + rms_eps)): the row's sum through the cluster again
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float v = WarpSum(yy[r]);
        if (lane == 0) red_ss[warp][r] = v;
      }
      __syncthreads();
      if (t < R) {
        float s = 0.0f;
        for (int q = 0; q < kHcPreWarps; ++q) s += red_ss[q][t];
        part_yy[t] = s;
      }
      __cluster_barrier_wait();    // (the peers are done with part_ss / part_dot)
      __cluster_barrier_arrive();  // release: part_yy ...
      __cluster_barrier_wait();    // ... and the peers' are visible
      for (int r = 0; r < R; ++r) {
        const int64_t row = row0 + r;
        if (row >= n) break;
        float s = 0.0f;
        for (unsigned q = 0; q < kHcParts; ++q) s += *cluster.map_shared_rank(&part_yy[r], q);
        const float inv = 1.0f / sqrtf(s / static_cast<float>(D) + rms_eps);
        for (int64_t j = t; j < cols; j += kHcPreThreads) {  // the values this thread wrote above
          const int64_t col = (c0 + j) * V;
          Vec::Store(y + row * D + col, Vec::Norm(Vec::Load(y + row * D + col), inv, norm_w ? norm_w + col : nullptr));
        }
      }
      __cluster_barrier_arrive();  // done with the peers' part_yy
    }
  } else {
    const int nc = hc * hc;
    if (rank == 0)
      for (int j = t; j < R * nc; j += kHcPreThreads) {
        const int r = j / nc, c = j % nc;
        cells[r][c] = mix(c, r) * scale[2] + base[2 * hc + c];
      }
    __cluster_barrier_arrive();  // done with the peers' shared memory
    if (rank == 0) {
      __syncthreads();
      if (hc <= kWarpSinkhornHc) {  // one warp per row
        const int64_t row = row0 + warp;
        if (warp < R && row < n) {
          const float v = WarpSinkhorn(lane < nc ? cells[warp][lane] : 0.0f, hc, iters, eps);
          if (lane < nc) comb[row * nc + lane] = v;
        }
      } else {
        for (int r = 0; r < R && row0 + r < n; ++r) {
          const float v = SinkhornCells(sinkhorn, t < nc ? cells[r][t] : 0.0f, hc, iters, eps, [] { __syncthreads(); });
          if (t < nc) comb[(row0 + r) * nc + t] = v;
        }
      }
    }
  }
  __cluster_barrier_wait();  // no block leaves while a peer may still read its shared memory
}

__global__ void HcHeadFinishKernel(const float* X, int64_t D, int hc, const float* mixes_all, const float* base,
                                   const float* scale, float eps, float* y) {
  PdlWait();
  PdlTrigger();
  __shared__ float pre[kMaxHc];
  const int64_t r = blockIdx.x;
  const float* x = X + r * hc * D;
  if (threadIdx.x < hc) pre[threadIdx.x] = Sigmoid(mixes_all[r * hc + threadIdx.x] * scale[0] + base[threadIdx.x]) + eps;
  __syncthreads();
  for (int64_t k = threadIdx.x; k < D; k += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < hc; ++i) acc += pre[i] * x[i * D + k];
    y[r * D + k] = acc;
  }
}

__global__ void HcExpandKernel(const float* h, int64_t D, int hc, float* X) {
  PdlWait();
  PdlTrigger();
  const int64_t r = blockIdx.x;
  for (int64_t k = threadIdx.x; k < D; k += blockDim.x) {
    const float v = h[r * D + k];
    for (int i = 0; i < hc; ++i) X[(r * hc + i) * D + k] = v;
  }
}

// out[j] = post[j] * f + sum_i comb[i][j] * X[i], accumulated in the CPU op's order.
__global__ void HcPostKernel(const float* X, const float* f, const float* post, const float* comb, int64_t n,
                             int64_t D, int hc, float* out) {
  PdlWait();
  PdlTrigger();
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y)
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < D; k += (int64_t)gridDim.x * blockDim.x) {
    const float fr = f[r * D + k];
    for (int j = 0; j < hc; ++j) {
      float o = post[r * hc + j] * fr;
      for (int i = 0; i < hc; ++i) o += comb[r * hc * hc + i * hc + j] * X[(r * hc + i) * D + k];
      out[(r * hc + j) * D + k] = o;
    }
  }
}

}  // namespace

void Embedding(const void* table, WType type, int64_t dim, const int32_t* tokens, int64_t n, float* out,
               cudaStream_t s) {
  if (n <= 0) return;
  switch (type) {
    case WType::kF32:
      PdlLaunch(EmbeddingKernel<float>, n, kThreads, 0, s, static_cast<const float*>(table), dim, tokens, out);
      break;
    case WType::kBF16:
      PdlLaunch(EmbeddingKernel<__nv_bfloat16>, n, kThreads, 0, s, static_cast<const __nv_bfloat16*>(table), dim,
                tokens, out);
      break;
    case WType::kF16:
      PdlLaunch(EmbeddingKernel<__half>, n, kThreads, 0, s, static_cast<const __half*>(table), dim, tokens, out);
      break;
  }
}

void RmsNorm(const float* x, int64_t groups, int64_t dim, const float* weight, float eps, float* out, cudaStream_t s) {
  if (groups <= 0) return;
  const int64_t dim4 = dim / 4;
  const bool vec = dim % 4 == 0 && dim4 <= int64_t{kRmsPer} * 1024 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0 && reinterpret_cast<uintptr_t>(weight) % 16 == 0;
  if (vec) {
    const int64_t per_thread = (dim4 + 1023) / 1024;  // 1..kRmsPer float4 per thread
    const int64_t threads = ((dim4 + per_thread - 1) / per_thread + 31) / 32 * 32;
    PdlLaunch(RmsNormVec4Kernel, groups, static_cast<unsigned>(threads), 0, s, reinterpret_cast<const float4*>(x), dim4,
              reinterpret_cast<const float4*>(weight), eps, 1.0f / static_cast<float>(dim),
              reinterpret_cast<float4*>(out));
    return;
  }
  PdlLaunch(RmsNormKernel, groups, dim >= 1024 ? 512 : 128, 0, s, x, dim, weight, eps, out);
}

void Add(const float* a, int64_t n, float* acc, cudaStream_t s) {
  if (n > 0) PdlLaunch(AddKernel, Blocks(n), kThreads, 0, s, a, n, acc);
}

void Scale(float* x, int64_t n, float v, cudaStream_t s) {
  if (n > 0) PdlLaunch(ScaleKernel, Blocks(n), kThreads, 0, s, x, n, v);
}

void Rope(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t rope_dim, const int64_t* positions,
          const float* inv_freq, bool inverse, cudaStream_t s) {
  if (n > 0)
    PdlLaunch(RopeKernel, dim3(Blocks(heads * (rope_dim / 2), 128), RowBlocks(n)), 128, 0, s, x, n, heads, head_dim,
              rope_dim, positions, inv_freq, inverse);
}

void ToHalfPadded(const float* x, int64_t rows, int64_t cols, int64_t ld_in, uint16_t* out, int64_t ld_out,
                  int64_t col0, cudaStream_t s) {
  if (rows > 0)
    PdlLaunch(ToHalfPaddedKernel, dim3(Blocks(ld_out), RowBlocks(rows)), kThreads, 0, s, x, rows, cols, ld_in, out,
              ld_out, col0);
}

void GroupMajorToHalf(const float* x, int64_t m, int64_t groups, int64_t in, uint16_t* xh, cudaStream_t s) {
  if (m > 0) PdlLaunch(GroupMajorToHalfKernel, Blocks(m * groups * in), kThreads, 0, s, x, m, groups, in, xh);
}

void RowMajorFromGroups(const float* yg, int64_t m, int64_t groups, int64_t cols, float* out, cudaStream_t s) {
  if (m > 0) PdlLaunch(RowMajorFromGroupsKernel, Blocks(m * groups * cols), kThreads, 0, s, yg, m, groups, cols, out);
}

void TakeColumns(const float* y, int64_t rows, int64_t ld_y, int64_t col0, int64_t cols, const float* bias,
                 float* out, int64_t ld_out, bool accumulate, cudaStream_t s) {
  if (rows > 0)
    PdlLaunch(TakeColumnsKernel, dim3(Blocks(cols), RowBlocks(rows)), kThreads, 0, s, y, rows, ld_y, col0, cols, bias,
              out, ld_out, accumulate);
}

void GatherRows(const float* src, const int32_t* rows, int64_t n, int64_t width, float* dst, cudaStream_t s) {
  if (n > 0) PdlLaunch(GatherRowsKernel, n, kThreads, 0, s, src, rows, width, dst);
}

void ScatterAddRows(const float* src, const int32_t* rows, const float* w, int64_t n, int64_t width, float* dst,
                    cudaStream_t s) {
  if (n > 0) PdlLaunch(ScatterAddRowsKernel, n, kThreads, 0, s, src, rows, w, width, dst);
}

void SwiGlu(float* g, const float* u, int64_t n, float limit, cudaStream_t s) {
  if (n > 0) PdlLaunch(SwiGluKernel, Blocks(n), kThreads, 0, s, g, u, n, limit);
}

void SwiGluToHalf(const float* g, const float* u, int64_t n, float limit, uint16_t* gh, cudaStream_t s) {
  if (n > 0) PdlLaunch(SwiGluToHalfKernel, Blocks(n), kThreads, 0, s, g, u, n, limit, gh);
}

namespace {

constexpr int kCopyBatchMax = 32;
struct ByteCopies {
  ByteCopy c[kCopyBatchMax];
};

// blockIdx.y = copy; 16-byte words when the copy allows them (the state rows always do), else bytes.
__global__ void CopyBytesBatchKernel(const __grid_constant__ ByteCopies copies) {
  PdlWait();
  PdlTrigger();
  const ByteCopy& c = copies.c[blockIdx.y];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (((reinterpret_cast<uintptr_t>(c.src) | reinterpret_cast<uintptr_t>(c.dst) | c.bytes) & 15) == 0) {
    const int4* src = static_cast<const int4*>(c.src);
    int4* dst = static_cast<int4*>(c.dst);
    for (int64_t i = first; i < c.bytes / 16; i += stride) dst[i] = src[i];
  } else {
    const char* src = static_cast<const char*>(c.src);
    char* dst = static_cast<char*>(c.dst);
    for (int64_t i = first; i < c.bytes; i += stride) dst[i] = src[i];
  }
}

}  // namespace

int CopyBytesBatchMax() { return kCopyBatchMax; }

void CopyBytesBatch(const ByteCopy* copies, int n, cudaStream_t s) {
  if (n <= 0) return;
  if (n > kCopyBatchMax) throw std::runtime_error("cuda CopyBytesBatch: " + std::to_string(n) + " copies, at most " +
                                                  std::to_string(kCopyBatchMax));
  ByteCopies all{};
  int64_t most = 0;
  for (int i = 0; i < n; ++i) {
    all.c[i] = copies[i];
    most = copies[i].bytes > most ? copies[i].bytes : most;
  }
  const int64_t words = (most + 15) / 16;
  const unsigned blocks = static_cast<unsigned>(words / 256 + 1 < 64 ? words / 256 + 1 : 64);
  PdlLaunch(CopyBytesBatchKernel, dim3(blocks, static_cast<unsigned>(n)), 256, 0, s, all);
}

void CopyRows(const void* src, int64_t src_row, void* dst, int64_t dst_row, int64_t rows, int64_t row_bytes,
              cudaStream_t s) {
  if (rows <= 0) return;
  cudaMemcpyAsync(static_cast<char*>(dst) + dst_row * row_bytes, static_cast<const char*>(src) + src_row * row_bytes,
                  rows * row_bytes, cudaMemcpyDeviceToDevice, s);
}

template <int V>
static void LaunchHcPre(const float* X, int64_t n, int64_t D, int hc, const float* fn, const float* base,
                        const float* scale, int iters, float eps, float norm_eps, const HcYNorm* y_norm, float* y,
                        float* post, float* comb, cudaStream_t s) {
  // One row: 16 mixes per pass (the comb's 16 at hc 4 in one round of loads); more: 4 rows per cluster
  // (fn read once for the 4), 8 mixes per pass (registers).
  const int rows = n == 1 ? 1 : 4;
  const dim3 grid(kHcParts, 2, static_cast<unsigned>((n + rows - 1) / rows));
  const bool normalize = y_norm != nullptr;
  const float* norm_w = normalize ? y_norm->weight : nullptr;
  const float rms_eps = normalize ? y_norm->eps : 0.0f;
  if (rows == 1)
    PdlLaunch(HcPreKernel<V, 1, 16>, grid, kHcPreThreads, 0, s, X, n, D, hc, fn, base, scale, iters, eps, norm_eps,
              normalize, norm_w, rms_eps, y, post, comb);
  else
    PdlLaunch(HcPreKernel<V, 4, 8>, grid, kHcPreThreads, 0, s, X, n, D, hc, fn, base, scale, iters, eps, norm_eps,
              normalize, norm_w, rms_eps, y, post, comb);
}

void HcPre(const float* X, int64_t n, int64_t D, int hc, const float* fn, const float* base, const float* scale,
           int iters, float eps, float norm_eps, float* y, float* post, float* comb, cudaStream_t s,
           const HcYNorm* y_norm) {
  if (n <= 0) return;
  if (n > 65535) throw std::runtime_error("cuda HcPre: " + std::to_string(n) + " rows, at most 65535 per call");
  if (hc < 1 || hc > kMaxHc) throw std::runtime_error("cuda HcPre: hc " + std::to_string(hc) + " not in 1..16");
  const uintptr_t addresses = reinterpret_cast<uintptr_t>(X) | reinterpret_cast<uintptr_t>(fn) |
                              reinterpret_cast<uintptr_t>(y) | reinterpret_cast<uintptr_t>(y_norm ? y_norm->weight : nullptr);
  if (D % 4 == 0 && addresses % 16 == 0)
    LaunchHcPre<4>(X, n, D, hc, fn, base, scale, iters, eps, norm_eps, y_norm, y, post, comb, s);
  else
    LaunchHcPre<1>(X, n, D, hc, fn, base, scale, iters, eps, norm_eps, y_norm, y, post, comb, s);
}

void HcExpand(const float* h, int64_t n, int64_t D, int hc, float* X, cudaStream_t s) {
  if (n > 0) PdlLaunch(HcExpandKernel, n, kThreads, 0, s, h, D, hc, X);
}

void HcPost(const float* X, const float* f, const float* post, const float* comb, int64_t n, int64_t D, int hc,
            float* out, cudaStream_t s) {
  if (n > 0) PdlLaunch(HcPostKernel, dim3(Blocks(D), RowBlocks(n)), kThreads, 0, s, X, f, post, comb, n, D, hc, out);
}

void HcHead(const float* X, int64_t n, int64_t D, int hc, const float* fn, const float* base, const float* scale,
            float eps, float norm_eps, float* mixes, float* y, cudaStream_t s) {
  if (n <= 0) return;
  PdlLaunch(HcMixesKernel, dim3(static_cast<unsigned>(n), hc), 512, 0, s, X, hc * D, fn, hc, norm_eps, mixes);
  PdlLaunch(HcHeadFinishKernel, n, kThreads, 0, s, X, D, hc, mixes, base, scale, eps, y);
}

__global__ void SpinKernel(int64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < static_cast<uint64_t>(ns));
}

void Spin(int64_t ns, cudaStream_t s) { SpinKernel<<<1, 1, 0, s>>>(ns); }

}  // namespace dsmesh::cuda_ops
