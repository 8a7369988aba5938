// The device row sampler (sampling_ops.h): one block of kThreads per row. The arithmetic of a draw is
// sampling_math.h, shared with the host reference (kernels/sampling/row_sampler.cc); this file only
// decides in which order to visit the logits.
// Every kernel here is launched through PdlLaunch (pdl_launch.cuh) and starts with PdlWait() (it reads
// the previous kernels' output from its first load on; its prologue is index math only) and then
// PdlTrigger(), so that with programmatic dependent launch the next kernel's launch overlaps all of it.
#include "kernels/cuda/sampling_ops.h"

#include <cstdint>

#include "kernels/sampling/random_stream.h"
#include "kernels/sampling/sampling_math.h"
#include "kernels/cuda/pdl_launch.cuh"

namespace dsmesh::cuda_ops {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int32_t kNoId = 0x7fffffff;

// The compacted candidates of one row: order key, token id and integer weight, in id order.
struct Candidates {
  uint32_t* key;
  int32_t* id;
  uint64_t* weight;
};

__device__ Candidates RowCandidates(void* scratch, int64_t vocab, int64_t row) {
  char* base = static_cast<char*>(scratch) + row * vocab * 16;
  return {reinterpret_cast<uint32_t*>(base), reinterpret_cast<int32_t*>(base + vocab * 4),
          reinterpret_cast<uint64_t*>(base + vocab * 8)};
}

// Where the kept candidates end: every candidate up to and including (key, id) in sampling order
// (larger key first, lower id first); `all` when nothing was cut yet.
struct Boundary {
  bool all = true;
  uint32_t key = 0;
  int32_t id = 0;
  __device__ bool Keeps(uint32_t k, int32_t i) const { return all || k > key || (k == key && i <= id); }
};

// ---- block-wide helpers (blockDim.x == kThreads; every thread calls them; results to every thread) ----

template <class T>
__device__ T WarpShuffleXor(T v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}

// Sum or max of a per-thread value, combined in a fixed order (deterministic).
template <class T, bool kMax>
__device__ T BlockCombine(T v, T* smem) {
  for (int o = 16; o > 0; o >>= 1) {
    const T other = WarpShuffleXor(v, o);
    v = kMax ? (other > v ? other : v) : v + other;
  }
  __syncthreads();  // smem may still be read by a previous call
  if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    T acc = smem[0];
    for (int w = 1; w < kWarps; ++w) acc = kMax ? (smem[w] > acc ? smem[w] : acc) : acc + smem[w];
    smem[0] = acc;
  }
  __syncthreads();
  return smem[0];
}

// The best (value, index) pair of the block: larger value, lower index on ties; NaN never wins.
struct Best {
  float value;
  int32_t index;
};
__device__ bool Better(float v, int32_t i, const Best& b) { return v > b.value || (v == b.value && i < b.index); }

__device__ Best BlockBest(Best b, Best* smem) {
  for (int o = 16; o > 0; o >>= 1) {
    const Best other{__shfl_xor_sync(0xffffffffu, b.value, o), __shfl_xor_sync(0xffffffffu, b.index, o)};
    if (Better(other.value, other.index, b)) b = other;
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = b;
  __syncthreads();
  if (threadIdx.x == 0) {
    Best acc = smem[0];
    for (int w = 1; w < kWarps; ++w)
      if (Better(smem[w].value, smem[w].index, acc)) acc = smem[w];
    smem[0] = acc;
  }
  __syncthreads();
  return smem[0];
}

// Exclusive prefix sum of a per-thread count in thread order; *total gets the sum.
__device__ uint32_t BlockExclusiveScan(uint32_t v, uint32_t* smem, uint32_t* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint32_t x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) smem[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t run = 0;
    for (int w = 0; w < kWarps; ++w) {
      const uint32_t t = smem[w];
      smem[w] = run;
      run += t;
    }
    smem[kWarps] = run;
  }
  __syncthreads();
  const uint32_t out = smem[warp] + x - v;
  *total = smem[kWarps];
  __syncthreads();
  return out;
}

// This thread's contiguous share [begin, end) of n items (scans in id order need contiguous shares).
__device__ void Share(int64_t n, int64_t* begin, int64_t* end) {
  const int64_t per = (n + kThreads - 1) / kThreads;
  const int64_t b = threadIdx.x * per;
  *begin = b < n ? b : n;
  *end = *begin + per < n ? *begin + per : n;
}

struct SharedState {
  uint32_t count[256];
  unsigned long long mass[256];
  uint64_t u64[kWarps];
  double f64[kWarps];
  float f32[kWarps];
  Best best[kWarps];
  uint32_t scan[kWarps + 1];
  // Radix search results.
  uint32_t digit;
  unsigned long long before_count, before_mass, tie_weight;
  int32_t found;
};

__device__ Best RowArgmax(const float* raw, int64_t vocab, SharedState& sh) {
  Best b{-INFINITY, kNoId};
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads)
    if (Better(raw[i], static_cast<int32_t>(i), b)) b = {raw[i], static_cast<int32_t>(i)};
  b = BlockBest(b, sh.best);
  if (b.index == kNoId) b.index = 0;  // every logit NaN: the host's Argmax answers 0
  return b;
}

