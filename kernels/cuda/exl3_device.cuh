// Device building blocks shared by the EXL3 kernels: codebooks, per-lane trellis tile decode into
// mma.m16n8k16 B fragments, the 128-point Hadamard on one warp, and the cp.async/mma wrappers.
//
// CPU references for every piece live in kernels/exl3/ (codebook.h, trellis.h, exl3_linear.h); the
// format is docs/exl3-format.md §2-§3. Everything here is header-only device code included by the .cu files.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace dsmesh::exl3cuda {

constexpr int kCb3Inst = 0, kCbMcg = 1, kCbMul1 = 2;
// The decode core's few-rows form (TileGemv::FewRows): 3INST/MCG weights as the MMA's A operand, unpacked
// (MUL1 has no (lo, hi) halves), for at most 8 activation rows.
__host__ __device__ constexpr bool HasFewRowsLoop(int cb) { return cb != kCbMul1; }
__host__ __device__ constexpr bool UsesFewRowsLoop(int cb, int rows) { return HasFewRowsLoop(cb) && rows <= 8; }

// ---------------------------------------------------------------------------------------------------
// Codebooks (§2.5). Two states -> one half2 (low half = first state), which is exactly one B-fragment
// register of mma.m16n8k16.

__device__ __forceinline__ uint32_t Lop3MaskXor(uint32_t x) {
  // (x AND 0x8FFF8FFF) XOR 0x3B603B60 in one instruction (LUT 0x6A = (a & b) ^ c).
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(r) : "r"(x), "n"(0x8FFF8FFF), "n"(0x3B603B60));
  return r;
}

