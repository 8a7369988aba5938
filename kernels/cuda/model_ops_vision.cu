// The ops of image steps and of the vision tower (model_ops.h, "image steps and the vision tower"): span
// window attention of the language model's image rows, and the ViT's rotate-half RoPE, attention inside
// each image, exact GELU and the aligner's r x r unfold. CPU twins: CpuBackend::SpanWindowAttention
// (kernels/cpu/cpu_backend.cc) and kernels/cpu/vision_ops.cc.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/kv_rows_device.cuh"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/model_ops_device.cuh"

namespace dsmesh::cuda_ops {
namespace {

constexpr int kThreads = 256;

unsigned GridFor(int64_t total) {
  const int64_t b = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

// ---- span window attention ----
// One block per (row, head); each warp walks every warps-th key with an online softmax, its lanes holding
// channels lane, lane + 32, ... of q, of the key and of the running output (head_dim <= 32 * kWinPerLane);
// the warps' partial results are merged with the sink at the end.
constexpr int kWinWarps = kThreads / 32;
constexpr int kWinPerLane = 16;
constexpr int kWinMaxHeadDim = 32 * kWinPerLane;

struct WindowKeys {
  const float* ring;
  const float* new_kv;
  PagedRowsDev entries;  // pool null: no compressed entries
  const int32_t* topk;   // null: every visible entry
  int64_t topk_cols, start, num_entries, d, ring_slots;
  int ratio;
};

__global__ void __launch_bounds__(kThreads) SpanWindowAttentionKernel(const float* q, int64_t heads,
                                                                      const WindowKeys keys,
                                                                      const int64_t* visible_from,
                                                                      const int64_t* visible_to, const float* sinks,
                                                                      float softmax_scale, float* out) {
  __shared__ float part_m[kWinWarps], part_l[kWinWarps];
  __shared__ float part_acc[kWinWarps][kWinMaxHeadDim];
  const int64_t r = blockIdx.x / heads, h = blockIdx.x % heads, d = keys.d, t = keys.start + r;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t lo = visible_from[r], nwin = visible_to[r] - lo + 1;
  const bool comp = keys.entries.pool && keys.ratio > 0;
  const int64_t visible = comp ? min(keys.num_entries, (t + 1) / keys.ratio) : 0;
  const int64_t nkeys = nwin + (comp ? (keys.topk ? keys.topk_cols : visible) : 0);
  const int nope = keys.entries.nope;
  float qr[kWinPerLane], acc[kWinPerLane];
#pragma unroll
  for (int i = 0; i < kWinPerLane; ++i) {
    const int64_t c = lane + 32 * i;
    qr[i] = c < d ? q[(r * heads + h) * d + c] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = warp; j < nkeys; j += kWinWarps) {
    const void* row;
    RowKind kind = RowKind::kF32;
    if (j < nwin) {
      const int64_t p = lo + j;
      row = p < keys.start ? keys.ring + (p % keys.ring_slots) * d : keys.new_kv + (p - keys.start) * d;
    } else {
      const int64_t i = j - nwin;
      const int64_t e = keys.topk ? keys.topk[r * keys.topk_cols + i] : i;
      row = e >= 0 && e < visible ? keys.entries.Row(e) : nullptr;
      kind = keys.entries.kind;
    }
    if (!row) continue;  // the same key for the whole warp
    const float scale = kind == RowKind::kFp8 ? Fp8RowScale(static_cast<const uint8_t*>(row), nope) : 0.0f;
    float kv[kWinPerLane];
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kWinPerLane; ++i) {
      const int c = lane + 32 * i;
      kv[i] = c < d ? StoredRowValue(row, kind, nope, scale, c) : 0.0f;
      dot += qr[i] * kv[i];
    }
    const float s = WarpSum(dot) * softmax_scale;
    const float m_new = fmaxf(m, s);
    const float alpha = expf(m - m_new), p = expf(s - m_new);
    l = l * alpha + p;
#pragma unroll
    for (int i = 0; i < kWinPerLane; ++i) acc[i] = acc[i] * alpha + p * kv[i];
    m = m_new;
  }
  if (lane == 0) {
    part_m[warp] = m;
    part_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kWinPerLane; ++i) {
    const int c = lane + 32 * i;
    if (c < d) part_acc[warp][c] = acc[i];
  }
  __syncthreads();
  const float sink = sinks[h];
  float mx = sink;
  for (int w = 0; w < kWinWarps; ++w) mx = fmaxf(mx, part_m[w]);
  float denom = expf(sink - mx);
  for (int w = 0; w < kWinWarps; ++w)
    if (part_m[w] != -INFINITY) denom += expf(part_m[w] - mx) * part_l[w];
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kWinWarps; ++w)
      if (part_m[w] != -INFINITY) o += expf(part_m[w] - mx) * part_acc[w][c];
    out[(r * heads + h) * d + c] = o / denom;
  }
}

