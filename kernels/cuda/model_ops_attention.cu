// The stateful ops of the attention block (model_ops.h): compressor position bias and pooling, the
// lightning indexer's scores and its top-k, attention with sinks over window + compressed entries, and
// the window ring update. Each mirrors the CPU op of the same name in kernels/cpu/cpu_backend.cc.
// Every kernel here is launched through PdlLaunch (pdl_launch.cuh) and starts with PdlWait() (it reads
// the previous kernels' output from its first load on; its prologue is index math only) and then
// PdlTrigger(), so that with programmatic dependent launch the next kernel's launch overlaps all of it.
#include <cstdint>

#include "kernels/cuda/attention_keys.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/kv_rows_device.cuh"
#include "kernels/cuda/model_ops_device.cuh"
#include "kernels/cuda/pdl_launch.cuh"

namespace dsmesh::cuda_ops {
namespace {

constexpr int kAttnThreads = 256;
constexpr int kTopkThreads = 1024;
constexpr int kMaxTopK = 2048;                       // selection buffer of the top-k kernel
constexpr int64_t kAttnMaxKeys = 40 * 1024;         // score slots of the attention kernel (160 KB)
constexpr int kAttnFixedSmemFloats = 512;            // q row (head_dim <= 512)

__global__ void AddPositionBiasKernel(float* score, int64_t n, int64_t width, const float* ape,
                                      const int64_t* positions, int ratio) {
  PdlWait();
  PdlTrigger();
  const int64_t total = n * width;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    score[i] += ape[(positions[r] % ratio) * width + c];
  }
}

// One thread per (window, channel): softmax over the window's slots (window w-1's first halves, then
// window w's second halves with overlap), weighted sum of kv.
__global__ void CompressorPoolKernel(const float* kv, const float* score, int64_t width, int64_t base_pos,
                                     int64_t first_window, int64_t num_windows, int ratio, bool overlap, int64_t d,
                                     float* out) {
  PdlWait();
  PdlTrigger();
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

// ---- helpers of the register-tiled products (indexer scores, split attention) ----

// Row stride (floats) of a tile of rows in shared memory: `dim` in whole float4s (zero-padded), an odd
// number of them, so 8 lanes reading float4 c of 8 consecutive rows touch 32 distinct banks.
__host__ __device__ __forceinline__ int TileLd(int64_t dim) { return 4 * ((static_cast<int>(dim) + 3) / 4 | 1); }

// One warp writes a stored row into shared memory as f32 (dst 16-byte aligned when vec4); a null row as
// zeros. f32 rows go as float4 loads and stores when vec4 (dd % 4 == 0 and the rows aligned).
__device__ __forceinline__ void WarpStageRow(const void* row, RowKind kind, int nope, int dd, bool vec4, int lane,
                                             float* dst) {
  if (vec4 && (kind == RowKind::kF32 || !row)) {
    const float4* src = static_cast<const float4*>(row);
#pragma unroll 4
    for (int c4 = lane; c4 < dd / 4; c4 += 32)
      reinterpret_cast<float4*>(dst)[c4] = row ? __ldg(src + c4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    return;
  }
  WarpCopyStoredRow(row, kind, nope, dd, vec4, lane, dst);
}

__device__ __forceinline__ float4 Ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
// acc + a . b, the four products added in channel order.
__device__ __forceinline__ float Dot4(float acc, float4 a, float4 b) {
  acc += a.x * b.x;
  acc += a.y * b.y;
  acc += a.z * b.z;
  acc += a.w * b.w;
  return acc;
}
__device__ __forceinline__ float4 Axpy4(float4 acc, float p, float4 k) {
  acc.x += p * k.x;
  acc.y += p * k.y;
  acc.z += p * k.z;
  acc.w += p * k.w;
  return acc;
}

// scores[r, w] = sum_h weights[r, h] * relu(q[r, h] . keys[w]) for w < valid(r). Blocks of row r take the
// row's 32-key tiles blockIdx.x, blockIdx.x + gridDim.x, ... with the row's queries (all heads) staged
// once in shared memory. A tile is a [heads x 32] product over dim, register-tiled: thread (hg, kq) of
// the block takes heads hg, hg + 32 (then + 64, ...) x keys kq, kq + 8, kq + 16, kq + 24, each dot over
// the whole dim in channel order (float4 loads: 6 per 32 FMAs), weights and relu applied per head; the 32
// head groups' sums are added in group order (deterministic).
constexpr int kIndexerKeys = 32;
constexpr int kIndexerThreads = 256;
constexpr int kIndexerHeadGroups = kIndexerThreads / 8;  // threads per key column of a tile
constexpr int kIndexerMaxTileBlocks = 256;                // blocks per row (larger rows loop over tiles)
constexpr int kIndexerMaxSeqs = 8, kIndexerBatchMaxRows = 16;
constexpr int kIndexerMaxSmem = 160 * 1024;

// Shared memory of an indexer scores block (floats): queries, key tile, head groups' sums, weights.
__host__ __device__ __forceinline__ int64_t IndexerSmemFloats(int64_t heads, int64_t dim) {
  const int64_t ld = TileLd(dim);
  return heads * ld + kIndexerKeys * ld + kIndexerHeadGroups * kIndexerKeys + heads;
}

// The keys of each row of a step: one sequence (any number of rows), or up to kIndexerMaxSeqs sequences of
// at most kIndexerBatchMaxRows rows in all, row r belonging to sequence row_seq[r].
struct IndexerBatch {
  PagedRowsDev keys[kIndexerMaxSeqs];
  int64_t num_keys[kIndexerMaxSeqs];
  int8_t row_seq[kIndexerBatchMaxRows];
  int num_seqs;
  __device__ int SeqOf(int64_t r) const { return num_seqs == 1 ? 0 : row_seq[r]; }
};

__global__ void __launch_bounds__(kIndexerThreads) IndexerScoresKernel(const float* q, const float* weights,
                                                                       const IndexerBatch* __restrict__ pbatch,
                                                                       int64_t heads, int64_t dim,
                                                                       const int64_t* positions, int ratio,
                                                                       int64_t ld_scores, float* scores) {
  PdlWait();
  PdlTrigger();
  extern __shared__ float4 indexer_smem4[];
  const int64_t r = blockIdx.y;
  const int seq = pbatch->SeqOf(r);
  const PagedRowsDev keys = pbatch->keys[seq];
  const int64_t valid = min(pbatch->num_keys[seq], (positions[r] + 1) / ratio);
  if (static_cast<int64_t>(blockIdx.x) * kIndexerKeys >= valid) return;
  const int dd = static_cast<int>(dim), hh = static_cast<int>(heads), ld = TileLd(dim), width = (dd + 3) / 4 * 4;
  float* qs = reinterpret_cast<float*>(indexer_smem4);  // [heads][ld]
  float* ks = qs + hh * ld;                             // [kIndexerKeys][ld]
  float* red = ks + kIndexerKeys * ld;                  // [kIndexerHeadGroups][kIndexerKeys]
  float* ws = red + kIndexerHeadGroups * kIndexerKeys;  // [heads]
  for (int i = threadIdx.x; i < hh * width; i += blockDim.x) {
    const int h = i / width, c = i - h * width;
    qs[h * ld + c] = c < dd ? q[(r * heads + h) * dim + c] : 0.0f;
  }
  for (int i = threadIdx.x; i < hh; i += blockDim.x) ws[i] = weights[r * heads + i];
  for (int i = threadIdx.x; i < kIndexerKeys * (width - dd); i += blockDim.x) {  // padding channels (never copied)
    const int j = i / (width - dd);
    ks[j * ld + dd + (i - j * (width - dd))] = 0.0f;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hgrp = static_cast<int>(threadIdx.x) >> 3, kq = lane & 7;
  const bool vec4 = keys.kind == RowKind::kF32 && dd % 4 == 0 && (reinterpret_cast<uintptr_t>(keys.pool) & 15) == 0;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kIndexerKeys; first < valid;
       first += static_cast<int64_t>(gridDim.x) * kIndexerKeys) {
    const int64_t nk = valid - first < kIndexerKeys ? valid - first : kIndexerKeys;
    __syncthreads();  // the previous tile is done with ks / red (and the stores above are visible)
    for (int j = warp; j < kIndexerKeys; j += kIndexerThreads / 32)
      WarpStageRow(j < nk ? keys.Row(first + j) : nullptr, keys.kind, keys.nope, dd, vec4, lane, ks + j * ld);
    __syncthreads();
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // this thread's heads' weighted relu sums, keys kq + 8m
    for (int h0 = hgrp; h0 < hh; h0 += 2 * kIndexerHeadGroups) {
      const int h1 = h0 + kIndexerHeadGroups;
      const int qr1 = h1 < hh ? h1 : h0;  // clamped (its dots unused)
      float dot0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, dot1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int c = 0; c < width; c += 4) {
        const float4 q0 = Ld4(qs + h0 * ld + c), q1 = Ld4(qs + qr1 * ld + c);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const float4 kv = Ld4(ks + (kq + 8 * m) * ld + c);
          dot0[m] = Dot4(dot0[m], q0, kv);
          dot1[m] = Dot4(dot1[m], q1, kv);
        }
      }
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        s[m] += ws[h0] * fmaxf(0.0f, dot0[m]);
        if (h1 < hh) s[m] += ws[h1] * fmaxf(0.0f, dot1[m]);
      }
    }
#pragma unroll
    for (int m = 0; m < 4; ++m) red[hgrp * kIndexerKeys + kq + 8 * m] = s[m];
    __syncthreads();
    if (warp == 0 && lane < nk) {
      float total = 0.0f;
      for (int v = 0; v < kIndexerHeadGroups; ++v) total += red[v * kIndexerKeys + lane];
      scores[r * ld_scores + first + lane] = total;
    }
  }
}

