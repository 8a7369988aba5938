// The small-m decode core shared by the dense GEMV and the routed-expert kernel.
//
// One CTA (256 threads = 8 warps) multiplies up to 16 rows of activations (fp16, already multiplied by
// suh and Hadamard-transformed, in shared memory) by a block of KT x (WN * 8) EXL3 16x16 tiles streamed
// from global memory. The warps form WN column groups of 8 tiles (128 output columns) times WK = 8 / WN
// k-splits. Each pipeline stage brings WK k-rows x WN groups x 8 tiles = 64 tiles global -> shared with
// cp.async, each warp copying exactly the 8 tiles it will decode into its own slice of the ring (so
// stages are published with cp.async.wait_group + __syncwarp, never a CTA barrier); the warp then
// decodes its tiles straight into mma.m16n8k16 B fragments (the decoded weights never touch memory)
// and accumulates in fp32. Rows beyond R cost nothing extra (their A rows repeat row R - 1 and their
// outputs are dropped): R = 1, 2, 4, 8 or 16 all take one pass over the weights.
//
// After the loop the k-split partial sums are reduced in a fixed order through shared memory
// (deterministic, ReduceOnePass), leaving out[g][row][col] (fp32, 128 columns per group) for the
// caller's epilogue.
#pragma once

#include "kernels/cuda/exl3_device.cuh"
#include "kernels/cuda/exl3_gemv_params.h"

namespace dsmesh::exl3cuda {

constexpr int kThreads = 256;
constexpr int kMaxRowsPerPass = 16;


template <int K, int CB, int WN>
struct TileGemv {
  static constexpr int WK = 8 / WN;
  static constexpr int kStages = StagesForK(K);
  static constexpr int kTileBytes = 32 * K;
  static constexpr int kStageBytes = StageBytes(K);
  static_assert(WN * WK == 8 && WK >= 2, "8 warps, at least two per group");

  struct Source {
    const uint8_t* base[WN];  // tile (k-tile 0 of the range, first n-tile of group g)
    int64_t row_stride;       // bytes between consecutive k-tiles (n/16 tiles * 32K bytes)
  };

  // Warp roles. Group g (8 n-tiles = 128 columns) is served by WK warps: two column halves (4 n-tiles
  // each) times WKP = WK / 2 k-splits; per stage a warp takes k-rows j and j + WKP of its group, so it
  // still decodes 8 tiles per stage while holding only 4 tiles' accumulators (32 registers, which is
  // what lets three CTAs share an SM).
  static constexpr int WKP = WK / 2;
  static constexpr int kAccTiles = 4;
  struct Role {
    int g, h, j;  // group, column half, k-split
  };
  __device__ static Role RoleOf(int warp) {
    Role r;
    r.g = warp / WK;
    const int w = warp - r.g * WK;
    r.h = w / WKP;
    r.j = w - r.h * WKP;
    return r;
  }

  // Each warp streams exactly the 8 tiles it decodes (two runs of 4 consecutive tiles, one per k-row)
  // into its own slice of the ring, so the main loop needs no CTA-wide barrier: cp.async.wait_group +
  // __syncwarp publish a stage to the warp, and warps drift freely (one waiting on memory while another
  // decodes). The ring holds kStages slots of kWarpStageBytes per warp.
  static constexpr int kRunBytes = 4 * kTileBytes;       // 4 consecutive n-tiles of one k-row
  static constexpr int kWarpStageBytes = 2 * kRunBytes;  // 8 tiles
  static constexpr int kWarpRingBytes = kStages * kWarpStageBytes;
  static_assert(8 * kWarpRingBytes == kStages * kStageBytes, "the warp slices tile the ring");