// ---- attention inside spans (the ViT) ----
// One block per (tile, head): a tile is up to kSpanRows query rows of one span, warp w taking row w. The
// span's keys pass through shared memory kSpanKeys at a time (k padded by one float per row, so that lane j
// reading key j meets no bank conflict); lane j scores key j, an online softmax keeps each row's running
// max and sum, and lanes hold the output channels lane, lane + 32, ...
constexpr int kSpanRows = kThreads / 32;
constexpr int kSpanKeys = 32;
constexpr int kSpanPerLane = 4;
constexpr int kSpanMaxHeadDim = 32 * kSpanPerLane;

__global__ void __launch_bounds__(kThreads) SpanAttentionKernel(const float* q, const float* k, const float* v,
                                                                int64_t heads, int64_t d, const int32_t* tiles,
                                                                float softmax_scale, float* out) {
  extern __shared__ float smem[];
  float* qs = smem;                      // [kSpanRows][d]
  float* ks = qs + kSpanRows * d;        // [kSpanKeys][d + 1]
  float* vs = ks + kSpanKeys * (d + 1);  // [kSpanKeys][d]
  const int32_t* tile = tiles + 4 * static_cast<int64_t>(blockIdx.x);
  const int64_t first = tile[0], rows = tile[1], begin = tile[2], end = tile[3];
  const int64_t h = blockIdx.y, width = heads * d;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t i = threadIdx.x; i < kSpanRows * d; i += blockDim.x) {
    const int64_t rr = i / d, c = i % d;
    qs[i] = rr < rows ? q[(first + rr) * width + h * d + c] : 0.0f;
  }
  float m = -INFINITY, l = 0.0f, acc[kSpanPerLane] = {};
  for (int64_t k0 = begin; k0 < end; k0 += kSpanKeys) {
    const int64_t nk = end - k0 < kSpanKeys ? end - k0 : kSpanKeys;
    __syncthreads();  // the previous pass is done with ks / vs (and qs is written)
    for (int64_t i = threadIdx.x; i < kSpanKeys * d; i += blockDim.x) {
      const int64_t j = i / d, c = i % d;
      const bool in = j < nk;
      ks[j * (d + 1) + c] = in ? k[(k0 + j) * width + h * d + c] : 0.0f;
      vs[j * d + c] = in ? v[(k0 + j) * width + h * d + c] : 0.0f;
    }
    __syncthreads();
    if (warp >= rows) continue;  // the same for the whole warp
    float s = -INFINITY;
    if (lane < nk) {
      const float* qr = qs + warp * d;
      const float* kr = ks + lane * (d + 1);
      float dot = 0.0f;
      for (int64_t c = 0; c < d; ++c) dot += qr[c] * kr[c];
      s = dot * softmax_scale;
    }
    const float m_new = fmaxf(m, WarpMax(s));
    const float p = lane < nk ? expf(s - m_new) : 0.0f;
    const float alpha = expf(m - m_new);
    l = l * alpha + WarpSum(p);
#pragma unroll
    for (int i = 0; i < kSpanPerLane; ++i) acc[i] *= alpha;
    for (int j = 0; j < nk; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
      for (int i = 0; i < kSpanPerLane; ++i) {
        const int64_t c = lane + 32 * i;
        if (c < d) acc[i] += pj * vs[j * d + c];
      }
    }
    m = m_new;
  }
  if (warp >= rows) return;
#pragma unroll
  for (int i = 0; i < kSpanPerLane; ++i) {
    const int64_t c = lane + 32 * i;
    if (c < d) out[(first + warp) * width + h * d + c] = acc[i] / l;
  }
}

// ---- elementwise ----
__global__ void RotateHalfKernel(float* x, int64_t n, int64_t heads, int64_t head_dim, const float* angles) {
  const int64_t half = head_dim / 2, total = n * heads * half;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / (heads * half), h = (i / half) % heads, j = i % half;
    const float a = angles[r * half + j], cs = cosf(a), sn = sinf(a);
    float* p = x + (r * heads + h) * head_dim;
    const float x0 = p[j], x1 = p[j + half];
    p[j] = x0 * cs - x1 * sn;
    p[j + half] = x1 * cs + x0 * sn;
  }
}

__global__ void GeluKernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