// Two ways to turn the masked products x0, x1 (fp16 halves lo, hi each) into half2(lo0 + hi0, lo1 + hi1):
//  A: two PRMTs gather (lo0, lo1) and (hi0, hi1), one HADD2 adds them: 2 ALU-pipe + 1 FMA-pipe ops.
//  B: one HADD2 per product with .H0_H0/.H1_H1 operand selectors gives (v, v), one PRMT packs the pair:
//     1 ALU-pipe + 2 FMA-pipe ops.
// Mixing them keeps the integer (ALU) and FMA pipes about equally busy (see docs/cuda-kernels.md).
template <int CB, bool kPackAfterAdd>
__device__ __forceinline__ uint32_t DecodePair(uint32_t s0, uint32_t s1) {
  if constexpr (CB == kCbMul1) {
    const uint32_t x0 = s0 * 0x83DCD12Du, x1 = s1 * 0x83DCD12Du;
    // 0x6400 + byte sum = fp16 bits of 1024 + b; then one fma with k_inv and k_bias.
    const uint32_t b0 = __dp4a(x0, 0x01010101u, 0x6400u), b1 = __dp4a(x1, 0x01010101u, 0x6400u);
    const uint32_t packed = __byte_perm(b0, b1, 0x5410);
    const half2 h = *reinterpret_cast<const half2*>(&packed);
    const half2 r = __hfma2(h, __halves2half2(__ushort_as_half(0x1EEE), __ushort_as_half(0x1EEE)),
                            __halves2half2(__ushort_as_half(0xC931), __ushort_as_half(0xC931)));
    return *reinterpret_cast<const uint32_t*>(&r);
  } else {
    uint32_t x0, x1;
    if constexpr (CB == kCb3Inst) {
      x0 = s0 * 89226354u + 64248484u;
      x1 = s1 * 89226354u + 64248484u;
    } else {
      x0 = s0 * 0xCBAC1FEDu;
      x1 = s1 * 0xCBAC1FEDu;
    }
    x0 = Lop3MaskXor(x0);
    x1 = Lop3MaskXor(x1);
    if constexpr (kPackAfterAdd) {
      const half2 h0 = *reinterpret_cast<const half2*>(&x0), h1 = *reinterpret_cast<const half2*>(&x1);
      const half2 v0 = __hadd2(__low2half2(h0), __high2half2(h0));
      const half2 v1 = __hadd2(__low2half2(h1), __high2half2(h1));
      const half2 r = __lows2half2(v0, v1);
      return *reinterpret_cast<const uint32_t*>(&r);
    } else {
      const uint32_t lo = __byte_perm(x0, x1, 0x5410), hi = __byte_perm(x0, x1, 0x7632);
      const half2 r = __hadd2(*reinterpret_cast<const half2*>(&lo), *reinterpret_cast<const half2*>(&hi));
      return *reinterpret_cast<const uint32_t*>(&r);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Trellis tile decode (§2.2-2.4). A tile is 8K little-endian 32-bit words; lane q owns sequence
// positions 8q..8q+7, whose 16-bit states are windows of the MSB-first stream ending at bits
// (8q+1)K .. (8q+8)K. Those bits start at b0 = (8q+1)K - 16 (mod 256K, tail-biting) and span 7K+16 <= 72
// bits, always inside three consecutive words w[i0], w[i0+1], w[i0+2] (mod 8K). Per lane, i0..i2 and the
// bit offset r0 = b0 mod 32 are constants; after shifting the three words left by r0 every state sits
// at a compile-time offset tK.

struct LaneTileGeom {
  int i0, i1, i2;  // word indices within a tile
  int r0;          // bit offset of the first window inside word i0
};

template <int K>
__device__ __forceinline__ LaneTileGeom MakeLaneTileGeom(int lane) {
  const int words = 8 * K;
  const int b0 = (8 * lane * K + K - 16 + 256 * K) % (256 * K);
  LaneTileGeom g;
  g.i0 = b0 >> 5;
  g.r0 = b0 & 31;
  g.i1 = g.i0 + 1 >= words ? g.i0 + 1 - words : g.i0 + 1;
  g.i2 = g.i0 + 2 >= words ? g.i0 + 2 - words : g.i0 + 2;
  return g;
}

// Whether some lane's 7K + 16 bits reach into its third word w[i2] (K >= 5). For K <= 4 every lane's
// bits end within w[i0], w[i1] (r0 + 7K + 16 <= 64), so LaneStates does not load w[i2] at all.
template <int K>
__host__ __device__ constexpr bool LaneNeedsThirdWord() {
  for (int lane = 0; lane < 32; ++lane) {
    const int b0 = (8 * lane * K + K - 16 + 256 * K) % (256 * K);
    if ((b0 & 31) + 7 * K + 16 > 64) return true;
  }
  return false;
}
static_assert(!LaneNeedsThirdWord<1>() && !LaneNeedsThirdWord<2>() && !LaneNeedsThirdWord<3>() &&
                  !LaneNeedsThirdWord<4>() && LaneNeedsThirdWord<5>() && LaneNeedsThirdWord<8>(),
              "lane geometry (docs/cuda-kernels.md v18): two words up to K = 4");

// The 32-bit word holding stream bits [B, B + 32) of the normalized stream A:B:C (B compile-time).
template <int B>
__device__ __forceinline__ uint32_t WordAt(uint32_t a, uint32_t b, uint32_t c) {
  if constexpr (B == 0) return a;
  else if constexpr (B < 32) return __funnelshift_l(b, a, B);
  else if constexpr (B == 32) return b;
  else if constexpr (B < 64) return __funnelshift_l(c, b, B - 32);
  else return c << (B - 64);
}

// State t of the lane (window at offset tK). States come in segments that share one 32-bit word W
// starting at the segment's first offset B: the state at offset B + jK is (W * 2^(jK)) >> 16, computed
// as a chain of multiplications by mulk = 2^K. The multiplier is opaque to the compiler (it comes from
// a kernel parameter), so the shift runs as an IMAD on the FMA pipe and only the >> 16 uses the integer
// pipe: one integer op per state for extraction instead of shift + mask.
// word_at(integral_constant<O>) returns the 32-bit word of the lane's stream starting at offset O.
template <int K, int T, int B, class WordFn>
__device__ __forceinline__ void StatesFrom(WordFn&& word_at, uint32_t w, uint32_t mulk, uint32_t s[8]) {
  if constexpr (T < 8) {
    constexpr int O = T * K;
    if constexpr (T == 0 || O - B > 16) {
      const uint32_t nw = word_at(std::integral_constant<int, O>{});
      s[T] = nw >> 16;
      StatesFrom<K, T + 1, O>(word_at, nw, mulk, s);
    } else {
      const uint32_t nw = w * mulk;
      s[T] = nw >> 16;
      StatesFrom<K, T + 1, B>(word_at, nw, mulk, s);
    }
  }
}

// The lane's 8 states of one tile. With two words (K <= 4) the first segment's word is w0:w1 shifted
// left by r0 and every later segment's word the high half of that pair shifted by r0 + O: one 64-bit
// funnel shift (SHF.L.U64.HI) each, straight from the loaded words, instead of aligning the second word
// first (the bits past the lane's last state may be anything). Otherwise the three words are aligned
// once (a, b, c) and segment words are funnel shifts of those.
template <int K>
__device__ __forceinline__ void LaneStates(const uint32_t* tile, const LaneTileGeom& g, uint32_t mulk, uint32_t s[8]) {
  const uint32_t w0 = tile[g.i0], w1 = tile[g.i1];
  if constexpr (!LaneNeedsThirdWord<K>()) {
    const uint64_t pair = (uint64_t)w0 << 32 | w1;
    StatesFrom<K, 0, 0>(
        [&](auto o) {
          constexpr int O = decltype(o)::value;
          if constexpr (O == 0) return __funnelshift_l(w1, w0, g.r0);
          else return (uint32_t)((pair << (g.r0 + O)) >> 32);
        },
        0u, mulk, s);
  } else {
    const uint32_t w2 = tile[g.i2];
    const uint32_t a = __funnelshift_l(w1, w0, g.r0);
    const uint32_t b = __funnelshift_l(w2, w1, g.r0);
    const uint32_t c = w2 << g.r0;  // only needed for K >= 7
    StatesFrom<K, 0, 0>([&](auto o) { return WordAt<decltype(o)::value>(a, b, c); }, 0u, mulk, s);
  }
}

// Decodes this lane's 8 weights of one tile (words in shared or global memory) into four half2
// registers: frag[0], frag[1] = B fragment (b0, b1) of tile columns 0-7; frag[2], frag[3] = columns
// 8-15. mulk must equal 1 << K but come from a runtime value (see StatesFrom).
template <int K, int CB>
__device__ __forceinline__ void DecodeTileLane(const uint32_t* tile, const LaneTileGeom& g, uint32_t mulk,
                                               uint32_t frag[4]) {
  uint32_t s[8];
  LaneStates<K>(tile, g, mulk, s);
  frag[0] = DecodePair<CB, false>(s[0], s[1]);
  frag[1] = DecodePair<CB, true>(s[2], s[3]);
  frag[2] = DecodePair<CB, false>(s[4], s[5]);
  frag[3] = DecodePair<CB, true>(s[6], s[7]);
}

// The decode without the final fp16 add: for 3INST and MCG a weight is fp16(lo) + fp16(hi), the two
// halves of one masked product. DecodeTileLaneUnpacked returns the masked products themselves, one
// half2 (lo, hi) per weight, for an MMA whose k dimension is doubled: weight k contributes x*lo + x*hi
// (summed in fp32 by the tensor core, i.e. without the fp16 rounding of lo + hi that Ŵ has). w[t] is
// the lane's weight t (t = 0..3: column n = lane / 4, k = 2j, 2j + 1, 2j + 8, 2j + 9 with j = lane % 4;
// t = 4..7: the same k at column n + 8). TileGemv's few-rows loop builds the matching operands.
template <int K, int CB>
__device__ __forceinline__ void DecodeTileLaneUnpacked(const uint32_t* tile, const LaneTileGeom& g, uint32_t mulk,
                                                       uint32_t w[8]) {
  static_assert(CB == kCb3Inst || CB == kCbMcg, "MUL1 has no (lo, hi) form");
  uint32_t s[8];
  LaneStates<K>(tile, g, mulk, s);
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    const uint32_t p = CB == kCb3Inst ? s[t] * 89226354u + 64248484u : s[t] * 0xCBAC1FEDu;
    w[t] = Lop3MaskXor(p);
  }
}

// (v, v) from the low or high half of a half2: the doubled-k MMA needs each activation in both the
// lo and the hi slot of its weight.
__device__ __forceinline__ uint32_t BroadcastLow(uint32_t v) { return __byte_perm(v, v, 0x1010); }
__device__ __forceinline__ uint32_t BroadcastHigh(uint32_t v) { return __byte_perm(v, v, 0x3232); }

// ---------------------------------------------------------------------------------------------------
// Tensor-core MMA: C (16x8, fp32) += A (16x16 fp16, row) * B (16x8 fp16, col).

__device__ __forceinline__ void Mma16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---------------------------------------------------------------------------------------------------
// Cross-CTA publication and compile-time K.

// Adds 1 to *counter with acq_rel semantics at GPU scope; returns the old value. After a barrier, one
// thread's call publishes the whole CTA's earlier global writes (release, cumulative through the
// barrier) and orders the caller's later reads after every earlier release on the same counter
// (acquire): the split-K arrivals need no fences.
__device__ __forceinline__ int ArriveAcqRelGpu(int* counter) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  return old;
}

// fn(std::integral_constant<int, K>{}) for a runtime K in 1..8 (one instantiation per K); `otherwise`
// for any other K.
template <class R, class Fn>
__host__ R DispatchK(int K, R otherwise, Fn&& fn) {
  switch (K) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 5: return fn(std::integral_constant<int, 5>{});
    case 6: return fn(std::integral_constant<int, 6>{});
    case 7: return fn(std::integral_constant<int, 7>{});
    case 8: return fn(std::integral_constant<int, 8>{});
    default: return otherwise;
  }
}

