// The stateful ops of the attention block (model_ops.h): compressor position bias and pooling, the
// lightning indexer's scores and its top-k, attention with sinks over window + compressed entries, and
// the window ring update. Each mirrors the CPU op of the same name in kernels/cpu/cpu_backend.cc.
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/model_ops_device.cuh"

namespace dsmesh::cuda_ops {
namespace {

constexpr int kAttnThreads = 256;
constexpr int kTopkThreads = 1024;
constexpr int kMaxTopK = 2048;                       // selection buffer of the top-k kernel
constexpr int64_t kAttnMaxKeys = 40 * 1024;         // score slots of the attention kernel (160 KB)
constexpr int kAttnFixedSmemFloats = 512;            // q row (head_dim <= 512)

__global__ void AddPositionBiasKernel(float* score, int64_t n, int64_t width, const float* ape, int64_t first_pos,
                                      int ratio) {
  const int64_t total = n * width;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    score[i] += ape[((first_pos + r) % ratio) * width + c];
  }
}

// One thread per (window, channel): softmax over the window's slots (window w-1's first halves, then
// window w's second halves with overlap), weighted sum of kv.
__global__ void CompressorPoolKernel(const float* kv, const float* score, int64_t width, int64_t base_pos,
                                     int64_t first_window, int64_t num_windows, int ratio, bool overlap, int64_t d,
                                     float* out) {
  const int64_t total = num_windows * d;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t wi = i / d, ch = i % d, w = first_window + wi;
    const bool prev = overlap && w >= 1;
    const int slots = (prev ? ratio : 0) + ratio;
    auto at = [&](int slot, const float* t) {
      if (prev && slot < ratio) return t[((w - 1) * ratio + slot - base_pos) * width + ch];
      const int tt = prev ? slot - ratio : slot;
      return t[(w * ratio + tt - base_pos) * width + (overlap ? d : 0) + ch];
    };
    float mx = -INFINITY;
    for (int sl = 0; sl < slots; ++sl) mx = fmaxf(mx, at(sl, score));
    float sum = 0.0f, acc = 0.0f;
    for (int sl = 0; sl < slots; ++sl) {
      const float e = expf(at(sl, score) - mx);
      sum += e;
      acc += e * at(sl, kv);
    }
    out[wi * d + ch] = acc / sum;
  }
}

// scores[r, w] = sum_h weights[r, h] * relu(q[r, h] . keys[w]) for w < valid(r); one warp per key.
__global__ void IndexerScoresKernel(const float* q, const float* weights, PagedRowsDev keys, int64_t num_keys,
                                    int64_t heads, int64_t dim, const int64_t* positions, int ratio,
                                    int64_t ld_scores, float* scores) {
  extern __shared__ float qs[];  // heads * dim
  const int64_t r = blockIdx.y;
  const int64_t valid = min(num_keys, (positions[r] + 1) / ratio);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) * 8;
  if (first >= valid) return;
  for (int64_t i = threadIdx.x; i < heads * dim; i += blockDim.x) qs[i] = q[r * heads * dim + i];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t w = first + warp; w < min(valid, first + warps * 8); w += warps) {
    const float* k = keys.Row(w, dim);
    float s = 0.0f;
    for (int64_t h = 0; h < heads; ++h) {
      float dot = 0.0f;
      for (int64_t c = lane; c < dim; c += 32) dot += qs[h * dim + c] * k[c];
      dot = WarpSum(dot);
      s += weights[r * heads + h] * fmaxf(0.0f, dot);
    }
    if (lane == 0) scores[r * ld_scores + w] = s;
  }
}

