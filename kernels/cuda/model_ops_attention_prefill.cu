// Attention of prefill chunks on tensor cores (model_ops.h AttentionPrefill; the CPU twin is
// CpuBackend::Attention in kernels/cpu/cpu_backend.cc). The keys are shared by all heads of a query row
// (multi-query attention, value = key), so one block takes one row and 64 heads: the scores of a tile of
// kt keys are Q[64 heads x d] . K^T[d x kt] and the values added are P[64 x kt] . K[kt x d], both as
// mma.m16n8k16 (fp16 operands, fp32 accumulation). By default each operand goes in as two fp16 parts
// (high + low, three mma per product: f32-level results); with `fp16` as one rounding. An online softmax
// runs over the row's key tiles, its running max starting at the head's sink (whose exp(sink - max) is
// the denominator's first term). A row's result depends on its own keys only, summed in the same order
// whatever chunk the row is in; no atomics.
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention_keys.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kv_rows_device.cuh"
#include "kernels/cuda/model_ops.h"

namespace dsmesh::cuda_ops {
namespace {

constexpr int kPfHeads = 64;  // heads per block: four m16 tiles
constexpr int kPfWarps = 16;  // warp w: head tile w % 4, quarter w / 4 (of the tile's keys while scoring, of d after)
constexpr int kPfThreads = kPfWarps * 32;
constexpr int kPfPad = 8;  // halves after each q / key row: the 8 rows of an ldmatrix hit distinct banks

// Keys per tile: 64, or 32 where the split operands of head_dim 512 would not fit shared memory.
template <int D, bool kSplit>
constexpr int PrefillTileKeys() {
  return kSplit && D > 256 ? 32 : 64;
}

// q rows and key rows (each twice when split: high and low fp16 parts), the tile's scores, its key pointers.
template <int D, bool kSplit>
constexpr size_t PrefillSmemBytes() {
  constexpr int kt = PrefillTileKeys<D, kSplit>();
  return static_cast<size_t>(kPfHeads + kt) * (D + kPfPad) * sizeof(__half) * (kSplit ? 2 : 1) +
         static_cast<size_t>(kPfHeads) * (kt + 4) * sizeof(float) + kt * sizeof(const void*);
}

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void LdMatrixX4(const void* p, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}

__device__ __forceinline__ void LdMatrixX4Trans(const void* p, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}

// B fragments of `tiles` n8 tiles (1: x2 into b[0..1], 2: x4) of rows read as they are.
template <int tiles>
__device__ __forceinline__ void LdMatrix(const void* p, uint32_t (&r)[4]) {
  if constexpr (tiles == 2) {
    LdMatrixX4(p, r);
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(SmemAddr(p)));
  }
}

// c += a b for one m16n8k16 tile: a row-major fp16, b column-major fp16, c fp32.
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as fp16 (round to nearest), `x` in the low half.
__device__ __forceinline__ uint32_t PackHalf2(float x, float y) {
  const __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// What the fp16 rounding of x and y left over (x - fp16(x), as fp16): high + low parts carry ~22 bits.
__device__ __forceinline__ uint32_t PackHalf2Rest(float x, float y) {
  const __half2 h = __floats2half2_rn(x, y);
  return PackHalf2(x - __low2float(h), y - __high2float(h));
}

// Values c .. c + 3 of a row into shared memory as fp16: high parts at hi, the rests at lo when kSplit.
template <bool kSplit>
__device__ __forceinline__ void Put4(float4 v, __half* hi, __half* lo) {
  *reinterpret_cast<uint2*>(hi) = make_uint2(PackHalf2(v.x, v.y), PackHalf2(v.z, v.w));
  if constexpr (kSplit) *reinterpret_cast<uint2*>(lo) = make_uint2(PackHalf2Rest(v.x, v.y), PackHalf2Rest(v.z, v.w));
}

// One warp writes a stored key row as D fp16 values (and their rests) into shared memory; a null row as
// zeros, so that an absent key adds 0 * 0 to the values. f32 rows go as float4 loads when `vec4`.
template <int D, bool kSplit>
__device__ __forceinline__ void StageKey(const void* row, RowKind kind, int nope, bool vec4, int lane, __half* hi,
                                         __half* lo) {
  if (!row) {
    for (int c = 4 * lane; c < D; c += 4 * 32) Put4<kSplit>(make_float4(0.0f, 0.0f, 0.0f, 0.0f), hi + c, lo + c);
    return;
  }
  if (kind == RowKind::kF32 && vec4) {
    const float4* src = static_cast<const float4*>(row);
#pragma unroll
    for (int c4 = lane; c4 < D / 4; c4 += 32) Put4<kSplit>(__ldg(src + c4), hi + 4 * c4, lo + 4 * c4);
    return;
  }
  const float scale = kind == RowKind::kFp8 ? Fp8RowScale(static_cast<const uint8_t*>(row), nope) : 0.0f;
  for (int c = 4 * lane; c < D; c += 4 * 32) {
    const float4 v = make_float4(StoredRowValue(row, kind, nope, scale, c), StoredRowValue(row, kind, nope, scale, c + 1),
                                 StoredRowValue(row, kind, nope, scale, c + 2),
                                 StoredRowValue(row, kind, nope, scale, c + 3));
    Put4<kSplit>(v, hi + c, lo + c);
  }
}

// Block (row r, heads h0 .. h0 + 63). Per tile of kt keys: the key rows go to shared memory as fp16; warp
// (head tile mt, quarter qt) scores its 16 heads against keys qt kt/4 .. (qt + 1) kt/4 - 1 into shared
// memory; then every warp reads its 16 heads' scores of the whole tile, updates their running max and
// sum (the four warps of a head tile compute the same values in the same order) and adds P . K over the
// tile to its 16 heads x d/4 values (dims qt d/4 ..), held in registers in the mma accumulator layout.
// Heads past `heads` are zero rows whose results are dropped.
// kSplit: every operand x is fp16(x) + fp16(x - fp16(x)) and each product a.b is taken as
// hi.hi + lo.hi + hi.lo (three mma; lo.lo is below f32 rounding), which leaves the result within f32
// rounding of the CPU's; without it one mma of the fp16 roundings (relative error ~2^-11 per operand).
template <int D, bool kSplit>
__global__ void __launch_bounds__(kPfThreads, 1)
    AttentionPrefillKernel(const float* q, int64_t heads, AttnKeys keys, const float* sinks, float softmax_scale,
                           float* out) {
  static_assert(D % 64 == 0, "each warp's quarter of d is whole pairs of n8 tiles");
  constexpr int kt = PrefillTileKeys<D, kSplit>();
  constexpr int ld = D + kPfPad, sld = kt + 4;  // halves per q / key row, floats per score row
  constexpr int kDimTiles = D / 4 / 8;          // n8 tiles of the warp's values
  constexpr int kKeyTiles = kt / 4 / 8;         // n8 tiles of the warp's scores (1 or 2)
  constexpr int kSteps = kt / 16;               // k16 steps of P . K
  constexpr int kParts = kSplit ? 2 : 1;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* qs = reinterpret_cast<__half*>(smem_raw);                       // [kParts][kPfHeads][ld]
  __half* ks = qs + kParts * kPfHeads * ld;                               // [kParts][kt][ld]
  float* ss = reinterpret_cast<float*>(ks + kParts * kt * ld);            // [kPfHeads][sld]
  const void** kp = reinterpret_cast<const void**>(ss + kPfHeads * sld);  // [kt] (null: absent)
  constexpr int q_lo = kPfHeads * ld, k_lo = kt * ld;                     // offsets of the low parts

  const int64_t r = blockIdx.x, h0 = static_cast<int64_t>(blockIdx.y) * kPfHeads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int mt = warp % 4, qt = warp / 4, g = lane / 4, t = lane % 4;

  // q rows of the block's heads (zeros past `heads`).
  const bool q_vec4 = (reinterpret_cast<uintptr_t>(q) & 15) == 0;
  for (int i = tid; i < kPfHeads * D / 4; i += kPfThreads) {
    const int hh = i / (D / 4), c = 4 * (i % (D / 4));
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (h0 + hh < heads) {
      const float* src = q + ((r * heads + h0 + hh) * D + c);
      v = q_vec4 ? *reinterpret_cast<const float4*>(src) : make_float4(src[0], src[1], src[2], src[3]);
    }
    Put4<kSplit>(v, qs + hh * ld + c, qs + q_lo + hh * ld + c);
  }

  // This lane's two heads (rows g and g + 8 of the warp's head tile): running max (from the sink), sum
  // (exp(sink - max), 1 at the start) and values.
  const int64_t head0 = h0 + 16 * mt + g, head1 = head0 + 8;
  float m_run[2] = {head0 < heads ? sinks[head0] : 0.0f, head1 < heads ? sinks[head1] : 0.0f};
  float l_run[2] = {1.0f, 1.0f};
  float o[kDimTiles][4];
#pragma unroll
  for (int i = 0; i < kDimTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

  const RowSpan span = keys.Span(r);
  const bool vec4 = AllRowsAligned(keys);
  const int nope = keys.entries.nope;
  // ldmatrix addresses (see the m16n8k16 fragment layouts): A of the scores from q rows (head tile mt),
  // B of the scores from key rows qt kt/4 .. (k = dims), B of the values from key rows read transposed.
  const __half* qa = qs + (16 * mt + lane % 16) * ld + (lane / 16) * 8;
  const __half* kb = ks + (qt * (kt / 4) + lane % 8 + (kKeyTiles == 2 ? (lane / 16) * 8 : 0)) * ld + ((lane / 8) % 2) * 8;
  const __half* vb = ks + (lane % 8 + ((lane / 8) % 2) * 8) * ld + qt * (D / 4) + (lane / 16) * 8;
  float* s_mine = ss + (16 * mt + g) * sld;  // row g of the head tile; row g + 8 is 8 rows on

  for (int64_t k0 = 0; k0 < span.nkeys; k0 += kt) {
    __syncthreads();  // the previous tile's readers of kp, ks and ss are done (and qs is written)
    if (tid < kt) kp[tid] = k0 + tid < span.nkeys ? keys.Key(r, span.lo, span.nwin, span.visible, k0 + tid) : nullptr;
    __syncthreads();
    for (int j = warp; j < kt; j += kPfWarps)
      StageKey<D, kSplit>(kp[j], keys.KindOf(span.nwin, k0 + j), nope, vec4, lane, ks + j * ld, ks + k_lo + j * ld);
    __syncthreads();

    // Scores of 16 heads x kt/4 keys, scaled; absent keys -inf.
    {
      float acc[kKeyTiles][4] = {};
#pragma unroll 4
      for (int c = 0; c < D; c += 16) {
        uint32_t a[4], b[4];
        LdMatrixX4(qa + c, a);
        LdMatrix<kKeyTiles>(kb + c, b);
#pragma unroll
        for (int nt = 0; nt < kKeyTiles; ++nt) Mma(acc[nt], a, b[2 * nt], b[2 * nt + 1]);
        if constexpr (kSplit) {
          uint32_t a_lo[4], b_lo[4];
          LdMatrixX4(qa + q_lo + c, a_lo);
          LdMatrix<kKeyTiles>(kb + k_lo + c, b_lo);
#pragma unroll
          for (int nt = 0; nt < kKeyTiles; ++nt) {
            Mma(acc[nt], a_lo, b[2 * nt], b[2 * nt + 1]);
            Mma(acc[nt], a, b_lo[2 * nt], b_lo[2 * nt + 1]);
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < kKeyTiles; ++nt) {
        const int col = qt * (kt / 4) + 8 * nt + 2 * t;
        const bool p0 = kp[col] != nullptr, p1 = kp[col + 1] != nullptr;
        float* s0 = s_mine + col;
        float* s1 = s0 + 8 * sld;
        s0[0] = p0 ? acc[nt][0] * softmax_scale : -INFINITY;
        s0[1] = p1 ? acc[nt][1] * softmax_scale : -INFINITY;
        s1[0] = p0 ? acc[nt][2] * softmax_scale : -INFINITY;
        s1[1] = p1 ? acc[nt][3] * softmax_scale : -INFINITY;
      }
    }
    __syncthreads();

    // Online softmax over the tile: this lane's scores of rows g and g + 8 are, for key step kk, keys
    // 16 kk + 2t + {0, 1} and 16 kk + 8 + 2t + {0, 1}: the A fragment of P for that step.
    float p[2][4 * kSteps];
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
      for (int row = 0; row < 2; ++row) {
        const float* s = s_mine + row * 8 * sld + 16 * kk + 2 * t;
        p[row][4 * kk] = s[0];
        p[row][4 * kk + 1] = s[1];
        p[row][4 * kk + 2] = s[8];
        p[row][4 * kk + 3] = s[9];
      }
    float alpha[2];
#pragma unroll
    for (int row = 0; row < 2; ++row) {
      float mx = m_run[row];
#pragma unroll
      for (int i = 0; i < 4 * kSteps; ++i) mx = fmaxf(mx, p[row][i]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < 4 * kSteps; ++i) sum += (p[row][i] = expf(p[row][i] - mx));  // -inf -> 0
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      alpha[row] = expf(m_run[row] - mx);
      l_run[row] = l_run[row] * alpha[row] + sum;
      m_run[row] = mx;
    }
    // The A fragments of P (fp16 high parts and rests; the sums above keep the f32 probabilities).
    uint32_t pa[kSteps][4], pa_lo[kSplit ? kSteps : 1][4];
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      const float* p0 = &p[0][4 * kk];
      const float* p1 = &p[1][4 * kk];
      pa[kk][0] = PackHalf2(p0[0], p0[1]);
      pa[kk][1] = PackHalf2(p1[0], p1[1]);
      pa[kk][2] = PackHalf2(p0[2], p0[3]);
      pa[kk][3] = PackHalf2(p1[2], p1[3]);
      if constexpr (kSplit) {
        pa_lo[kk][0] = PackHalf2Rest(p0[0], p0[1]);
        pa_lo[kk][1] = PackHalf2Rest(p1[0], p1[1]);
        pa_lo[kk][2] = PackHalf2Rest(p0[2], p0[3]);
        pa_lo[kk][3] = PackHalf2Rest(p1[2], p1[3]);
      }
    }
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i) {
      o[i][0] *= alpha[0];
      o[i][1] *= alpha[0];
      o[i][2] *= alpha[1];
      o[i][3] *= alpha[1];
    }

    // Values: O[16 heads x d/4] += P[16 x kt keys] . K[kt keys x d/4], one k16 step at a time.
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      const __half* v = vb + 16 * kk * ld;
#pragma unroll
      for (int i = 0; i < kDimTiles; i += 2) {
        uint32_t b[4];
        LdMatrixX4Trans(v + 8 * i, b);
        Mma(o[i], pa[kk], b[0], b[1]);
        Mma(o[i + 1], pa[kk], b[2], b[3]);
        if constexpr (kSplit) {
          uint32_t b_lo[4];
          LdMatrixX4Trans(v + k_lo + 8 * i, b_lo);
          Mma(o[i], pa_lo[kk], b[0], b[1]);
          Mma(o[i + 1], pa_lo[kk], b[2], b[3]);
          Mma(o[i], pa[kk], b_lo[0], b_lo[1]);
          Mma(o[i + 1], pa[kk], b_lo[2], b_lo[3]);
        }
      }
    }
  }

  // out = values / sum: this lane holds dims qt d/4 + 8 i + 2t + {0, 1} of heads head0 and head1.
#pragma unroll
  for (int row = 0; row < 2; ++row) {
    const int64_t head = row ? head1 : head0;
    if (head >= heads) continue;
    float* dst = out + (r * heads + head) * D + qt * (D / 4) + 2 * t;
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i) {
      dst[8 * i] = o[i][2 * row] / l_run[row];
      dst[8 * i + 1] = o[i][2 * row + 1] / l_run[row];
    }
  }
}

template <int D, bool kSplit>
void LaunchPrefill(const float* q, int64_t n, int64_t heads, const AttnKeys& keys, const float* sinks,
                   float softmax_scale, float* out, cudaStream_t s) {
  static PerDeviceOnce once;
  once.Run([](int) {
    CudaCheck(cudaFuncSetAttribute(AttentionPrefillKernel<D, kSplit>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(PrefillSmemBytes<D, kSplit>())),
              "prefill attention smem attribute");
  });
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((heads + kPfHeads - 1) / kPfHeads));
  AttentionPrefillKernel<D, kSplit><<<grid, kPfThreads, PrefillSmemBytes<D, kSplit>(), s>>>(q, heads, keys, sinks,
                                                                                          softmax_scale, out);
}

