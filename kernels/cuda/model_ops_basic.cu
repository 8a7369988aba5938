// Elementwise, normalisation, rope, hyper-connection and row-movement kernels of the model forward
// (model_ops.h). Each mirrors the CPU op of the same name in kernels/cpu/cpu_backend.cc.
// Every kernel here but SpinKernel (the profiler's) is launched through PdlLaunch (pdl_launch.cuh) and
// starts with PdlWait() (it reads the previous kernels' output from its first load on; its prologue is
// index math only) and then PdlTrigger(), so that with programmatic dependent launch the next kernel's
// launch overlaps all of it.
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

// HcPre's first half, the K = (2 + hc) hc mixes of a row as partial sums: block (r, k, p) takes the p-th
// of `parts` equal ranges of the row (hc D values) and stores (sum of x^2, fn[k] . x) over it, each thread
// adding its elements in index order. The apply kernel adds the parts in part order.
__global__ void HcMixPartsKernel(const float* X, int64_t w, const float* fn, int K, int parts, float2* out) {
  PdlWait();
  PdlTrigger();
  const int64_t r = blockIdx.x;
  const int k = blockIdx.y, part = blockIdx.z;
  const int64_t len = w / parts, begin = part * len, end = part + 1 == parts ? w : begin + len;
  const float* x = X + r * w;
  const float* f = fn + k * w;
  float ss = 0.0f, dot = 0.0f;
#pragma unroll 8
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float v = x[i];
    ss += v * v;
    dot += __ldg(f + i) * v;
  }
  ss = BlockSum(ss);
  dot = BlockSum(dot);
  if (threadIdx.x == 0) out[(r * K + k) * parts + part] = make_float2(ss, dot);
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

// HcPre's second half. Grid (column blocks of D, rows). Every block adds its row's mix parts (part
// order), takes pre = sigmoid + eps and writes its columns of y = sum_i pre_i X_i; block 0 of the row also
// writes post (2 sigmoid), comb (SinkhornCells) and the mixes. Block 0's normalisation runs beside the
// other blocks' y.
__global__ void HcPreApplyKernel(const float* X, int64_t D, int hc, const float2* mix_parts, int parts,
                                 float inv_w, float norm_eps, const float* base, const float* scale, int iters,
                                 float eps, float* mixes_out, float* y, float* post, float* comb) {
  PdlWait();
  PdlTrigger();
  __shared__ float mixes[(2 + kMaxHc) * kMaxHc];
  __shared__ float pre[kMaxHc];
  __shared__ float c[kMaxHc * kMaxHc];
  const int64_t r = blockIdx.y;
  const int K = (2 + hc) * hc, t = threadIdx.x;
  const bool first = blockIdx.x == 0;
  for (int k = t; k < (first ? K : hc); k += blockDim.x) {
    const float2* q = mix_parts + (r * K + k) * parts;
    float ss = 0.0f, dot = 0.0f;
#pragma unroll 8
    for (int p = 0; p < parts; ++p) {  // the loads are independent: all in flight at once
      ss += q[p].x;
      dot += q[p].y;
    }
    mixes[k] = (1.0f / sqrtf(ss * inv_w + norm_eps)) * dot;
    if (first) mixes_out[r * K + k] = mixes[k];
  }
  __syncthreads();
  if (t < hc) pre[t] = Sigmoid(mixes[t] * scale[0] + base[t]) + eps;
  if (first) {
    if (t < hc) post[r * hc + t] = 2.0f * Sigmoid(mixes[hc + t] * scale[1] + base[hc + t]);
    const int cells = hc * hc;
    const float v = t < cells ? mixes[2 * hc + t] * scale[2] + base[2 * hc + t] : 0.0f;
    if (cells <= 32) {
      if (t < 32) {
        const float out = SinkhornCells(c, v, hc, iters, eps, [] { __syncwarp(); });
        if (t < cells) comb[r * cells + t] = out;
      }
    } else {
      const float out = SinkhornCells(c, v, hc, iters, eps, [] { __syncthreads(); });
      if (t < cells) comb[r * cells + t] = out;
    }
  }
  __syncthreads();
  const float* x = X + r * hc * D;
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + t; k < D; k += (int64_t)gridDim.x * blockDim.x) {
    float acc = 0.0f;
    for (int ii = 0; ii < hc; ++ii) acc += pre[ii] * x[ii * D + k];
    y[r * D + k] = acc;
  }
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

static int HcMixParts(int64_t w) { return static_cast<int>(w / 2048 < 1 ? 1 : (w / 2048 > 8 ? 8 : w / 2048)); }

int64_t HcPreScratchFloats(int64_t n, int64_t D, int hc) {
  const int64_t K = (2 + hc) * hc;
  return (n * K + 1) / 2 * 2 + 2 * n * K * HcMixParts(hc * D);  // the parts (float2) start 8-byte aligned
}

void HcPre(const float* X, int64_t n, int64_t D, int hc, const float* fn, const float* base, const float* scale,
           int iters, float eps, float norm_eps, float* mixes, float* y, float* post, float* comb, cudaStream_t s) {
  if (n <= 0) return;
  if (n > 65535) throw std::runtime_error("cuda HcPre: " + std::to_string(n) + " rows, at most 65535 per call");
  const int K = (2 + hc) * hc, parts = HcMixParts(hc * D);
  auto* mix_parts = reinterpret_cast<float2*>(mixes + (n * K + 1) / 2 * 2);
  PdlLaunch(HcMixPartsKernel, dim3(static_cast<unsigned>(n), K, parts), kThreads, 0, s, X, hc * D, fn, K, parts,
            mix_parts);
  PdlLaunch(HcPreApplyKernel, dim3(Blocks(D), RowBlocks(n)), kThreads, 0, s, X, D, hc, mix_parts, parts,
            1.0f / static_cast<float>(hc * D), norm_eps, base, scale, iters, eps, mixes, y, post, comb);
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