// A float as an unsigned key that orders like the float (larger float -> larger key).
__device__ __forceinline__ uint32_t OrderKey(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exclusive prefix of `flag` over the block in thread order; returns it and sets *total.
__device__ int BlockExclusiveScan(int flag, int* total) {
  __shared__ int warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int in_warp = __popc(ballot & ((1u << lane) - 1));
  __syncthreads();
  if (lane == 0) warp_sums[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < warps; ++w) {
    if (w < warp) before += warp_sums[w];
    all += warp_sums[w];
  }
  *total = all;
  return before + in_warp;
}

// Top-k of one row's scores: a 4-pass radix select finds the k-th largest key, an ordered compaction
// takes every key above it and the lowest-index keys equal to it, and a bitonic sort orders the
// selection by (score desc, index asc) like the CPU's partial_sort. Deterministic (no atomics in the
// output path).
__global__ void TopKKernel(const float* scores, int64_t ld_scores, int64_t num_keys, const int64_t* positions,
                           int ratio, int top_k, int32_t* out) {
  __shared__ unsigned hist[256];
  __shared__ uint32_t sel_key[kMaxTopK];
  __shared__ int32_t sel_idx[kMaxTopK];
  __shared__ uint32_t s_prefix, s_mask;
  __shared__ int s_remaining;
  const int64_t r = blockIdx.x;
  const float* sc = scores + r * ld_scores;
  const int64_t valid = min(num_keys, (positions[r] + 1) / ratio);
  const int k = static_cast<int>(valid < top_k ? valid : static_cast<int64_t>(top_k));

  // 1. Threshold: the k-th largest key (skipped when every key is taken).
  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_mask = 0;
    s_remaining = k;
  }
  __syncthreads();
  const bool take_all = valid <= top_k;
  if (!take_all) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      const uint32_t prefix = s_prefix, mask = s_mask;
      for (int64_t i = threadIdx.x; i < valid; i += blockDim.x) {
        const uint32_t key = OrderKey(sc[i]);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int remaining = s_remaining, cum = 0, digit = 255;
        for (; digit > 0; --digit) {
          if (cum + static_cast<int>(hist[digit]) >= remaining) break;
          cum += hist[digit];
        }
        s_remaining = remaining - cum;  // keys equal to the threshold still to take (after this pass)
        s_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
        s_mask = mask | (255u << shift);
      }
      __syncthreads();
    }
  }
  const uint32_t threshold = s_prefix;
  const int equal_needed = take_all ? 0 : s_remaining;

  // 2. Ordered compaction: keys above the threshold, then the first `equal_needed` equal ones.
  int taken = 0, equal_taken = 0;
  for (int64_t base = 0; base < valid; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    uint32_t key = 0;
    bool above = false, equal = false;
    if (i < valid) {
      key = OrderKey(sc[i]);
      above = take_all || key > threshold;
      equal = !take_all && key == threshold;
    }
    int eq_total = 0;
    const int eq_rank = BlockExclusiveScan(equal ? 1 : 0, &eq_total);
    const bool take = above || (equal && equal_taken + eq_rank < equal_needed);
    int total = 0;
    const int slot = BlockExclusiveScan(take ? 1 : 0, &total);
    if (take && taken + slot < kMaxTopK) {
      sel_key[taken + slot] = key;
      sel_idx[taken + slot] = static_cast<int32_t>(i);
    }
    taken += total;
    equal_taken += eq_total;
  }
  __syncthreads();

  // 3. Bitonic sort of the selection, padded to a power of two.
  int size = 1;
  while (size < k) size <<= 1;
  for (int i = k + threadIdx.x; i < size; i += blockDim.x) {
    sel_key[i] = 0;
    sel_idx[i] = 0x7fffffff;
  }
  __syncthreads();
  for (int len = 2; len <= size; len <<= 1) {
    for (int stride = len >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < size; i += blockDim.x) {
        const int j = i ^ stride;
        if (j <= i) continue;
        // "before(a, b)": a sorts first = larger key, or equal key and smaller index.
        const bool i_first = sel_key[i] > sel_key[j] || (sel_key[i] == sel_key[j] && sel_idx[i] < sel_idx[j]);
        const bool ascending_block = (i & len) == 0;
        if (ascending_block != i_first) {
          const uint32_t tk = sel_key[i];
          sel_key[i] = sel_key[j];
          sel_key[j] = tk;
          const int32_t ti = sel_idx[i];
          sel_idx[i] = sel_idx[j];
          sel_idx[j] = ti;
        }
      }
      __syncthreads();
    }
  }
  for (int i = threadIdx.x; i < top_k; i += blockDim.x) out[r * top_k + i] = i < k ? sel_idx[i] : -1;
}