// ---------------------------------------------------------------------------------------------------
// Split-K partial sums.

// add(load(s)) for s = first, first + stride, ... < end, in that order. Each batch of kBatch loads is
// issued before any add: nvcc does not turn a loop with a runtime stride into independent loads
// (`#pragma unroll` on it leaves an exit test after every load, so each L2 round trip waited for the
// previous one). The loads are unconditional (past the end they repeat the last index): the version
// with conditional loads spilled 5-10x more in the MoE kernel (ptxas -v) and measured slower.
template <class T, int kBatch = 8, class Load, class Add>
__device__ __forceinline__ void StridedSum(int first, int stride, int end, Load&& load, Add&& add) {
  for (int s0 = first; s0 < end; s0 += kBatch * stride) {
    T v[kBatch];
#pragma unroll
    for (int q = 0; q < kBatch; ++q) v[q] = load(min(s0 + q * stride, end - 1));
#pragma unroll
    for (int q = 0; q < kBatch; ++q)
      if (s0 + q * stride < end) add(v[q]);
  }
}

__device__ __forceinline__ void AddTo(float4& a, const float4& b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
}

// ---------------------------------------------------------------------------------------------------
// cp.async (global -> shared, 16 bytes, L2 only: trellis words are read exactly once).

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
// The same copy issued only where `pred` holds, by a predicated cp.async (an `if` around CpAsync16
// inside the decode loops measured 2-5% slower at K = 3, the one anchor K with a partial copy round).
__device__ __forceinline__ void CpAsync16If(bool pred, void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p cp.async.cg.shared.global [%0], [%1], 16;\n}\n" ::"r"(s),
      "l"(gmem), "r"((int)pred));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---------------------------------------------------------------------------------------------------