// A float as an unsigned key that orders like the float (larger float -> larger key).
__device__ __forceinline__ uint32_t OrderKey(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exclusive prefix of `v` over the block in thread order; returns it and sets *total.
__device__ int BlockExclusiveScan(int v, int* total) {
  __shared__ int warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  __syncthreads();  // an earlier call's readers are done with warp_sums
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < warps; ++w) {
    const int s = warp_sums[w];
    if (w < warp) before += s;
    all += s;
  }
  *total = all;
  return before + incl - v;
}

// Whether (key a, index ia) sorts before (key b, index ib): larger key, or equal key and smaller index
// (the CPU's partial_sort order).
__device__ __forceinline__ bool SortsBefore(uint32_t a, int32_t ia, uint32_t b, int32_t ib) {
  return a > b || (a == b && ia < ib);
}

// Top-k of one row's scores: a 4-pass radix select finds the k-th largest key (the first pass reads the
// scores and keeps up to cache_keys of them in shared memory for the others; histogram counts added once
// per digit per warp), an ordered compaction takes every key above it and the lowest-index keys equal to
// it (one block scan per 4096 keys), and a bitonic sort orders the selection by (score desc, index asc)
// like the CPU's partial_sort: merge strides of 32 and more through shared memory, the smaller ones in
// registers through warp shuffles (one barrier per merge length instead of one per stride). Deterministic
// (no atomics in the output path).
constexpr int kTopkCacheKeys = 16384;  // 64 KB of dynamic shared memory
constexpr int kSortPerThread = kMaxTopK / kTopkThreads;
constexpr int kCompactPerThread = 4;
static_assert(kTopkThreads * kCompactPerThread < 0x10000, "the compaction's packed counts");
static_assert(kMaxTopK % kTopkThreads == 0 && kTopkThreads % 32 == 0, "the sort's register stages");
__global__ void __launch_bounds__(kTopkThreads) TopKKernel(const float* scores, int64_t ld_scores,
                                                           const IndexerBatch* __restrict__ pbatch,
                                                           const int64_t* positions, int ratio, int top_k,
                                                           int cache_keys, int32_t* out) {
  PdlWait();
  PdlTrigger();
  extern __shared__ uint32_t topk_cache[];  // [cache_keys] the row's first keys, after the first pass
  __shared__ unsigned hist[256];
  __shared__ uint32_t sel_key[kMaxTopK];
  __shared__ int32_t sel_idx[kMaxTopK];
  __shared__ uint32_t s_prefix, s_mask;
  __shared__ int s_remaining;
  __shared__ int scan_part[8];
  const int64_t r = blockIdx.x;
  const float* sc = scores + r * ld_scores;
  const int64_t valid = min(pbatch->num_keys[pbatch->SeqOf(r)], (positions[r] + 1) / ratio);
  const int k = static_cast<int>(valid < top_k ? valid : static_cast<int64_t>(top_k));
  const int t = threadIdx.x, lane = t & 31;

  // 1. Threshold: the k-th largest key (skipped when every key is taken).
  if (t == 0) {
    s_prefix = 0;
    s_mask = 0;
    s_remaining = k;
  }
  __syncthreads();
  const bool take_all = valid <= top_k;
  const int64_t cached = take_all ? 0 : (valid < cache_keys ? valid : cache_keys);
  auto key_at = [&](int64_t i) { return i < cached ? topk_cache[i] : OrderKey(sc[i]); };
  if (!take_all) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = t; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      const uint32_t prefix = s_prefix, mask = s_mask;
      for (int64_t base = 0; base < valid; base += blockDim.x) {  // whole warps in every iteration
        const int64_t i = base + t;
        unsigned digit = 256;  // none
        if (i < valid) {
          uint32_t key;
          if (shift == 24) {
            key = OrderKey(sc[i]);
            if (i < cached) topk_cache[i] = key;
          } else {
            key = key_at(i);
          }
          if ((key & mask) == prefix) digit = (key >> shift) & 255u;
        }
        const unsigned peers = __match_any_sync(0xffffffffu, digit);
        if (digit < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], static_cast<unsigned>(__popc(peers)));
      }
      __syncthreads();
      // The digit of the k-th largest key: thread t holds bin 255 - t, an inclusive scan over the threads
      // counts the keys in bins >= that digit, and the one thread where the count first reaches
      // `remaining` names the digit and the keys of larger digits (cum).
      const int remaining = s_remaining;
      int count = 0, incl = 0;
      if (t < 256) {
        count = static_cast<int>(hist[255 - t]);
        incl = count;
        for (int o = 1; o < 32; o <<= 1) {
          const int v = __shfl_up_sync(0xffffffffu, incl, o);
          if (lane >= o) incl += v;
        }
        if (lane == 31) scan_part[t >> 5] = incl;
      }
      __syncthreads();
      if (t < 256) {
        for (int w = 0; w < (t >> 5); ++w) incl += scan_part[w];
        const int cum = incl - count;
        if (cum < remaining && (incl >= remaining || t == 255)) {  // digit 0 takes the rest
          s_remaining = remaining - cum;  // keys equal to the threshold still to take (after this pass)
          s_prefix = prefix | (static_cast<uint32_t>(255 - t) << shift);
          s_mask = mask | (255u << shift);
        }
      }
      __syncthreads();
    }
  }
  const uint32_t threshold = s_prefix;
  const int equal_needed = take_all ? 0 : s_remaining;

  // 2. Ordered compaction: keys above the threshold, then the first `equal_needed` equal ones. Thread t takes
  // kCompactPerThread consecutive keys of each stretch, and one scan counts both kinds before them (above
  // in the low 16 bits, equal in the high: at most kTopkThreads * kCompactPerThread each).
  int taken = 0, equal_taken = 0;
  for (int64_t base = 0; base < valid; base += static_cast<int64_t>(blockDim.x) * kCompactPerThread) {
    const int64_t i0 = base + static_cast<int64_t>(t) * kCompactPerThread;
    uint32_t key[kCompactPerThread];
    unsigned above_bits = 0, equal_bits = 0;
    int counts = 0;
#pragma unroll
    for (int e = 0; e < kCompactPerThread; ++e) {
      key[e] = 0;
      if (i0 + e < valid) {
        key[e] = key_at(i0 + e);
        const bool above = take_all || key[e] > threshold, equal = !take_all && key[e] == threshold;
        above_bits |= above ? 1u << e : 0u;
        equal_bits |= equal ? 1u << e : 0u;
        counts += (above ? 1 : 0) | (equal ? 0x10000 : 0);
      }
    }
    int total = 0;
    const int before = BlockExclusiveScan(counts, &total);
    const int eq_room = equal_needed - equal_taken > 0 ? equal_needed - equal_taken : 0;
    int above_before = before & 0xffff, eq_before = before >> 16;
#pragma unroll
    for (int e = 0; e < kCompactPerThread; ++e) {
      const bool above = (above_bits >> e) & 1u, equal = (equal_bits >> e) & 1u;
      const bool take = above || (equal && eq_before < eq_room);
      const int slot = taken + above_before + (eq_before < eq_room ? eq_before : eq_room);
      if (take && slot < kMaxTopK) {
        sel_key[slot] = key[e];
        sel_idx[slot] = static_cast<int32_t>(i0 + e);
      }
      above_before += above ? 1 : 0;
      eq_before += equal ? 1 : 0;
    }
    const int eq_total = total >> 16;
    taken += (total & 0xffff) + (eq_total < eq_room ? eq_total : eq_room);
    equal_taken += eq_total;
  }

  // 3. Bitonic sort of the selection, padded to a power of two. Element i sits at sel_*[i]; in the register
  // stages thread t holds elements t + kTopkThreads * e, whose partners (i ^ stride, stride < 32) are in
  // its warp.
  int size = 1;
  while (size < k) size <<= 1;
  for (int i = k + t; i < size; i += blockDim.x) {
    sel_key[i] = 0;
    sel_idx[i] = 0x7fffffff;
  }
  __syncthreads();
  // Merge lengths len_lo .. len_hi (doubling), each from stride min(len / 2, 16) down to 1, in registers.
  auto register_stages = [&](int len_lo, int len_hi) {
#pragma unroll
    for (int e = 0; e < kSortPerThread; ++e) {
      const int i = t + kTopkThreads * e;
      uint32_t key = i < size ? sel_key[i] : 0u;
      int32_t idx = i < size ? sel_idx[i] : 0x7fffffff;
      for (int len = len_lo; len <= len_hi; len <<= 1) {
        const bool ascending = (i & len) == 0;  // this block of len elements ends in "sorts before" order
        for (int stride = (len >> 1) < 16 ? (len >> 1) : 16; stride > 0; stride >>= 1) {
          const uint32_t other_key = __shfl_xor_sync(0xffffffffu, key, stride);
          const int32_t other_idx = __shfl_xor_sync(0xffffffffu, idx, stride);
          const bool lower = (i & stride) == 0;
          if (SortsBefore(key, idx, other_key, other_idx) != (lower == ascending)) {
            key = other_key;
            idx = other_idx;
          }
        }
      }
      if (i < size) {
        sel_key[i] = key;
        sel_idx[i] = idx;
      }
    }
    __syncthreads();
  };
  register_stages(2, size < 32 ? size : 32);
  for (int len = 64; len <= size; len <<= 1) {
    for (int stride = len >> 1; stride >= 32; stride >>= 1) {
      for (int i = t; i < size; i += blockDim.x) {
        const int j = i ^ stride;
        if (j <= i) continue;
        const bool i_first = SortsBefore(sel_key[i], sel_idx[i], sel_key[j], sel_idx[j]);
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
    register_stages(len, len);
  }
  for (int i = t; i < top_k; i += blockDim.x) out[r * top_k + i] = i < k ? sel_idx[i] : -1;
}

// One block per (row, head): scores into shared memory, softmax with the sink, weighted sum of keys.
__global__ void AttentionKernel(const float* q, int64_t heads, AttnKeys keys, const float* sinks,
                                float softmax_scale, float* out) {
  PdlWait();
  PdlTrigger();
  extern __shared__ float smem[];
  float* qs = smem;                          // d
  float* s = smem + kAttnFixedSmemFloats;    // keys
  const int64_t r = blockIdx.x / heads, h = blockIdx.x % heads, d = keys.d;
  const RowSpan span = keys.Span(r);
  const int64_t lo = span.lo, nwin = span.nwin, visible = span.visible, nkeys = span.nkeys;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) qs[c] = q[(r * heads + h) * d + c];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int nope = keys.entries.nope;
  for (int64_t j = warp; j < nkeys; j += warps) {
    const void* k = keys.Key(r, lo, nwin, visible, j);
    const RowKind kind = keys.KindOf(nwin, j);
    float dot = 0.0f;
    if (k) {
      const float scale = kind == RowKind::kFp8 ? Fp8RowScale(static_cast<const uint8_t*>(k), nope) : 0.0f;
      for (int64_t c = lane; c < d; c += 32) dot += qs[c] * StoredRowValue(k, kind, nope, scale, static_cast<int>(c));
    }
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
      const void* k = keys.Key(r, lo, nwin, visible, j);
      const RowKind kind = keys.KindOf(nwin, j);
      const float scale = kind == RowKind::kFp8 ? Fp8RowScale(static_cast<const uint8_t*>(k), nope) : 0.0f;
      acc += (s[j] / denom) * StoredRowValue(k, kind, nope, scale, static_cast<int>(c));
    }
    out[(r * heads + h) * d + c] = acc;
  }
}