template <bool kSplit>
size_t PrefillSmemFor(int64_t d) {
  switch (d) {
    case 64: return PrefillSmemBytes<64, kSplit>();
    case 128: return PrefillSmemBytes<128, kSplit>();
    case 256: return PrefillSmemBytes<256, kSplit>();
    case 512: return PrefillSmemBytes<512, kSplit>();
    default: return 0;
  }
}

template <bool kSplit>
void LaunchPrefillFor(const float* q, int64_t n, int64_t heads, const AttnKeys& keys, const float* sinks,
                      float softmax_scale, float* out, cudaStream_t s) {
  switch (keys.d) {
    case 64: return LaunchPrefill<64, kSplit>(q, n, heads, keys, sinks, softmax_scale, out, s);
    case 128: return LaunchPrefill<128, kSplit>(q, n, heads, keys, sinks, softmax_scale, out, s);
    case 256: return LaunchPrefill<256, kSplit>(q, n, heads, keys, sinks, softmax_scale, out, s);
    case 512: return LaunchPrefill<512, kSplit>(q, n, heads, keys, sinks, softmax_scale, out, s);
    default:
      throw std::runtime_error("cuda AttentionPrefill: head_dim " + std::to_string(keys.d) + " (64, 128, 256 or 512)");
  }
}

}  // namespace