// Key j of query row r: the window rows first, then the compressed entries (listed or all visible).
// Null for a listed entry that is absent or not yet visible.
struct AttnKeys {
  const float* ring;
  const float* new_kv;
  PagedRowsDev entries;
  const int32_t* topk;
  int64_t topk_cols, start, num_entries, d, ring_slots;
  int window, ratio;

  __device__ const float* Key(int64_t r, int64_t lo, int64_t nwin, int64_t visible, int64_t j) const {
    if (j < nwin) {
      const int64_t p = lo + j;
      return p < start ? ring + (p % ring_slots) * d : new_kv + (p - start) * d;
    }
    const int64_t i = j - nwin;
    const int64_t e = topk ? topk[r * topk_cols + i] : i;
    return e >= 0 && e < visible ? entries.Row(e, d) : nullptr;
  }
};

// One block per (row, head): scores into shared memory, softmax with the sink, weighted sum of keys.
__global__ void AttentionKernel(const float* q, int64_t heads, AttnKeys keys, const float* sinks,
                                float softmax_scale, float* out) {
  extern __shared__ float smem[];
  float* qs = smem;                          // d
  float* s = smem + kAttnFixedSmemFloats;    // keys
  const int64_t r = blockIdx.x / heads, h = blockIdx.x % heads, d = keys.d;
  const int64_t t = keys.start + r;
  const int64_t lo = t - keys.window + 1 > 0 ? t - keys.window + 1 : 0;
  const int64_t nwin = t - lo + 1;
  int64_t visible = 0, ncomp = 0;
  if (keys.entries.pool && keys.ratio > 0) {
    visible = min(keys.num_entries, (t + 1) / keys.ratio);
    ncomp = keys.topk ? keys.topk_cols : visible;
  }
  const int64_t nkeys = nwin + ncomp;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) qs[c] = q[(r * heads + h) * d + c];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t j = warp; j < nkeys; j += warps) {
    const float* k = keys.Key(r, lo, nwin, visible, j);
    float dot = 0.0f;
    if (k)
      for (int64_t c = lane; c < d; c += 32) dot += qs[c] * k[c];
    dot = WarpSum(dot);
    if (lane == 0) s[j] = k ? dot * softmax_scale : -INFINITY;
  }
  __syncthreads();
  const float sink = sinks[h];
  float mx = sink;
  for (int64_t j = threadIdx.x; j < nkeys; j += blockDim.x) mx = fmaxf(mx, s[j]);
  mx = BlockReduce<true>(mx);
  float part = 0.0f;
  for (int64_t j = threadIdx.x; j < nkeys; j += blockDim.x) {
    const float e = s[j] == -INFINITY ? 0.0f : expf(s[j] - mx);
    s[j] = e;
    part += e;
  }
  const float denom = BlockReduce<false>(part) + expf(sink - mx);
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < nkeys; ++j) {
      if (s[j] == 0.0f) continue;
      const float* k = keys.Key(r, lo, nwin, visible, j);
      acc += (s[j] / denom) * k[c];
    }
    out[(r * heads + h) * d + c] = acc;
  }
}

__global__ void UpdateRingKernel(const float* new_kv, int64_t n, int64_t d, int64_t start, int64_t slots, float* ring) {
  const int64_t first = n > slots ? n - slots : 0;
  const int64_t i = first + blockIdx.x;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) ring[((start + i) % slots) * d + c] = new_kv[i * d + c];
}