// ---- decode attention: split over keys (rows of a step <= kSplitMaxRows) ----
// Each block takes one query row, a group of kSplitHeads heads and one range of the row's keys. It walks
// the range 32 keys at a time: the keys go to shared memory once for all heads of the group, the block
// scores the group's heads against them as a register-tiled product (below), and an online softmax keeps
// each head's running max, sum and weighted values. The partial results of the ranges (max, sum, values
// per head) are merged by AttentionCombineKernel with the sink, in range order (deterministic).
//
// Where the time goes: a pass is a [heads x keys] = [8 x 32] product over head_dim and a [heads x d] +=
// [heads x 32] x [32 x d] update, both from shared memory. The scoring tile gives each thread 2 heads x 4
// keys over one of kSplitSlices channel slices (float4 loads: 6 per 32 FMAs; the slices' dots are then
// added in slice order), and the update gives each thread one channel quad of 4 heads (one float4 of a key
// row and 4 broadcast probabilities per 16 FMAs), so shared memory no longer bounds a pass.
constexpr int kSplitKeys = 32;     // keys per pass
constexpr int kSplitHeads = 8;     // heads per block
constexpr int kSplitThreads = 256;
constexpr int kSplitSlices = kSplitThreads / 32;  // channel slices of the scoring tile (one per warp)
constexpr int kSplitMaxRanges = 32;
constexpr int kSplitMaxRows = 16;
constexpr int kSplitMaxQuads = 128;  // head_dim 512 in float4s
constexpr int kSplitAccPerThread = kSplitHeads * kSplitMaxQuads / kSplitThreads;  // (head, quad) pairs per thread
static_assert(kSplitKeys == 32 && kSplitHeads == 8 && kSplitSlices == 8, "the scoring tile's lane layout");