// One thread per output value: block b (row-major over the ceil(h/r) x ceil(w/r) blocks), feature
// c * r*r + dy * r + dx.
__global__ void Unfold2DKernel(const float* x, int64_t h, int64_t w, int64_t C, int r, float* out) {
  const int64_t bw = (w + r - 1) / r, rr = static_cast<int64_t>(r) * r, feats = C * rr;
  const int64_t total = ((h + r - 1) / r) * bw * feats;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t b = i / feats, f = i % feats, c = f / rr, slot = f % rr;
    const int64_t y = (b / bw) * r + slot / r, xx = (b % bw) * r + slot % r;
    out[i] = y < h && xx < w ? x[(y * w + xx) * C + c] : 0.0f;
  }
}

}  // namespace

int64_t SpanWindowAttentionMaxHeadDim() { return kWinMaxHeadDim; }

void SpanWindowAttention(const float* q, int64_t n, int64_t heads, int64_t d, int64_t start, const float* ring,
                         int64_t ring_slots, const float* new_kv, const int64_t* visible_from,
                         const int64_t* visible_to, PagedRowsDev entries, int64_t num_entries, int ratio,
                         const int32_t* topk, int64_t topk_cols, const float* sinks, float softmax_scale, float* out,
                         cudaStream_t s) {
  if (n <= 0 || heads <= 0) return;
  if (d > kWinMaxHeadDim)
    throw std::runtime_error("cuda SpanWindowAttention: head_dim " + std::to_string(d) + " above " +
                             std::to_string(kWinMaxHeadDim));
  const bool comp = entries.pool && ratio > 0;
  const WindowKeys keys{ring,  new_kv, comp ? entries : PagedRowsDev{}, comp ? topk : nullptr, topk_cols, start,
                        comp ? num_entries : 0, d, ring_slots, ratio};
  SpanWindowAttentionKernel<<<static_cast<unsigned>(n * heads), kThreads, 0, s>>>(q, heads, keys, visible_from,
                                                                                  visible_to, sinks, softmax_scale, out);
}

int64_t SpanAttentionMaxHeadDim() { return kSpanMaxHeadDim; }

std::vector<int32_t> SpanAttentionTiles(const int64_t* spans, int64_t num_spans) {
  std::vector<int32_t> tiles;
  for (int64_t sp = 0; sp < num_spans; ++sp)
    for (int64_t first = spans[sp]; first < spans[sp + 1]; first += kSpanRows) {
      const int64_t rows = spans[sp + 1] - first < kSpanRows ? spans[sp + 1] - first : kSpanRows;
      tiles.insert(tiles.end(), {static_cast<int32_t>(first), static_cast<int32_t>(rows), static_cast<int32_t>(spans[sp]),
                                 static_cast<int32_t>(spans[sp + 1])});
    }
  return tiles;
}

void SpanAttention(const float* q, const float* k, const float* v, int64_t heads, int64_t d, const int32_t* tiles,
                   int64_t num_tiles, float softmax_scale, float* out, cudaStream_t s) {
  if (num_tiles <= 0 || heads <= 0) return;
  if (d > kSpanMaxHeadDim)
    throw std::runtime_error("cuda SpanAttention: head_dim " + std::to_string(d) + " above " +
                             std::to_string(kSpanMaxHeadDim));
  const size_t smem = static_cast<size_t>(kSpanRows * d + kSpanKeys * (d + 1) + kSpanKeys * d) * sizeof(float);
  SpanAttentionKernel<<<dim3(static_cast<unsigned>(num_tiles), static_cast<unsigned>(heads)), kThreads, smem, s>>>(
      q, k, v, heads, d, tiles, softmax_scale, out);
}

void RotateHalf(float* x, int64_t n, int64_t heads, int64_t head_dim, const float* angles, cudaStream_t s) {
  if (n > 0) RotateHalfKernel<<<GridFor(n * heads * (head_dim / 2)), kThreads, 0, s>>>(x, n, heads, head_dim, angles);
}

void Gelu(float* x, int64_t n, cudaStream_t s) {
  if (n > 0) GeluKernel<<<GridFor(n), kThreads, 0, s>>>(x, n);
}

void Unfold2D(const float* x, int64_t h, int64_t w, int64_t C, int r, float* out, cudaStream_t s) {
  const int64_t total = ((h + r - 1) / r) * ((w + r - 1) / r) * C * r * r;
  if (total > 0) Unfold2DKernel<<<GridFor(total), kThreads, 0, s>>>(x, h, w, C, r, out);
}

}  // namespace dsmesh::cuda_ops