// 128-point Hadamard on one warp (§3.3): lane l holds elements 4l..4l+3. Butterflies in fp32: strides
// 1 and 2 inside the lane, 4..64 across lanes (XOR shuffles 1..16); lower index gets a+b, upper a-b.
// The caller applies the scale 0.088388347648f (1/sqrt(128) as exllamav3 spells it).

constexpr float kHadScale = 0.088388347648f;

__device__ __forceinline__ void Hadamard128Warp(float v[4], int lane) {
  float t0 = v[0] + v[1], t1 = v[0] - v[1], t2 = v[2] + v[3], t3 = v[2] - v[3];
  v[0] = t0 + t2;
  v[2] = t0 - t2;
  v[1] = t1 + t3;
  v[3] = t1 - t3;
#pragma unroll
  for (int mask = 1; mask < 32; mask <<= 1) {
    const bool upper = lane & mask;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float p = __shfl_xor_sync(0xFFFFFFFFu, v[i], mask);
      v[i] = upper ? p - v[i] : v[i] + p;
    }
  }
}

// Hadamard of the warp's 128 values (4 per lane) in fp32, scaled by 1/sqrt(128), rounded to fp16: the
// lane's 4 halves packed in a uint2.
__device__ __forceinline__ uint2 Hadamard128ToHalf4(float v[4], int lane) {
  Hadamard128Warp(v, lane);
  const half2 o0 = __floats2half2_rn(v[0] * kHadScale, v[1] * kHadScale);
  const half2 o1 = __floats2half2_rn(v[2] * kHadScale, v[3] * kHadScale);
  uint2 out;
  out.x = *reinterpret_cast<const uint32_t*>(&o0);
  out.y = *reinterpret_cast<const uint32_t*>(&o1);
  return out;
}