bool AttentionPrefillSupported(int64_t d, bool fp16) {
  const size_t smem = fp16 ? PrefillSmemFor<false>(d) : PrefillSmemFor<true>(d);
  if (smem == 0) return false;
  int dev = 0, optin = 0;
  CudaCheck(cudaGetDevice(&dev), "cudaGetDevice");
  CudaCheck(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
            "cudaDeviceGetAttribute (shared memory per block)");
  return smem <= static_cast<size_t>(optin);
}

void AttentionPrefill(const float* q, int64_t n, int64_t heads, int64_t d, int64_t start, const float* ring,
                      int64_t ring_slots, const float* new_kv, int window, PagedRowsDev entries, int64_t num_entries,
                      int ratio, const int32_t* topk, int64_t topk_cols, const float* sinks, float softmax_scale,
                      bool fp16, float* out, cudaStream_t s) {
  if (n <= 0) return;
  const AttnKeys keys{ring, new_kv, entries, topk, topk_cols, start, num_entries, d, ring_slots, window, ratio};
  if (fp16) LaunchPrefillFor<false>(q, n, heads, keys, sinks, softmax_scale, out, s);
  else LaunchPrefillFor<true>(q, n, heads, keys, sinks, softmax_scale, out, s);
}

}  // namespace dsmesh::cuda_ops