inline unsigned GridFor(int64_t total, int threads = 256) {
  int64_t b = (total + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

}  // namespace

void AddPositionBias(float* score, int64_t n, int64_t width, const float* ape, int64_t first_pos, int ratio,
                     cudaStream_t s) {
  if (n > 0) AddPositionBiasKernel<<<GridFor(n * width), 256, 0, s>>>(score, n, width, ape, first_pos, ratio);
}

void CompressorPool(const float* kv, const float* score, int64_t width, int64_t base_pos, int64_t first_window,
                    int64_t num_windows, int ratio, bool overlap, int64_t d, float* out, cudaStream_t s) {
  if (num_windows > 0)
    CompressorPoolKernel<<<GridFor(num_windows * d), 256, 0, s>>>(kv, score, width, base_pos, first_window,
                                                                  num_windows, ratio, overlap, d, out);
}

int64_t IndexerScratchFloats(int64_t n, int64_t num_keys) { return n * (num_keys > 0 ? num_keys : 1); }

void IndexerTopK(const float* q, const float* weights, PagedRowsDev keys, int64_t num_keys, int64_t heads,
                 int64_t dim, const int64_t* positions, int64_t n, int ratio, int top_k, float* scratch,
                 int32_t* out, cudaStream_t s) {
  if (n <= 0) return;
  if (top_k > kMaxTopK)
    throw std::runtime_error("cuda IndexerTopK: top_k " + std::to_string(top_k) + " above " + std::to_string(kMaxTopK));
  const size_t qbytes = static_cast<size_t>(heads * dim) * sizeof(float);
  static PerDeviceOnce once;
  once.Run([](int) {
    CudaCheck(cudaFuncSetAttribute(IndexerScoresKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024),
              "indexer smem attribute");
  });
  if (qbytes > 160 * 1024) throw std::runtime_error("cuda IndexerTopK: heads x dim too large for shared memory");
  const int64_t ld = num_keys > 0 ? num_keys : 1;
  if (num_keys > 0) {
    const int threads = 256, keys_per_block = (threads / 32) * 8;
    dim3 grid(static_cast<unsigned>((num_keys + keys_per_block - 1) / keys_per_block), static_cast<unsigned>(n));
    IndexerScoresKernel<<<grid, threads, qbytes, s>>>(q, weights, keys, num_keys, heads, dim, positions, ratio, ld,
                                                      scratch);
  }
  TopKKernel<<<static_cast<unsigned>(n), kTopkThreads, 0, s>>>(scratch, ld, num_keys, positions, ratio, top_k, out);
}

int64_t AttentionMaxKeys() { return kAttnMaxKeys; }

void Attention(const float* q, int64_t n, int64_t heads, int64_t d, int64_t start, const float* ring,
               int64_t ring_slots, const float* new_kv, int window, PagedRowsDev entries, int64_t num_entries, int ratio,
               const int32_t* topk, int64_t topk_cols, const float* sinks, float softmax_scale, float* out,
               cudaStream_t s) {
  if (n <= 0) return;
  if (d > kAttnFixedSmemFloats) throw std::runtime_error("cuda Attention: head_dim above 512");
  const int64_t ncomp = entries.pool && ratio > 0 ? (topk ? topk_cols : num_entries) : 0;
  const int64_t max_keys = window + ncomp;
  if (max_keys > kAttnMaxKeys)
    throw std::runtime_error("cuda Attention: " + std::to_string(max_keys) + " keys per query, the kernel holds " +
                             std::to_string(kAttnMaxKeys));
  static PerDeviceOnce once;
  once.Run([](int) {
    CudaCheck(cudaFuncSetAttribute(AttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>((kAttnFixedSmemFloats + kAttnMaxKeys) * sizeof(float))),
              "attention smem attribute");
  });
  AttnKeys keys{ring, new_kv, entries, topk, topk_cols, start, num_entries, d, ring_slots, window, ratio};
  const size_t smem = static_cast<size_t>(kAttnFixedSmemFloats + max_keys) * sizeof(float);
  AttentionKernel<<<static_cast<unsigned>(n * heads), kAttnThreads, smem, s>>>(q, heads, keys, sinks, softmax_scale,
                                                                               out);
}

void UpdateRing(const float* new_kv, int64_t n, int64_t d, int64_t start, int64_t ring_slots, float* ring,
                cudaStream_t s) {
  const int64_t rows = n < ring_slots ? n : ring_slots;
  if (rows > 0) UpdateRingKernel<<<static_cast<unsigned>(rows), 128, 0, s>>>(new_kv, n, d, start, ring_slots, ring);
}

}  // namespace dsmesh::cuda_ops