// Input side: fp16 x * fp16 suh (one __hmul2 rounding), Hadamard in fp32, scale, round to fp16.
// Writes 4 fp16 values (8 bytes) to dst (8-byte aligned).
__device__ __forceinline__ void InputHadamard128Regs(uint2 xr, uint2 sr, __half* dst4, int lane) {
  const half2 p0 = __hmul2(*reinterpret_cast<const half2*>(&xr.x), *reinterpret_cast<const half2*>(&sr.x));
  const half2 p1 = __hmul2(*reinterpret_cast<const half2*>(&xr.y), *reinterpret_cast<const half2*>(&sr.y));
  float v[4] = {__low2float(p0), __high2float(p0), __low2float(p1), __high2float(p1)};
  *reinterpret_cast<uint2*>(dst4) = Hadamard128ToHalf4(v, lane);
}
__device__ __forceinline__ void InputHadamard128(const __half* x4, const __half* suh4, __half* dst4, int lane) {
  InputHadamard128Regs(*reinterpret_cast<const uint2*>(x4), *reinterpret_cast<const uint2*>(suh4), dst4, lane);
}

// One input-transform task of a warp: this lane's 4 values of x, suh and the destination.
struct InputTask {
  const __half* x4;
  const __half* suh4;
  __half* dst4;
};
// The warp's tasks first, first + step, ... < count (task(t) -> InputTask), with the x and suh loads of
// 4 tasks issued before any of them is transformed: one L2 round trip per 4 tasks instead of one per
// task (a loop over InputHadamard128 waits for each task's loads before it issues the next's).
template <class TaskFn>
__device__ __forceinline__ void InputHadamardTasks(int first, int step, int count, int lane, TaskFn&& task) {
  constexpr int kBatch = 4;
  if (count <= first + step) {  // at most one task: nothing to overlap
    if (first < count) {
      const InputTask it = task(first);
      InputHadamard128(it.x4, it.suh4, it.dst4, lane);
    }
    return;
  }
  for (int t0 = first; t0 < count; t0 += kBatch * step) {
    uint2 xr[kBatch], sr[kBatch];
#pragma unroll
    for (int q = 0; q < kBatch; ++q) {  // unconditional loads (see StridedSum): past the end, the last task
      const InputTask it = task(min(t0 + q * step, count - 1));
      xr[q] = *reinterpret_cast<const uint2*>(it.x4);
      sr[q] = *reinterpret_cast<const uint2*>(it.suh4);
    }
#pragma unroll
    for (int q = 0; q < kBatch; ++q)
      if (t0 + q * step < count) InputHadamard128Regs(xr[q], sr[q], task(t0 + q * step).dst4, lane);
  }
}