int SplitHeadsFor(int64_t heads, int64_t d) {
  for (int g = kSplitHeads; g > 1; g /= 2)
    if (heads % g == 0 && g * d <= kSplitHeads * 512) return g;
  return 1;
}

// Shared memory of a split block (floats): keys, queries, the slices' dots, probabilities, rescales.
__host__ __device__ __forceinline__ int SplitSmemFloats(int64_t d, int head_group) {
  const int ld = TileLd(d);
  return kSplitKeys * ld + head_group * ld + kSplitSlices * head_group * kSplitKeys + kSplitKeys * kSplitHeads +
         kSplitHeads;
}

// A row's keys are split into ranges of whole 32-key passes, as few passes per range as keep the ranges
// at most kSplitMaxRanges. The split depends on the row's own key count only, so a row sums its keys in
// the same order whatever it is batched with (a sequence alone == in a batch, bitwise).
__host__ __device__ __forceinline__ int64_t SplitKeysPerRange(int64_t nkeys) {
  const int64_t passes = (nkeys + kSplitKeys - 1) / kSplitKeys;
  const int64_t per = (passes + kSplitMaxRanges - 1) / kSplitMaxRanges;
  return (per < 1 ? 1 : per) * kSplitKeys;
}

// The sequences of one split launch: row r of the step belongs to sequence row_seq[r], as its row
// row_local[r]; each sequence's AttnKeys has its new_kv and topk pointers at its own first row.
constexpr int kSplitMaxSeqs = 8;
struct AttnBatch {
  AttnKeys seq[kSplitMaxSeqs];
  int8_t row_seq[kSplitMaxRows];
  int32_t row_local[kSplitMaxRows];
};