enum class Cross { kCount, kMassAtLeast, kMassAbove };

// The first kept candidate (sampling order) at which the running count reaches `target` (kCount), the
// running weight reaches `target` (kMassAtLeast) or exceeds it (kMassAbove). The caller guarantees that
// the kept candidates get there.
__device__ Boundary Search(const Candidates& c, uint32_t n, const Boundary& kept, Cross mode, uint64_t target,
                           SharedState& sh) {
  uint32_t prefix = 0, mask = 0;
  uint64_t before_count = 0, before_mass = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kThreads) sh.count[d] = 0, sh.mass[d] = 0;
    __syncthreads();
    for (uint32_t j = threadIdx.x; j < n; j += kThreads) {
      const uint32_t k = c.key[j];
      if ((k & mask) != prefix || !kept.Keeps(k, c.id[j])) continue;
      const uint32_t d = (k >> shift) & 255u;
      atomicAdd(&sh.count[d], 1u);
      if (mode != Cross::kCount) atomicAdd(&sh.mass[d], static_cast<unsigned long long>(c.weight[j]));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // Digits from the largest down: the first whose bucket carries the running total over the target.
      uint32_t chosen = 0;
      for (int d = 255; d >= 0; --d) {
        const uint64_t cnt = sh.count[d], mass = sh.mass[d];
        if (cnt == 0) continue;
        chosen = d;
        const bool crosses = mode == Cross::kCount         ? before_count + cnt >= target
                             : mode == Cross::kMassAtLeast ? before_mass + mass >= target
                                                           : before_mass + mass > target;
        if (crosses) break;
        before_count += cnt;
        before_mass += mass;
      }
      sh.digit = chosen;
      sh.before_count = before_count;
      sh.before_mass = before_mass;
      sh.tie_weight = sh.count[chosen] ? sh.mass[chosen] / sh.count[chosen] : 0;
    }
    __syncthreads();
    prefix |= sh.digit << shift;
    mask |= 255u << shift;
    before_count = sh.before_count;
    before_mass = sh.before_mass;
  }
  // Candidates of key `prefix` all weigh the same: the crossing one is the m-th of them in id order.
  const uint64_t w = sh.tie_weight;
  uint64_t m;
  if (mode == Cross::kCount) {
    m = target - before_count;
  } else if (mode == Cross::kMassAtLeast) {
    m = w ? (target - before_mass + w - 1) / w : 1;
  } else {
    m = w ? (target - before_mass) / w + 1 : 1;
  }
  if (m == 0) m = 1;
  int64_t b0, b1;
  Share(n, &b0, &b1);
  uint32_t mine = 0;
  for (int64_t j = b0; j < b1; ++j) mine += c.key[j] == prefix && kept.Keeps(prefix, c.id[j]);
  uint32_t total = 0;
  const uint32_t before = BlockExclusiveScan(mine, sh.scan, &total);
  if (threadIdx.x == 0) sh.found = -1;
  __syncthreads();
  if (m > total) m = total;  // unreachable when the caller's guarantee holds; stay inside the ties
  if (before < m && m <= before + mine) {
    uint32_t seen = before;
    for (int64_t j = b0; j < b1; ++j)
      if (c.key[j] == prefix && kept.Keeps(prefix, c.id[j]) && ++seen == m) {
        sh.found = c.id[j];
        break;
      }
  }
  __syncthreads();
  Boundary out;
  out.all = false;
  out.key = prefix;
  out.id = sh.found;
  __syncthreads();
  return out;
}

__device__ uint64_t KeptWeight(const Candidates& c, uint32_t n, const Boundary& kept, SharedState& sh) {
  uint64_t s = 0;
  for (uint32_t j = threadIdx.x; j < n; j += kThreads)
    if (kept.Keeps(c.key[j], c.id[j])) s += c.weight[j];
  return BlockCombine<uint64_t, false>(s, sh.u64);
}