// The prefill GEMM's input transform as extra CTAs of a decode launch: warp number `warp_index` (over
// those CTAs) computes xh = Hk(x * suh) for one (row, 128-block) of the m x k activations, if it has one.
__device__ __forceinline__ void PrefillInputTransformWarp(const uint16_t* x, const uint16_t* suh, uint16_t* xh, int m,
                                                          int k, int64_t warp_index, int lane) {
  const int kb = k >> 7;
  if (warp_index >= (int64_t)m * kb) return;
  const int64_t row = warp_index / kb, b = warp_index - row * kb;
  const int64_t ofs = row * k + b * 128 + lane * 4;
  InputHadamard128(reinterpret_cast<const __half*>(x) + ofs, reinterpret_cast<const __half*>(suh) + b * 128 + lane * 4,
                   reinterpret_cast<__half*>(xh) + ofs, lane);
}

// Same, for fp32 input already multiplied by nothing: v holds the lane's 4 fp32 values; applies fp16
// suh (as float) first. Used for the intermediate activation of the routed experts.
__device__ __forceinline__ void InputHadamard128F32(float v[4], const __half* suh4, __half* dst4, int lane) {
  const uint2 sr = *reinterpret_cast<const uint2*>(suh4);
  const half2 s0 = *reinterpret_cast<const half2*>(&sr.x), s1 = *reinterpret_cast<const half2*>(&sr.y);
  // Same rounding as the fp16 path: the activation is rounded to fp16 first, then one fp16 multiply.
  const half2 a0 = __floats2half2_rn(v[0], v[1]), a1 = __floats2half2_rn(v[2], v[3]);
  const half2 p0 = __hmul2(a0, s0), p1 = __hmul2(a1, s1);
  float w[4] = {__low2float(p0), __high2float(p0), __low2float(p1), __high2float(p1)};
  *reinterpret_cast<uint2*>(dst4) = Hadamard128ToHalf4(w, lane);
}

// Output side (exllamav3 had_ff): fp32 in, Hadamard, scale, times float(svh), fp32 out, in place.
__device__ __forceinline__ void OutputHadamard128Regs(float v[4], uint2 sr, int lane) {
  Hadamard128Warp(v, lane);
  const half2 s0 = *reinterpret_cast<const half2*>(&sr.x), s1 = *reinterpret_cast<const half2*>(&sr.y);
  v[0] = v[0] * kHadScale * __low2float(s0);
  v[1] = v[1] * kHadScale * __high2float(s0);
  v[2] = v[2] * kHadScale * __low2float(s1);
  v[3] = v[3] * kHadScale * __high2float(s1);
}
__device__ __forceinline__ void OutputHadamard128(float v[4], const __half* svh4, int lane) {
  OutputHadamard128Regs(v, *reinterpret_cast<const uint2*>(svh4), lane);
}