// Partials of (row r, head h, range g): [max, sum, values[d]] at ((r * heads + h) * ranges + g) * (d + 2).
// `batch` is in device memory (staged with the step's parameters, so a recorded launch reads each step's);
// each block copies its row's AttnKeys into shared memory once.
// gridDim.y = ranges = kSplitMaxRanges: a row's ranges past its keys write empty partials (max -inf, sum
// 0), which the combine skips, so the launch is the same whatever the keys (a graph replays it) and a row
// sums its keys the same way whatever else the launch holds. The ranges with keys are a prefix.
__global__ void __launch_bounds__(kSplitThreads) AttentionSplitKernel(const float* q, int64_t heads, int head_group,
                                                                      const AttnBatch* __restrict__ batch,
                                                                      float softmax_scale, float* partial) {
  PdlWait();
  PdlTrigger();
  extern __shared__ float4 split_smem4[];
  float* smem = reinterpret_cast<float*>(split_smem4);
  __shared__ const void* kp[kSplitKeys];  // the pass's key rows (null: absent)
  __shared__ __align__(16) unsigned char keys_bytes[sizeof(AttnKeys)];  // (AttnKeys has initializers)
  AttnKeys& keys = *reinterpret_cast<AttnKeys*>(keys_bytes);
  const int64_t groups = heads / head_group;
  const int64_t r = blockIdx.x / groups, h0 = (blockIdx.x % groups) * head_group, g = blockIdx.y;
  if (threadIdx.x == 0) keys = batch->seq[batch->row_seq[r]];
  __syncthreads();
  const int64_t d = keys.d;
  const int dd = static_cast<int>(d), quads = (dd + 3) / 4, ld = TileLd(d), hg = head_group;
  float* ks = smem;                                  // [kSplitKeys][ld]
  float* qs = ks + kSplitKeys * ld;                  // [hg][ld]
  float* red = qs + hg * ld;                         // [kSplitSlices][hg][kSplitKeys] the slices' dots
  float* ps = red + kSplitSlices * hg * kSplitKeys;  // [kSplitKeys][kSplitHeads] probabilities of the pass
  float* alpha = ps + kSplitKeys * kSplitHeads;      // [kSplitHeads] rescale of the running values
  const int64_t rl = batch->row_local[r];  // the row within its sequence
  const RowSpan span = keys.Span(rl);
  const int64_t lo = span.lo, nwin = span.nwin, visible = span.visible, nkeys = span.nkeys;
  const int64_t ranges = gridDim.y, keys_per_range = SplitKeysPerRange(nkeys);
  const int64_t k_begin = g * keys_per_range;
  const int64_t k_end = nkeys < k_begin + keys_per_range ? nkeys : k_begin + keys_per_range;
  if (k_begin >= nkeys) {  // a range past the row's keys: an empty partial (its values are never read)
    if (threadIdx.x < head_group) {
      float* pm = partial + ((r * heads + h0 + threadIdx.x) * ranges + g) * (d + 2);
      pm[0] = -INFINITY;
      pm[1] = 0.0f;
    }
    return;
  }
  // The group's query rows, and the key rows' padding channels (never written by the copies), as zeros.
  const int width = 4 * quads;
  for (int i = threadIdx.x; i < hg * width; i += blockDim.x) {
    const int hh = i / width, c = i - hh * width;
    qs[hh * ld + c] = c < dd ? q[(r * heads + h0 + hh) * d + c] : 0.0f;
  }
  for (int i = threadIdx.x; i < kSplitKeys * (width - dd); i += blockDim.x) {
    const int j = i / (width - dd);
    ks[j * ld + dd + (i - j * (width - dd))] = 0.0f;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // Scoring tile of this thread: heads hs, hs + 4 (those below hg) x keys kq, kq + 8, kq + 16, kq + 24, over
  // the channel quads warp, warp + kSplitSlices, ...
  const int hs = lane >> 3, kq = lane & 7;
  const int qrow0 = hs < hg ? hs : hg - 1, qrow1 = hs + 4 < hg ? hs + 4 : hg - 1;  // clamped (results unused)
  float run_max = -INFINITY, run_sum = 0.0f;  // of head `warp` (warps < head_group), kept by every lane
  // Update pair i of this thread: channel quad acc_q[i] of head acc_h[i] (acc_h >= hg: none).
  float4 acc[kSplitAccPerThread];
  int acc_h[kSplitAccPerThread], acc_q[kSplitAccPerThread];
#pragma unroll
  for (int i = 0; i < kSplitAccPerThread; ++i) {
    const int p = static_cast<int>(threadIdx.x) + i * kSplitThreads;
    acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    acc_h[i] = p / quads;
    acc_q[i] = p - acc_h[i] * quads;
  }
  const bool one_quad = kSplitThreads % quads == 0;  // every pair of a thread on the same channel quad
  const bool vec4 = dd % 4 == 0 && AllRowsAligned(keys);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kSplitKeys) {
    __syncthreads();  // the previous pass is done with kp / ks / ps / alpha
    // The pass's keys into shared memory; absent ones (unlisted, not yet visible, past the range) are zero.
    const int64_t npass = k_end - k0 < kSplitKeys ? k_end - k0 : kSplitKeys;
    if (threadIdx.x < kSplitKeys)
      kp[threadIdx.x] = threadIdx.x < npass ? keys.Key(rl, lo, nwin, visible, k0 + threadIdx.x) : nullptr;
    __syncthreads();
    for (int j = warp; j < kSplitKeys; j += kSplitThreads / 32) {
      const RowKind kind = keys.KindOf(nwin, k0 + j);
      WarpStageRow(kp[j], kind, keys.entries.nope, dd, vec4, lane, ks + j * ld);
    }
    __syncthreads();
    {
      float dot[2][4] = {};
      for (int c = 4 * warp; c < width; c += 4 * kSplitSlices) {
        const float4 q0 = Ld4(qs + qrow0 * ld + c), q1 = Ld4(qs + qrow1 * ld + c);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const float4 kv = Ld4(ks + (kq + 8 * m) * ld + c);
          dot[0][m] = Dot4(dot[0][m], q0, kv);
          dot[1][m] = Dot4(dot[1][m], q1, kv);
        }
      }
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        if (hs < hg) red[(warp * hg + hs) * kSplitKeys + kq + 8 * m] = dot[0][m];
        if (hs + 4 < hg) red[(warp * hg + hs + 4) * kSplitKeys + kq + 8 * m] = dot[1][m];
      }
    }
    __syncthreads();
    if (warp < head_group) {  // warp h: head h's scores (lane j = key j) and its online softmax
      const int j = lane;
      float s = -INFINITY;
      if (kp[j]) {
        float dot = 0.0f;
#pragma unroll
        for (int sl = 0; sl < kSplitSlices; ++sl) dot += red[(sl * hg + warp) * kSplitKeys + j];
        s = dot * softmax_scale;
      }
      const float m_new = fmaxf(run_max, WarpMax(s));
      const float p = s == -INFINITY ? 0.0f : expf(s - m_new);
      const float a = run_max == -INFINITY ? 0.0f : expf(run_max - m_new);
      run_sum = run_sum * a + WarpSum(p);
      run_max = m_new;
      ps[j * kSplitHeads + warp] = p;
      if (lane == 0) alpha[warp] = a;
    }
    __syncthreads();
    if (one_quad) {  // head_dim 512 (and every power-of-two quad count): one key float4 serves all pairs
      const int cq = acc_q[0];
      float a[kSplitAccPerThread];
#pragma unroll
      for (int i = 0; i < kSplitAccPerThread; ++i) {
        a[i] = acc_h[i] < hg ? alpha[acc_h[i]] : 0.0f;
        acc[i] = make_float4(acc[i].x * a[i], acc[i].y * a[i], acc[i].z * a[i], acc[i].w * a[i]);
      }
#pragma unroll 4
      for (int j = 0; j < kSplitKeys; ++j) {
        const float4 kv = Ld4(ks + j * ld + 4 * cq);
#pragma unroll
        for (int i = 0; i < kSplitAccPerThread; ++i)
          if (acc_h[i] < hg) acc[i] = Axpy4(acc[i], ps[j * kSplitHeads + acc_h[i]], kv);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kSplitAccPerThread; ++i) {
        if (acc_h[i] >= hg) continue;
        const float a = alpha[acc_h[i]];
        float4 v = make_float4(acc[i].x * a, acc[i].y * a, acc[i].z * a, acc[i].w * a);
        for (int j = 0; j < kSplitKeys; ++j) v = Axpy4(v, ps[j * kSplitHeads + acc_h[i]], Ld4(ks + j * ld + 4 * acc_q[i]));
        acc[i] = v;
      }
    }
  }
  // Partials: values by every thread, max and sum by lane 0 of each head's warp.
