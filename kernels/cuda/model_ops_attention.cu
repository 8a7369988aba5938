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

// scores[r, w] = sum_h weights[r, h] * relu(q[r, h] . keys[w]) for w < valid(r). One block per 32 keys
// of a row: the keys go to shared memory, lane j of every warp takes key j, warp v takes the heads
// v, v + warps, ... (each dot product in index order), and the warps' partial sums are added in warp
// order.
constexpr int kIndexerKeys = 32;
constexpr int kIndexerThreads = 256;
constexpr int kIndexerMaxSeqs = 8, kIndexerBatchMaxRows = 16;

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
  extern __shared__ float smem[];
  float* qs = smem;                            // [heads][dim]
  float* ks = qs + heads * dim;                // [kIndexerKeys][dim + 1]
  __shared__ float part[kIndexerThreads / 32][kIndexerKeys];
  const int64_t r = blockIdx.y, ld = dim + 1;
  const int seq = pbatch->SeqOf(r);
  const PagedRowsDev keys = pbatch->keys[seq];
  const int64_t valid = min(pbatch->num_keys[seq], (positions[r] + 1) / ratio);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kIndexerKeys;
  if (first >= valid) return;
  const int64_t nk = valid - first < kIndexerKeys ? valid - first : kIndexerKeys;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int hd = static_cast<int>(heads * dim), dd = static_cast<int>(dim);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = q[r * hd + i];
  // Warp v copies keys v, v + warps, ... (float4 when f32 rows allow; bf16/fp8 rows decoded), no division.
  const bool vec4 = keys.kind == RowKind::kF32 && dd % 4 == 0 && (reinterpret_cast<uintptr_t>(keys.pool) & 15) == 0;
  for (int j = warp; j < kIndexerKeys; j += warps) {
    WarpCopyStoredRow(j < nk ? keys.Row(first + j) : nullptr, keys.kind, keys.nope, dd, vec4, lane, ks + j * ld);
  }
  __syncthreads();
  const float* k = ks + lane * ld;
  float s = 0.0f;
  for (int64_t h = warp; h < heads; h += warps) {
    const float* qh = qs + h * dim;
    // Four interleaved partial sums (a quarter of the dependent FMA chain), added in a fixed order.
    float dot0 = 0.0f, dot1 = 0.0f, dot2 = 0.0f, dot3 = 0.0f;
    const int d4 = dd & ~3;
    for (int c = 0; c < d4; c += 4) {
      dot0 += qh[c] * k[c];
      dot1 += qh[c + 1] * k[c + 1];
      dot2 += qh[c + 2] * k[c + 2];
      dot3 += qh[c + 3] * k[c + 3];
    }
    for (int c = d4; c < dd; ++c) dot0 += qh[c] * k[c];
    s += weights[r * heads + h] * fmaxf(0.0f, (dot0 + dot1) + (dot2 + dot3));
  }
  part[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && lane < nk) {
    float total = 0.0f;
    for (int v = 0; v < warps; ++v) total += part[v][lane];
    scores[r * ld_scores + first + lane] = total;
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
__global__ void TopKKernel(const float* scores, int64_t ld_scores, const IndexerBatch* __restrict__ pbatch,
                           const int64_t* positions, int ratio, int top_k, int32_t* out) {
  PdlWait();
  PdlTrigger();
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
      // The digit of the k-th largest key: thread t holds bin 255 - t, an inclusive scan over the threads
      // counts the keys in bins >= that digit, and the one thread where the count first reaches
      // `remaining` names the digit and the keys of larger digits (cum).
      const int remaining = s_remaining;
      int count = 0, incl = 0;
      if (threadIdx.x < 256) {
        count = static_cast<int>(hist[255 - threadIdx.x]);
        incl = count;
        const int lane = threadIdx.x & 31;
        for (int o = 1; o < 32; o <<= 1) {
          const int v = __shfl_up_sync(0xffffffffu, incl, o);
          if (lane >= o) incl += v;
        }
        if (lane == 31) scan_part[threadIdx.x >> 5] = incl;
      }
      __syncthreads();
      if (threadIdx.x < 256) {
        for (int w = 0; w < static_cast<int>(threadIdx.x >> 5); ++w) incl += scan_part[w];
        const int cum = incl - count;
        if (cum < remaining && (incl >= remaining || threadIdx.x == 255)) {  // digit 0 takes the rest
          s_remaining = remaining - cum;  // keys equal to the threshold still to take (after this pass)
          s_prefix = prefix | (static_cast<uint32_t>(255 - threadIdx.x) << shift);
          s_mask = mask | (255u << shift);
        }
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
// the range 32 keys at a time: the keys go to shared memory once for all heads of the group, warp h
// scores head h against the 32 keys (lane j = key j), and an online softmax keeps each head's running
// max, sum and weighted values. The partial results of the ranges (max, sum, values per head) are
// merged by AttentionCombineKernel with the sink, in range order (deterministic).
constexpr int kSplitKeys = 32;     // keys per pass (one per lane)
constexpr int kSplitHeads = 8;     // heads per block (one warp each while scoring)
constexpr int kSplitThreads = 256;
constexpr int kSplitMaxRanges = 32;
constexpr int kSplitMaxRows = 16;
constexpr int kSplitAccPerThread = kSplitHeads * 512 / kSplitThreads;  // values per thread at head_dim 512

int SplitHeadsFor(int64_t heads, int64_t d) {
  for (int g = kSplitHeads; g > 1; g /= 2)
    if (heads % g == 0 && g * d <= kSplitHeads * 512) return g;
  return 1;
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
// sums its keys the same way whatever else the launch holds.
__global__ void __launch_bounds__(kSplitThreads) AttentionSplitKernel(const float* q, int64_t heads, int head_group,
                                                                      const AttnBatch* __restrict__ batch,
                                                                      float softmax_scale, float* partial) {
  PdlWait();
  PdlTrigger();
  extern __shared__ float smem[];
  __shared__ const void* kp[kSplitKeys];  // the pass's key rows (null: absent)
  __shared__ __align__(16) unsigned char keys_bytes[sizeof(AttnKeys)];  // (AttnKeys has initializers)
  AttnKeys& keys = *reinterpret_cast<AttnKeys*>(keys_bytes);
  const int64_t groups = heads / head_group;
  const int64_t r = blockIdx.x / groups, h0 = (blockIdx.x % groups) * head_group, g = blockIdx.y;
  if (threadIdx.x == 0) keys = batch->seq[batch->row_seq[r]];
  __syncthreads();
  const int64_t d = keys.d, ld = d + 1;  // key rows padded by one float: lane j reads row j without conflicts
  float* ks = smem;                                  // [kSplitKeys][d + 1]
  float* qs = ks + kSplitKeys * ld;                  // [head_group][d]
  float* ps = qs + head_group * d;                   // [head_group][kSplitKeys] probabilities of the pass
  float* alpha = ps + head_group * kSplitKeys;       // [head_group] rescale of the running values
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
  for (int i = threadIdx.x; i < head_group * static_cast<int>(d); i += blockDim.x) qs[i] = q[(r * heads + h0) * d + i];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float run_max = -INFINITY, run_sum = 0.0f;  // of head `warp` (warps < head_group), kept by every lane
  // Output i of this thread is channel acc_c[i] of head acc_h[i] (acc_c -1: none).
  float acc[kSplitAccPerThread];
  int acc_h[kSplitAccPerThread], acc_c[kSplitAccPerThread];
#pragma unroll
  for (int i = 0; i < kSplitAccPerThread; ++i) {
    const int o = static_cast<int>(threadIdx.x) + i * kSplitThreads;
    acc[i] = 0.0f;
    acc_h[i] = o / static_cast<int>(d);
    acc_c[i] = o < head_group * static_cast<int>(d) ? o % static_cast<int>(d) : -1;
  }
  const bool vec4 = d % 4 == 0 && AllRowsAligned(keys);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kSplitKeys) {
    __syncthreads();  // the previous pass is done with ks / ps
    // The pass's keys into shared memory; absent ones (unlisted, not yet visible, past the range) are zero.
    const int64_t npass = k_end - k0 < kSplitKeys ? k_end - k0 : kSplitKeys;
    if (threadIdx.x < kSplitKeys)
      kp[threadIdx.x] = threadIdx.x < npass ? keys.Key(rl, lo, nwin, visible, k0 + threadIdx.x) : nullptr;
    __syncthreads();
    // Warp v copies keys v, v + 8, ...: lanes stride the row (float4 when rows allow), no division.
    const int dd = static_cast<int>(d);
    for (int j = warp; j < kSplitKeys; j += kSplitThreads / 32) {
      const RowKind kind = keys.KindOf(nwin, k0 + j);
      WarpCopyStoredRow(kp[j], kind, keys.entries.nope, dd, vec4, lane, ks + j * ld);
    }
    __syncthreads();
    if (warp < head_group) {
      const int64_t j = lane;
      const void* k = kp[j];
      float s = -INFINITY;
      if (k) {
        const float* qh = qs + warp * d;
        const float* kr = ks + j * ld;
        // Four interleaved partial sums (the dependent FMA chain is a quarter as long), added in a fixed order.
        float dot0 = 0.0f, dot1 = 0.0f, dot2 = 0.0f, dot3 = 0.0f;
        const int d4 = static_cast<int>(d) & ~3;
        for (int c = 0; c < d4; c += 4) {
          dot0 += qh[c] * kr[c];
          dot1 += qh[c + 1] * kr[c + 1];
          dot2 += qh[c + 2] * kr[c + 2];
          dot3 += qh[c + 3] * kr[c + 3];
        }
        for (int c = d4; c < static_cast<int>(d); ++c) dot0 += qh[c] * kr[c];
        s = ((dot0 + dot1) + (dot2 + dot3)) * softmax_scale;
      }
      const float m_new = fmaxf(run_max, WarpMax(s));
      const float p = s == -INFINITY ? 0.0f : expf(s - m_new);
      const float a = run_max == -INFINITY ? 0.0f : expf(run_max - m_new);
      run_sum = run_sum * a + WarpSum(p);
      run_max = m_new;
      ps[warp * kSplitKeys + j] = p;
      if (lane == 0) alpha[warp] = a;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kSplitAccPerThread; ++i) {
      if (acc_c[i] >= 0) {
        const float* pr = ps + acc_h[i] * kSplitKeys;
        const float* kc = ks + acc_c[i];
        float v = acc[i] * alpha[acc_h[i]];
#pragma unroll 8
        for (int j = 0; j < kSplitKeys; ++j) v += pr[j] * kc[j * ld];
        acc[i] = v;
      }
    }
  }
  // Partials: values by every thread, max and sum by lane 0 of each head's warp.
#pragma unroll
  for (int i = 0; i < kSplitAccPerThread; ++i)
    if (acc_c[i] >= 0) partial[((r * heads + h0 + acc_h[i]) * ranges + g) * (d + 2) + 2 + acc_c[i]] = acc[i];
  if (warp < head_group && lane == 0) {
    float* pm = partial + ((r * heads + h0 + warp) * ranges + g) * (d + 2);
    pm[0] = run_max;
    pm[1] = run_sum;
  }
}

// out[r, h] = sum_g e^(m_g - M) values_g / (sum_g e^(m_g - M) sum_g + e^(sink_h - M)), M the largest max.
// One block per (row, head). The ranges' maxima and sums are read once, in parallel, into shared memory;
// each thread then sums its kCombineChannels channels over the ranges with every load independent of the
// others (a range without keys contributes nothing: its values are never used), adding in range order.
constexpr int kCombineThreads = 128, kCombineChannels = 4, kCombineMaxRanges = 64;
static_assert(kSplitMaxRanges <= kCombineMaxRanges, "the combine keeps every range's weight in shared memory");
__global__ void __launch_bounds__(kCombineThreads) AttentionCombineKernel(const float* partial, int64_t heads,
                                                                          int64_t d, int64_t ranges,
                                                                          const float* sinks, float* out) {
  PdlWait();
  PdlTrigger();
  __shared__ float wgt[kCombineMaxRanges];  // e^(m_g - M), 0 for a range without keys
  __shared__ float denom_s;
  const int64_t r = blockIdx.x / heads, h = blockIdx.x % heads;
  const float* p = partial + (r * heads + h) * ranges * (d + 2);
  const int t = threadIdx.x;
  if (t < 32) {
    float mx = sinks[h];
    for (int64_t g = t; g < ranges; g += 32) mx = fmaxf(mx, p[g * (d + 2)]);
    mx = WarpMax(mx);
    float denom = expf(sinks[h] - mx);
    for (int64_t g0 = 0; g0 < ranges; g0 += 32) {  // weights in parallel, the sum in range order (lane 0)
      const int64_t g = g0 + t;
      float m = -INFINITY, sum = 0.0f;
      if (g < ranges) {
        m = p[g * (d + 2)];
        sum = p[g * (d + 2) + 1];
      }
      const float w = m == -INFINITY ? 0.0f : expf(m - mx);
      if (g < ranges) wgt[g] = w;
      const int64_t here = ranges - g0 < 32 ? ranges - g0 : 32;
      for (int64_t i = 0; i < here; ++i) {
        const float wi = __shfl_sync(0xffffffffu, w, static_cast<int>(i));
        const float si = __shfl_sync(0xffffffffu, sum, static_cast<int>(i));
        if (wi != 0.0f) denom += wi * si;
      }
    }
    if (t == 0) denom_s = denom;
  }
  __syncthreads();
  for (int64_t c0 = t; c0 < d; c0 += kCombineThreads * kCombineChannels) {
    float acc[kCombineChannels] = {};
#pragma unroll 4
    for (int64_t g = 0; g < ranges; ++g) {
      const float w = wgt[g];
      if (w == 0.0f) continue;
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
  const size_t smem = static_cast<size_t>(heads * dim + kIndexerKeys * (dim + 1)) * sizeof(float);
  static PerDeviceOnce once;
  once.Run([](int) {
    CudaCheck(cudaFuncSetAttribute(IndexerScoresKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024),
              "indexer smem attribute");
  });
  if (smem > 160 * 1024) throw std::runtime_error("cuda IndexerTopK: heads x dim too large for shared memory");
  // The launch covers ld_keys keys per row whatever the sequences hold (blocks past a row's keys return):
  // its shape depends on ld_keys only.
  for (int i = 0; i < batch.num_seqs; ++i)
    if (batch.num_keys[i] > ld_keys)
      throw std::runtime_error("cuda IndexerTopK: " + std::to_string(batch.num_keys[i]) + " keys, the launch covers " +
                               std::to_string(ld_keys));
  const int64_t ld = ld_keys > 0 ? ld_keys : 1;
  const IndexerBatch* dev = stage.Stage(batch);
  if (!stage.Launching()) return;
  dim3 grid(static_cast<unsigned>((ld + kIndexerKeys - 1) / kIndexerKeys), static_cast<unsigned>(n));
  PdlLaunch(IndexerScoresKernel, grid, kIndexerThreads, smem, s, q, weights, dev, heads, dim, positions, ratio, ld,
            scratch);
  PdlLaunch(TopKKernel, static_cast<unsigned>(n), kTopkThreads, 0, s, scratch, ld, dev, positions, ratio, top_k, out);
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
                                   static_cast<int>((kSplitKeys * 513 + kSplitHeads * 512 + kSplitHeads * (kSplitKeys + 1)) *
                                                    sizeof(float))),
              "split attention smem attribute");
  });
  const size_t split_smem = static_cast<size_t>(kSplitKeys * (d + 1) + hg * d + hg * (kSplitKeys + 1)) * sizeof(float);
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