// The input side for up to 16 rows of one 128-block at once, on tensor cores: x' = (x * suh) H128 / sqrt(128)
// as an MMA with B = H128, H128[k][n] = (-1)^popc(k & n). Splitting k = 16 kt + kl and n = 16 (nt / 2) +
// (8 (nt % 2) + nl), the 16x8 block (kt, nt) of H128 is (-1)^popc(kt & (nt / 2)) times one of two fixed
// 16x8 blocks of H16, so four registers (those two and their negations) serve all 128 MMAs, the sign
// being a compile-time choice in the unrolled loops. One warp does in ~400 instructions what the
// shuffle version (InputHadamard128) does in ~110 per row. Rows >= m read row m - 1 and are not stored.
// x: row 0 of the block (row stride x_stride); suh: the block's 128 scales; dst: row 0 (stride dst_stride).
// The fp32 sums may differ from the butterflies' in the last bits (different order), then round to fp16.
__device__ __forceinline__ constexpr bool Parity(int v) { return (__builtin_popcount(v) & 1) != 0; }

__device__ __forceinline__ void InputHadamard128Rows16Mma(const __half* x, int64_t x_stride, int m, const __half* suh,
                                                          __half* dst, int dst_stride, int lane) {
  const int row = lane >> 2, kc = (lane & 3) * 2;
  const __half* x0 = x + (int64_t)min(row, m - 1) * x_stride + kc;
  const __half* x1 = x + (int64_t)min(row + 8, m - 1) * x_stride + kc;
  // B fragments of H16's column halves h = 0, 1: b0 holds rows kc, kc + 1 and b1 rows kc + 8, kc + 9 of
  // column 8 h + row (= lane / 4); fp16 +1 = 0x3C00, -1 = 0xBC00.
  uint32_t pos[2][2], neg[2][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int n = 8 * h + row;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int k0 = kc + 8 * j;
      const uint32_t lo = (__popc(k0 & n) & 1) ? 0xBC00u : 0x3C00u;
      const uint32_t hi = (__popc((k0 + 1) & n) & 1) ? 0xBC00u : 0x3C00u;
      pos[h][j] = lo | (hi << 16);
      neg[h][j] = pos[h][j] ^ 0x80008000u;
    }
  }
  // Quarters of 4 n-tiles (32 columns, 16 accumulators); the A fragments (x * suh, 16 k at a time) are
  // loaded per k-tile, so only 4 of them are live (the later quarters' loads hit L1).
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    float acc[4][4] = {};
#pragma unroll
    for (int kt = 0; kt < 8; ++kt) {
      const half2 s_lo = *reinterpret_cast<const half2*>(suh + kt * 16 + kc);
      const half2 s_hi = *reinterpret_cast<const half2*>(suh + kt * 16 + 8 + kc);
      const half2 v0 = __hmul2(*reinterpret_cast<const half2*>(x0 + kt * 16), s_lo);
      const half2 v1 = __hmul2(*reinterpret_cast<const half2*>(x1 + kt * 16), s_lo);
      const half2 v2 = __hmul2(*reinterpret_cast<const half2*>(x0 + kt * 16 + 8), s_hi);
      const half2 v3 = __hmul2(*reinterpret_cast<const half2*>(x1 + kt * 16 + 8), s_hi);
      const uint32_t a0 = *reinterpret_cast<const uint32_t*>(&v0), a1 = *reinterpret_cast<const uint32_t*>(&v1);
      const uint32_t a2 = *reinterpret_cast<const uint32_t*>(&v2), a3 = *reinterpret_cast<const uint32_t*>(&v3);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int nt = 4 * c + q;
        const uint32_t* bf = Parity(kt & (nt >> 1)) ? neg[nt & 1] : pos[nt & 1];
        Mma16816(acc[q], a0, a1, a2, a3, bf[0], bf[1]);
      }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int col = (4 * c + q) * 8 + kc;
      if (row < m)
        *reinterpret_cast<half2*>(dst + row * dst_stride + col) = __floats2half2_rn(acc[q][0] * kHadScale, acc[q][1] * kHadScale);
      if (row + 8 < m)
        *reinterpret_cast<half2*>(dst + (row + 8) * dst_stride + col) =
            __floats2half2_rn(acc[q][2] * kHadScale, acc[q][3] * kHadScale);
    }
  }
}

}  // namespace dsmesh::exl3cuda