#pragma unroll
  for (int i = 0; i < kSplitAccPerThread; ++i) {
    if (acc_h[i] >= hg) continue;
    float* pv = partial + ((r * heads + h0 + acc_h[i]) * ranges + g) * (d + 2) + 2;
    const int c = 4 * acc_q[i];
    if (c < dd) pv[c] = acc[i].x;
    if (c + 1 < dd) pv[c + 1] = acc[i].y;
    if (c + 2 < dd) pv[c + 2] = acc[i].z;
    if (c + 3 < dd) pv[c + 3] = acc[i].w;
  }
  if (warp < head_group && lane == 0) {
    float* pm = partial + ((r * heads + h0 + warp) * ranges + g) * (d + 2);
    pm[0] = run_max;
    pm[1] = run_sum;
  }
}

// out[r, h] = sum_g e^(m_g - M) values_g / (sum_g e^(m_g - M) sum_g + e^(sink_h - M)), M the largest max.
// One block per (row, head). The ranges' maxima and sums are read once, in parallel, into shared memory;
// each thread then sums its kCombineChannels channels over the ranges up to the last one with a weight,
// every load independent of the others, adding in range order. Ranges before that one all hold values
// (ranges with keys are a prefix; one whose keys are all absent holds zeros and weighs 0).
constexpr int kCombineThreads = 128, kCombineChannels = 4, kCombineMaxRanges = 64;
static_assert(kSplitMaxRanges <= kCombineMaxRanges, "the combine keeps every range's weight in shared memory");
__global__ void __launch_bounds__(kCombineThreads) AttentionCombineKernel(const float* partial, int64_t heads,
                                                                          int64_t d, int64_t ranges,
                                                                          const float* sinks, float* out) {
  PdlWait();
  PdlTrigger();
  __shared__ float wgt[kCombineMaxRanges];  // e^(m_g - M), 0 for a range without keys
  __shared__ float denom_s;
  __shared__ int used_s;  // ranges up to the last one with a weight
  const int64_t r = blockIdx.x / heads, h = blockIdx.x % heads;
  const float* p = partial + (r * heads + h) * ranges * (d + 2);
  const int t = threadIdx.x;
  if (t < 32) {
    float mx = sinks[h];
    for (int64_t g = t; g < ranges; g += 32) mx = fmaxf(mx, p[g * (d + 2)]);
    mx = WarpMax(mx);
    float denom = expf(sinks[h] - mx);
    int used = 0;
    for (int64_t g0 = 0; g0 < ranges; g0 += 32) {  // weights in parallel, the sum in range order (lane 0)
      const int64_t g = g0 + t;
      float m = -INFINITY, sum = 0.0f;
      if (g < ranges) {
        m = p[g * (d + 2)];
        sum = p[g * (d + 2) + 1];
      }
      const float w = m == -INFINITY ? 0.0f : expf(m - mx);
      if (g < ranges) wgt[g] = w;
      if (w != 0.0f) used = static_cast<int>(g) + 1;
      const int64_t here = ranges - g0 < 32 ? ranges - g0 : 32;
      for (int64_t i = 0; i < here; ++i) {
        const float wi = __shfl_sync(0xffffffffu, w, static_cast<int>(i));
        const float si = __shfl_sync(0xffffffffu, sum, static_cast<int>(i));
        if (wi != 0.0f) denom += wi * si;
      }
    }
    for (int o = 16; o > 0; o >>= 1) used = max(used, __shfl_xor_sync(0xffffffffu, used, o));
    if (t == 0) {
      denom_s = denom;
      used_s = used;
    }
  }
  __syncthreads();
  const int used = used_s;
  for (int64_t c0 = t; c0 < d; c0 += kCombineThreads * kCombineChannels) {
    float acc[kCombineChannels] = {};
#pragma unroll 8
    for (int g = 0; g < used; ++g) {
      const float w = wgt[g];
      const float* v = p + g * (d + 2) + 2;
#pragma unroll
      for (int i = 0; i < kCombineChannels; ++i) {
        const int64_t c = c0 + i * kCombineThreads;
        if (c < d) acc[i] += w * v[c];
      }
    }
#pragma unroll
    for (int i = 0; i < kCombineChannels; ++i) {
      const int64_t c = c0 + i * kCombineThreads;
      if (c < d) out[(r * heads + h) * d + c] = acc[i] / denom_s;
    }
  }
}