// The drawn token of a sampled row (row_sampler.h's rules); -1 when no logit is drawable.
__device__ int32_t DrawRow(const float* raw, int64_t vocab, const SampleRowParams& p, const Candidates& c,
                           SharedState& sh) {
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) mx = fmaxf(mx, sampling::ScaledLogit(raw[i], p.temperature));
  mx = BlockCombine<float, true>(mx, sh.f32);
  if (mx == -INFINITY) return -1;
  const int shift = sampling::WeightShift(vocab);
  const uint64_t min_p_weight = sampling::MinPWeight(p.min_p, shift);
  const uint64_t min_w = min_p_weight > 1 ? min_p_weight : 1;  // candidates weigh at least 1
  // Compact the candidates (positive weight, past min_p) in id order: count, scan, write.
  int64_t b0, b1;
  Share(vocab, &b0, &b1);
  uint64_t all = 0;
  uint32_t mine = 0;
  for (int64_t i = b0; i < b1; ++i) {
    const uint64_t w = sampling::SampleWeight(static_cast<double>(sampling::ScaledLogit(raw[i], p.temperature) - mx), shift);
    all += w;
    mine += w >= min_w;
  }
  all = BlockCombine<uint64_t, false>(all, sh.u64);
  uint32_t n = 0;
  uint32_t at = BlockExclusiveScan(mine, sh.scan, &n);
  for (int64_t i = b0; i < b1; ++i) {
    const float x = sampling::ScaledLogit(raw[i], p.temperature);
    const uint64_t w = sampling::SampleWeight(static_cast<double>(x - mx), shift);
    if (w < min_w) continue;
    c.key[at] = sampling::OrderKey(x);
    c.id[at] = static_cast<int32_t>(i);
    c.weight[at] = w;
    ++at;
  }
  __syncthreads();
  Boundary kept;
  if (p.top_k > 0 && static_cast<uint32_t>(p.top_k) < n) kept = Search(c, n, kept, Cross::kCount, p.top_k, sh);
  uint64_t kept_weight = KeptWeight(c, n, kept, sh);
  if (p.top_p > 0.0f && p.top_p < 1.0f) {
    const uint64_t need = sampling::TopPWeight(p.top_p, all);
    if (kept_weight >= need) {
      kept = Search(c, n, kept, Cross::kMassAtLeast, need, sh);
      kept_weight = KeptWeight(c, n, kept, sh);
    }
  }
  const uint64_t target = sampling::DrawTarget(Uniform01(p.seed, p.position), kept_weight);
  return Search(c, n, kept, Cross::kMassAbove, target, sh).id;
}

// Log softmax of the raw logits at `token` and the top n raw logits (larger first, lower id on ties).
__device__ void RowLogprobs(const float* raw, int64_t vocab, int32_t token, int top_n, SampleRowOut* out,
                            SharedState& sh) {
  double mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) mx = fmax(mx, static_cast<double>(raw[i]));
  mx = BlockCombine<double, true>(mx, sh.f64);
  double sum = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) sum += exp(static_cast<double>(raw[i]) - mx);
  sum = BlockCombine<double, false>(sum, sh.f64);
  const double log_z = mx + log(sum);
  if (threadIdx.x == 0) out->logprob = static_cast<float>(raw[token] - log_z);
  if (top_n > kSampleMaxTopLogprobs) top_n = kSampleMaxTopLogprobs;
  if (top_n > vocab) top_n = static_cast<int>(vocab);
  Best prev{INFINITY, -1};
  for (int k = 0; k < top_n; ++k) {
    // The best logit strictly after the previous pick in that order.
    Best b{-INFINITY, kNoId};
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float v = raw[i];
      const int32_t id = static_cast<int32_t>(i);
      const bool after = v < prev.value || (v == prev.value && id > prev.index);
      if (after && Better(v, id, b)) b = {v, id};
    }
    b = BlockBest(b, sh.best);
    if (b.index == kNoId) break;
    if (threadIdx.x == 0) {
      out->top_ids[k] = b.index;
      out->top_logprobs[k] = static_cast<float>(raw[b.index] - log_z);
    }
    prev = b;
  }
}

__global__ void __launch_bounds__(kThreads) SampleRowsKernel(const float* logits, int64_t vocab,
                                                             const SampleRowParams* params, void* scratch,
                                                             SampleRowOut* outs) {
  PdlWait();
  PdlTrigger();
  __shared__ SharedState sh;
  const int64_t row = blockIdx.x;
  const float* raw = logits + row * vocab;
  const SampleRowParams p = params[row];
  SampleRowOut* out = outs + row;
  int32_t token = -1;
  if (!(p.temperature < sampling::kGreedyTemperature))
    token = DrawRow(raw, vocab, p, RowCandidates(scratch, vocab, row), sh);
  if (token < 0) token = RowArgmax(raw, vocab, sh).index;  // greedy, or nothing drawable
  if (threadIdx.x == 0) out->token = token;
  if (p.logprobs >= 0) RowLogprobs(raw, vocab, token, p.logprobs, out, sh);
}

__global__ void __launch_bounds__(kThreads) ArgmaxRowsKernel(const float* logits, int64_t vocab, int32_t* ids) {
  PdlWait();
  PdlTrigger();
  __shared__ SharedState sh;
  const int32_t token = RowArgmax(logits + blockIdx.x * vocab, vocab, sh).index;
  if (threadIdx.x == 0) ids[blockIdx.x] = token;
}

}  // namespace

int64_t SampleRowsScratchBytes(int64_t rows, int64_t vocab) { return rows * vocab * 16; }

void SampleRows(const float* logits, int64_t rows, int64_t vocab, const SampleRowParams* params, void* scratch,
                SampleRowOut* out, cudaStream_t s) {
  if (rows > 0)
    PdlLaunch(SampleRowsKernel, static_cast<unsigned>(rows), kThreads, 0, s, logits, vocab, params, scratch, out);
}

void ArgmaxRows(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, cudaStream_t s) {
  if (rows > 0) PdlLaunch(ArgmaxRowsKernel, static_cast<unsigned>(rows), kThreads, 0, s, logits, vocab, ids);
}

}  // namespace dsmesh::cuda_ops