  // A lane's share of its warp's cp.async copies: chunk c = lane + 32 i (16 bytes each) of the warp's
  // 8 tiles per stage lands at byte 16 c of the warp's slot and comes from src_off[i] bytes past the
  // stage's first run (k-row j) in global memory; `next` is the stage the next Load brings. Offsets and
  // pointer are computed once, so a stage costs one 64-bit add and kLoads copies per lane.
  static constexpr int kChunks = kWarpStageBytes / 16;
  static constexpr int kLoads = (kChunks + 31) / 32;
  struct LaneLoads {
    const uint8_t* next;
    int64_t stage_stride;  // bytes between consecutive stages (WK k-rows)
    int src_off[kLoads];
  };
  __device__ static LaneLoads LaneLoadsOf(const Source& src, const Role& role, int lane) {
    LaneLoads l;
    l.next = src.base[role.g] + (int64_t)role.j * src.row_stride + role.h * kRunBytes;
    l.stage_stride = (int64_t)WK * src.row_stride;
    constexpr int kChunksPerRun = kRunBytes / 16;
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int c = lane + 32 * i, kk = c / kChunksPerRun, off = c - kk * kChunksPerRun;
      l.src_off[i] = static_cast<int>(kk * WKP * src.row_stride) + off * 16;
    }
    return l;
  }
  // Copies the next stage into `slot` (this warp's part of the ring) and advances.
  __device__ static void Load(LaneLoads& l, uint8_t* slot, int lane) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      if (kChunks % 32 == 0 || i + 1 < kLoads)
        CpAsync16(slot + (lane + 32 * i) * 16, l.next + l.src_off[i]);
      else  // the last, partial round of copies (odd K): one predicated copy instead of an `if`
        CpAsync16If(lane + 32 * i < kChunks, slot + (lane + 32 * i) * 16, l.next + l.src_off[i]);
    }
    l.next += l.stage_stride;
  }

  // Starts the cp.async pipeline (the first kStages - 1 stages of every warp). Call before preparing
  // the activations so the first trellis bytes are already in flight.
  __device__ static void Prologue(const Source& src, int KT, uint8_t* ring) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    LaneLoads l = LaneLoadsOf(src, RoleOf(warp), lane);
    uint8_t* mine = ring + warp * kWarpRingBytes;
    const int num_stages = KT / WK;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < num_stages) Load(l, mine + s * kWarpStageBytes, lane);
      CpAsyncCommit();
    }
  }

  // Few rows (R <= 8, 3INST/MCG): the MMA runs transposed, with the decoded weights as its A operand
  // (16 columns n x 16 k, the same registers as the B fragments in another order) and the activations
  // as B (k x 8 rows), so one MMA covers a whole tile instead of one n8 half; and unpacked, with the
  // two fp16 halves (lo, hi) of each weight in two k slots (doubled k, the activation repeated in both)
  // so no packing instructions are needed: 2 MMAs per tile as before, ~20% fewer instructions. Its
  // accumulators are acc[t][0] = C of W^T x^T (columns n = lane / 4 and + 8, rows 2 (lane % 4) + {0, 1});
  // acc[t][1] is unused. StoreAccRows knows both layouts.
  __device__ static bool FewRows(int R) { return UsesFewRowsLoop(CB, R); }

  // acc[t][n8][4]: fp32 C fragments of this warp's 4 tiles (two n8 halves each; see FewRows). MainLoop
  // picks the form from R at run time; Loop<kFew> is the same for a caller that knows it at compile time.
  // a[g]: row-major [R][a_stride] fp16 activations of group g, column 0 = first k of the range.
  // KT: number of k-tiles, a multiple of WK. ring: RingBytes(K) of shared memory. With accumulate,
  // adds to acc (a previous k-chunk of the same outputs); otherwise starts from zero.
  // one: the value 1 from a kernel parameter (opaque to the compiler, see DecodeTileLane).
  __device__ static void MainLoop(const Source& src, int KT, const __half* const* a, int a_stride, int R,
                                  uint8_t* ring, float acc[kAccTiles][2][4], uint32_t one, bool accumulate = false) {
    if constexpr (HasFewRowsLoop(CB)) {
      if (FewRows(R)) return Loop<true>(src, KT, a, a_stride, R, ring, acc, one, accumulate);
    }
    Loop<false>(src, KT, a, a_stride, R, ring, acc, one, accumulate);
  }

  template <bool kFew>
  __device__ static void Loop(const Source& src, int KT, const __half* const* a, int a_stride, int R,
                              uint8_t* ring, float acc[kAccTiles][2][4], uint32_t one, bool accumulate) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const Role role = RoleOf(warp);
    const int num_stages = KT / WK;
    if (!accumulate) {
#pragma unroll
      for (int t = 0; t < kAccTiles; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[t][h][i] = 0.f;
    }

    const LaneTileGeom geom = MakeLaneTileGeom<K>(lane);
    const uint32_t mulk = one << K;
    // A fragment rows beyond R read row R - 1 instead of zeros: MMA output row r depends only on A row
    // r, and rows >= R are never stored, so the loads need no branch. (Few rows: the same for the B
    // columns, x row lane / 4.)
    const int arow = lane >> 2, acol = (lane & 3) * 2;
    const __half* a_lo = a[role.g] + min(arow, R - 1) * a_stride + acol;
    const __half* a_hi = a[role.g] + min(arow + 8, R - 1) * a_stride + acol;

    uint8_t* mine = ring + warp * kWarpRingBytes;
    // The prologue issued stages 0 .. kStages - 2; rebuild the lane's copy list past them.
    LaneLoads l = LaneLoadsOf(src, role, lane);
    l.next += (kStages - 1) * l.stage_stride;
    // Stage st sits in slot st % kStages; the copy issued while it is decoded (stage st + kStages - 1)
    // goes into the slot of stage st - 1, which this warp has finished: one slot counter, and the
    // stages that still copy run in a loop of their own, so neither loop tests per stage whether to copy.
    int use_slot = 0, free_slot = kStages - 1;
    __syncthreads();  // the activations written by other warps are visible
    const int copying = num_stages - (kStages - 1);
    int st = 0;
    for (; st < copying; ++st)
      Stage<kFew, true>(st, l, mine, use_slot, free_slot, a_lo, a_hi, role, geom, mulk, lane, acc);
    for (; st < num_stages; ++st)
      Stage<kFew, false>(st, l, mine, use_slot, free_slot, a_lo, a_hi, role, geom, mulk, lane, acc);
    CpAsyncWait<0>();
    __syncthreads();  // ring is free for the reduction
  }

  // One stage of Loop: wait for stage st, optionally issue the copy of stage st + kStages - 1, decode.
  template <bool kFew, bool kCopy>
  __device__ static __forceinline__ void Stage(int st, LaneLoads& l, uint8_t* mine, int& use_slot, int& free_slot,
                                               const __half* a_lo, const __half* a_hi, const Role& role,
                                               const LaneTileGeom& geom, uint32_t mulk, int lane,
                                               float acc[kAccTiles][2][4]) {
    CpAsyncWait<kStages - 2>();
    __syncwarp();  // this warp's stage st has landed for all its lanes; the slot of st - 1 is free
    if constexpr (kCopy) Load(l, mine + free_slot * kWarpStageBytes, lane);
    CpAsyncCommit();
    const uint8_t* stage = mine + use_slot * kWarpStageBytes;
    free_slot = use_slot;
    use_slot = use_slot + 1 == kStages ? 0 : use_slot + 1;
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const int kt = st * WK + role.j + kk * WKP;  // k-tile of the activations
      const uint32_t* tiles = reinterpret_cast<const uint32_t*>(stage + kk * kRunBytes);
      if constexpr (kFew) {
        // B (doubled k x 8 rows): slots (2j, 2j + 1) of the first MMA hold x[k = 2j] twice, slots
        // (2j + 8, 2j + 9) x[2j + 1]; the second MMA the same for k + 8. A: weight (n, k = 2j) in
        // a0, (n + 8, 2j) in a1, (n, 2j + 1) in a2, (n + 8, 2j + 1) in a3 (DecodeTileLaneUnpacked).
        const uint32_t x01 = *reinterpret_cast<const uint32_t*>(a_lo + kt * 16);
        const uint32_t x89 = *reinterpret_cast<const uint32_t*>(a_lo + kt * 16 + 8);
        const uint32_t b0 = BroadcastLow(x01), b1 = BroadcastHigh(x01);
        const uint32_t b2 = BroadcastLow(x89), b3 = BroadcastHigh(x89);
#pragma unroll
        for (int t = 0; t < kAccTiles; ++t) {
          uint32_t w[8];
          DecodeTileLaneUnpacked<K, CB>(tiles + t * (kTileBytes / 4), geom, mulk, w);
          Mma16816(acc[t][0], w[0], w[4], w[1], w[5], b0, b1);
          Mma16816(acc[t][0], w[2], w[6], w[3], w[7], b2, b3);
        }
      } else {
        const uint32_t a0 = *reinterpret_cast<const uint32_t*>(a_lo + kt * 16);
        const uint32_t a2 = *reinterpret_cast<const uint32_t*>(a_lo + kt * 16 + 8);
        const uint32_t a1 = *reinterpret_cast<const uint32_t*>(a_hi + kt * 16);
        const uint32_t a3 = *reinterpret_cast<const uint32_t*>(a_hi + kt * 16 + 8);
#pragma unroll
        for (int t = 0; t < kAccTiles; ++t) {
          uint32_t b[4];
          DecodeTileLane<K, CB>(tiles + t * (kTileBytes / 4), geom, mulk, b);
          Mma16816(acc[t][0], a0, a1, a2, a3, b[0], b[1]);
          Mma16816(acc[t][1], a0, a1, a2, a3, b[2], b[3]);
        }
      }
    }
  }

  // Writes this warp's accumulators (rows < R) to dst[R][64] fp32. Packed layout: lane holds rows
  // lane / 4 (+ 8) and columns 2 (lane % 4) + {0, 1} of each n8 half of its 4 tiles (the mma C layout).
  // Few rows: columns lane / 4 (+ 8) and rows 2 (lane % 4) + {0, 1} of each tile.
  __device__ static void StoreAccRows(const float acc[kAccTiles][2][4], int R, float* dst, int lane) {
    if (FewRows(R)) {
      const int col = lane >> 2, row = (lane & 3) * 2;
#pragma unroll
      for (int t = 0; t < kAccTiles; ++t) {
        const int c = t * 16 + col;
        if (row < R) {
          dst[row * 64 + c] = acc[t][0][0];
          dst[row * 64 + c + 8] = acc[t][0][2];
        }
        if (row + 1 < R) {
          dst[(row + 1) * 64 + c] = acc[t][0][1];
          dst[(row + 1) * 64 + c + 8] = acc[t][0][3];
        }
      }
      return;
    }
    const int row = lane >> 2, col = (lane & 3) * 2;
#pragma unroll
    for (int t = 0; t < kAccTiles; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = t * 16 + h * 8 + col;
        if (row < R) *reinterpret_cast<float2*>(dst + row * 64 + c) = make_float2(acc[t][h][0], acc[t][h][1]);
        if (row + 8 < R)
          *reinterpret_cast<float2*>(dst + (row + 8) * 64 + c) = make_float2(acc[t][h][2], acc[t][h][3]);
      }
  }

  // The same sums in one pass: every warp stores its accumulators (rows < R) to red[warp][R][64], one
  // barrier, then each thread adds the WKP k-split values of its outputs in a fixed tree order
  // ((j0 + j2) + (j1 + j3) for WKP = 4; 2 barriers, where a pairwise tree through shared memory took 5).
  // red: 8 * R * 256 bytes (32 KB at R = 16; the ring). out: [WN][R][128] fp32 shared.
  __device__ static void ReduceOnePass(float acc[kAccTiles][2][4], int R, float* red, float* out) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    StoreAccRows(acc, R, red + warp * R * 64, lane);
    __syncthreads();
    // Output (g, r, c4): columns 4 c4 .. 4 c4 + 3 of group g; warp of (g, half h, split j) = g * WK + h * WKP + j.
    for (int i = tid; i < WN * R * 32; i += kThreads) {
      const int g = i / (R * 32), rem = i - g * R * 32, r = rem >> 5, c4 = rem & 31;
      const int h = c4 >> 4, cc = (c4 & 15) * 4;
      const float* base = red + ((g * WK + h * WKP) * R + r) * 64 + cc;
      float4 v[WKP];
#pragma unroll
      for (int j = 0; j < WKP; ++j) v[j] = *reinterpret_cast<const float4*>(base + j * R * 64);
      float4 sum;
      if constexpr (WKP == 4) {
        sum = make_float4((v[0].x + v[2].x) + (v[1].x + v[3].x), (v[0].y + v[2].y) + (v[1].y + v[3].y),
                          (v[0].z + v[2].z) + (v[1].z + v[3].z), (v[0].w + v[2].w) + (v[1].w + v[3].w));
      } else if constexpr (WKP == 2) {
        sum = make_float4(v[0].x + v[1].x, v[0].y + v[1].y, v[0].z + v[1].z, v[0].w + v[1].w);
      } else {
        sum = v[0];
      }
      *reinterpret_cast<float4*>(out + (g * R + r) * 128 + c4 * 4) = sum;
    }
    __syncthreads();
  }
};

}  // namespace dsmesh::exl3cuda