__global__ void UpdateRingKernel(const float* new_kv, int64_t n, int64_t d, int64_t start, int64_t slots, float* ring) {
  PdlWait();
  PdlTrigger();
  const int64_t first = n > slots ? n - slots : 0;
  const int64_t i = first + blockIdx.x;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) ring[((start + i) % slots) * d + c] = new_kv[i * d + c];
}

inline unsigned GridFor(int64_t total, int threads = 256) {
  int64_t b = (total + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

}  // namespace

void AddPositionBias(float* score, int64_t n, int64_t width, const float* ape, const int64_t* positions, int ratio,
                     cudaStream_t s) {
  if (n > 0) PdlLaunch(AddPositionBiasKernel, GridFor(n * width), 256, 0, s, score, n, width, ape, positions, ratio);
}

void CompressorPool(const float* kv, const float* score, int64_t width, int64_t base_pos, int64_t first_window,
                    int64_t num_windows, int ratio, bool overlap, int64_t d, float* out, cudaStream_t s) {
  if (num_windows > 0)
    PdlLaunch(CompressorPoolKernel, GridFor(num_windows * d), 256, 0, s, kv, score, width, base_pos, first_window,
              num_windows, ratio, overlap, d, out);
}

int64_t IndexerScratchFloats(int64_t n, int64_t ld_keys) { return n * (ld_keys > 0 ? ld_keys : 1); }

namespace {

void LaunchIndexer(const float* q, const float* weights, const IndexerBatch& batch, int64_t heads, int64_t dim,
                   const int64_t* positions, int64_t n, int ratio, int top_k, int64_t ld_keys, float* scratch,
                   int32_t* out, ParamStager& stage, cudaStream_t s) {
  if (n <= 0) return;
  if (top_k > kMaxTopK)
    throw std::runtime_error("cuda IndexerTopK: top_k " + std::to_string(top_k) + " above " + std::to_string(kMaxTopK));
  const size_t smem = static_cast<size_t>(IndexerSmemFloats(heads, dim)) * sizeof(float);
  static PerDeviceOnce once;
  once.Run([](int) {
    CudaCheck(cudaFuncSetAttribute(IndexerScoresKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kIndexerMaxSmem),
              "indexer smem attribute");
    CudaCheck(cudaFuncSetAttribute(TopKKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(kTopkCacheKeys * sizeof(uint32_t))),
              "top-k smem attribute");
  });
  if (smem > kIndexerMaxSmem) throw std::runtime_error("cuda IndexerTopK: heads x dim too large for shared memory");
  // The launch covers ld_keys keys per row whatever the sequences hold (blocks past a row's keys return):
  // its shape depends on ld_keys only.
  for (int i = 0; i < batch.num_seqs; ++i)
    if (batch.num_keys[i] > ld_keys)
      throw std::runtime_error("cuda IndexerTopK: " + std::to_string(batch.num_keys[i]) + " keys, the launch covers " +
                               std::to_string(ld_keys));
  const int64_t ld = ld_keys > 0 ? ld_keys : 1;
  const IndexerBatch* dev = stage.Stage(batch);
  if (!stage.Launching()) return;
  const int64_t tiles = (ld + kIndexerKeys - 1) / kIndexerKeys;
  dim3 grid(static_cast<unsigned>(tiles < kIndexerMaxTileBlocks ? tiles : kIndexerMaxTileBlocks),
            static_cast<unsigned>(n));
  PdlLaunch(IndexerScoresKernel, grid, kIndexerThreads, smem, s, q, weights, dev, heads, dim, positions, ratio, ld,
            scratch);
  const int cache_keys = static_cast<int>(ld < kTopkCacheKeys ? ld : kTopkCacheKeys);
  PdlLaunch(TopKKernel, static_cast<unsigned>(n), kTopkThreads, cache_keys * sizeof(uint32_t), s, scratch, ld, dev,
            positions, ratio, top_k, cache_keys, out);
}

}  // namespace

void IndexerTopK(const float* q, const float* weights, PagedRowsDev keys, int64_t num_keys, int64_t heads,
                 int64_t dim, const int64_t* positions, int64_t n, int ratio, int top_k, int64_t ld_keys,
                 float* scratch, int32_t* out, ParamStager& stage, cudaStream_t s) {
  IndexerBatch batch{};
  batch.num_seqs = 1;
  batch.keys[0] = keys;
  batch.num_keys[0] = num_keys;
  LaunchIndexer(q, weights, batch, heads, dim, positions, n, ratio, top_k, ld_keys, scratch, out, stage, s);
}

int IndexerBatchMaxRows() { return kIndexerBatchMaxRows; }
int IndexerBatchMaxSeqs() { return kIndexerMaxSeqs; }

void IndexerTopKBatch(const float* q, const float* weights, const IndexerSeqDev* seqs, int num_seqs, int64_t heads,
                      int64_t dim, const int64_t* positions, int64_t n, int ratio, int top_k, int64_t ld_keys,
                      float* scratch, int32_t* out, ParamStager& stage, cudaStream_t s) {
  if (n > kIndexerBatchMaxRows || num_seqs < 1 || num_seqs > kIndexerMaxSeqs)
    throw std::runtime_error("cuda IndexerTopKBatch: " + std::to_string(n) + " rows of " + std::to_string(num_seqs) +
                             " sequences (at most " + std::to_string(kIndexerBatchMaxRows) + " rows of " +
                             std::to_string(kIndexerMaxSeqs) + ")");
  IndexerBatch batch{};
  batch.num_seqs = num_seqs;
  int64_t rows = 0;
  for (int i = 0; i < num_seqs; ++i) {
    batch.keys[i] = seqs[i].keys;
    batch.num_keys[i] = seqs[i].num_keys;
    for (int64_t r = 0; r < seqs[i].count; ++r) {
      if (seqs[i].offset + r >= n) throw std::runtime_error("cuda IndexerTopKBatch: a sequence's rows pass the step's");
      batch.row_seq[seqs[i].offset + r] = static_cast<int8_t>(i);
    }
    rows += seqs[i].count;
  }
  if (rows != n) throw std::runtime_error("cuda IndexerTopKBatch: the sequences cover " + std::to_string(rows) +
                                          " of the step's " + std::to_string(n) + " rows");
  LaunchIndexer(q, weights, batch, heads, dim, positions, n, ratio, top_k, ld_keys, scratch, out, stage, s);
}

int64_t AttentionMaxKeys() { return kAttnMaxKeys; }

int64_t AttentionSplitScratchFloats(int64_t n, int64_t heads, int64_t d) {
  return (n < kSplitMaxRows ? n : kSplitMaxRows) * heads * kSplitMaxRanges * (d + 2);
}

void Attention(const float* q, int64_t n, int64_t heads, int64_t d, int64_t start, const float* ring,
               int64_t ring_slots, const float* new_kv, int window, PagedRowsDev entries, int64_t num_entries, int ratio,
               const int32_t* topk, int64_t topk_cols, const float* sinks, float softmax_scale, float* out,
               float* split_scratch, ParamStager& stage, cudaStream_t s) {
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
  if (split_scratch) {
    // Slices of kSplitMaxRows rows (prefill chunks take several): rows first_row.. of the sequence, whose
    // keys (ring, new_kv, top-k lists) are addressed from the sequence's first row as before.
    for (int64_t r0 = 0; r0 < n; r0 += kSplitMaxRows) {
      AttentionSeqDev slice;
      slice.count = n - r0 < kSplitMaxRows ? n - r0 : kSplitMaxRows;
      slice.first_row = r0;
      slice.start = start;
      slice.ring = ring;
      slice.ring_slots = ring_slots;
      slice.entries = entries;
      slice.num_entries = num_entries;
      AttentionBatch(q + r0 * heads * d, slice.count, heads, d, new_kv, window, ratio, topk, topk_cols, &slice, 1,
                     sinks, softmax_scale, out + r0 * heads * d, split_scratch, stage, s);
    }
    return;
  }
  AttnKeys keys{ring, new_kv, entries, topk, topk_cols, start, num_entries, d, ring_slots, window, ratio};
  const size_t smem = static_cast<size_t>(kAttnFixedSmemFloats + max_keys) * sizeof(float);
  PdlLaunch(AttentionKernel, static_cast<unsigned>(n * heads), kAttnThreads, smem, s, q, heads, keys, sinks,
            softmax_scale, out);
}

int AttentionBatchMaxRows() { return kSplitMaxRows; }
int AttentionBatchMaxSeqs() { return kSplitMaxSeqs; }

void AttentionBatch(const float* q, int64_t n, int64_t heads, int64_t d, const float* new_kv, int window, int ratio,
                    const int32_t* topk, int64_t topk_cols, const AttentionSeqDev* seqs, int num_seqs,
                    const float* sinks, float softmax_scale, float* out, float* split_scratch, ParamStager& stage,
                    cudaStream_t s) {
  if (n <= 0) return;
  if (n > kSplitMaxRows || num_seqs < 1 || num_seqs > kSplitMaxSeqs || !split_scratch)
    throw std::runtime_error("cuda AttentionBatch: " + std::to_string(n) + " rows of " + std::to_string(num_seqs) +
                             " sequences (at most " + std::to_string(kSplitMaxRows) + " rows of " +
                             std::to_string(kSplitMaxSeqs) + ", with split scratch)");
  if (d > kAttnFixedSmemFloats) throw std::runtime_error("cuda Attention: head_dim above 512");
  AttnBatch batch{};
  int64_t max_keys = 0, rows = 0;
  for (int i = 0; i < num_seqs; ++i) {
    const AttentionSeqDev& q_seq = seqs[i];
    const bool comp = q_seq.entries.pool && ratio > 0;
    batch.seq[i] = AttnKeys{q_seq.ring, new_kv + q_seq.offset * d, comp ? q_seq.entries : PagedRowsDev{},
                            topk ? topk + q_seq.offset * topk_cols : nullptr, topk_cols, q_seq.start,
                            comp ? q_seq.num_entries : 0, d, q_seq.ring_slots, window, ratio};
    const int64_t ncomp = comp ? (topk ? topk_cols : q_seq.num_entries) : 0;
    max_keys = max_keys > window + ncomp ? max_keys : window + ncomp;
    for (int64_t r = 0; r < q_seq.count; ++r) {
      if (q_seq.offset + r >= n) throw std::runtime_error("cuda AttentionBatch: a sequence's rows pass the step's");
      batch.row_seq[q_seq.offset + r] = static_cast<int8_t>(i);
      batch.row_local[q_seq.offset + r] = static_cast<int32_t>(q_seq.first_row + r);
    }
    rows += q_seq.count;
  }
  if (rows != n) throw std::runtime_error("cuda AttentionBatch: the sequences cover " + std::to_string(rows) +
                                          " of the step's " + std::to_string(n) + " rows");
  if (max_keys > kAttnMaxKeys)
    throw std::runtime_error("cuda Attention: " + std::to_string(max_keys) + " keys per query, the kernel holds " +
                             std::to_string(kAttnMaxKeys));
  const int hg = SplitHeadsFor(heads, d);
  const int64_t ranges = kSplitMaxRanges;  // fixed: see AttentionSplitKernel
  static PerDeviceOnce split_once;
  split_once.Run([](int) {
    CudaCheck(cudaFuncSetAttribute(AttentionSplitKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(SplitSmemFloats(512, kSplitHeads) * sizeof(float))),
              "split attention smem attribute");
  });
  const size_t split_smem = static_cast<size_t>(SplitSmemFloats(d, hg)) * sizeof(float);
  const AttnBatch* dev = stage.Stage(batch);
  if (!stage.Launching()) return;
  PdlLaunch(AttentionSplitKernel, dim3(static_cast<unsigned>(n * (heads / hg)), static_cast<unsigned>(ranges)),
            kSplitThreads, split_smem, s, q, heads, hg, dev, softmax_scale, split_scratch);
  PdlLaunch(AttentionCombineKernel, static_cast<unsigned>(n * heads), kCombineThreads, 0, s, split_scratch, heads, d,
            ranges, sinks, out);
}

void UpdateRing(const float* new_kv, int64_t n, int64_t d, int64_t start, int64_t ring_slots, float* ring,
                cudaStream_t s) {
  const int64_t rows = n < ring_slots ? n : ring_slots;
  if (rows > 0)
    PdlLaunch(UpdateRingKernel, static_cast<unsigned>(rows), 128, 0, s, new_kv, n, d, start, ring_slots, ring);
}

}  // namespace dsmesh::cuda_ops
