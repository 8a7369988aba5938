// The routed-expert kernel: one launch computes a whole MoE layer's routed experts for m <= 24 rows,
//   y[r] = sum over slots k of w[r, k] * down(e)( swiglu( gate(e) x[r], up(e) x[r] ) ),  e = ids[r, k],
// for EXL3 experts (MCG codebook, one K for gate, up and down; both Hadamards of every projection fused).
//
// Work decomposition (the lna2 idea of resident workers taking dynamic tickets, without team barriers):
//   * Route plan. Every CTA builds the same plan in shared memory from ids: a row mask per expert, the
//     active experts ("groups") in ascending id order, and each expert's first "pair" (row, expert)
//     index. No grid-wide barrier is needed to agree on it.
//   * Work items, numbered in dependency order and handed out by one atomic ticket counter:
//       1. gate+up items (group g, 128-column block b of I, k-split s of d): x rows -> suh, Hadamard ->
//          fp16; gate and up decoded in parallel by the two halves of the CTA; fp32 partials to scratch.
//          The last split to finish (arrival counter) sums the splits in fixed order, applies the output
//          Hadamard and svh, clamped SwiGLU, the down suh and input Hadamard: the down projection's fp16
//          input for block b. Then it bumps ready[g].
//       2. down items (group g, 128 output columns c, or 256 when there are items enough): wait until
//          ready[g] == I/128, decode the down block, output Hadamard and svh, fp32 to scratch; bump
//          col_done[c] (and col_done[c + 1]). The item that completes a column (the last group to
//          arrive) gathers it: y[r, c] = sum_k w[r, k] * out[pair(r, k), c] in slot order k = 0..topk-1.
//          (Only a launch without any valid expert has separate gather items, writing zeros.)
//     With few experts (m = 1: 6 experts, fewer down items than CTAs) the launch takes the fused-finish
//     kernel instead: gate/up items only store their partials and bump ready[g]; each down item issues
//     its first trellis stages, waits for all S x I/128 gate/up items of its group and builds its own
//     down input from the partials in shared memory (FinishIntoSharedAct), taking the finishing item,
//     its arrival and the down input's global round trip off the critical path (m1: -1..-8%).
//     A CTA only ever waits for items with smaller tickets, which were taken by CTAs already running and
//     which wait only on smaller tickets still: the launch cannot deadlock, whatever the grid size and
//     whatever else runs on the GPU (two launches on two streams with two scratches are independent).
//   * Every sum has a fixed order and there are no float atomics: results are bitwise reproducible.
//   * The last CTA to leave resets the counters, so the scratch is ready for the next launch (and for
//     CUDA-graph replay) without a memset.
//   * Launched with programmatic dependent launch (pdl_launch.cuh), a CTA waits for the previous kernel
//     (PdlWait) before anything: the plan reads the routing ids, and the first ticket reads the counters
//     the previous launch's last CTA reset. Which weights an item streams depends on the plan, so there
//     is no weight-only prologue to overlap. A CTA triggers the next kernel (PdlTrigger) once it has
//     drawn a ticket past the last item: the next kernel's CTAs then fill the SMs this launch no longer
//     needs while the last items finish.
#include "kernels/cuda/exl3_moe_params.h"
#include "kernels/cuda/exl3_tile_gemv.cuh"
#include "kernels/cuda/pdl_launch.cuh"

namespace dsmesh::exl3cuda {

int MoeSmemBytes(int K) { return RingBytes(K) + kMoeActBytes; }

namespace {

struct MoePlan {
  uint32_t mask[kMoeMaxExperts];       // rows routed to expert e (bit r); sorted launches: their count
  int pair_base[kMoeMaxExperts];       // first pair index of expert e
  int group_expert[kMoeMaxExperts];    // expert id of group g, ascending
  int warp_has[kThreads / 32], warp_cnt[kThreads / 32];
  int ticket, flag;
};

__device__ __forceinline__ int LoadAcquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Thread 0 spins until *counter >= target; the whole CTA then sees everything published before it.
// (The acquire load orders the CTA's later reads after the publisher's release; the barrier extends
// that to every thread of the CTA.)
__device__ void WaitFor(const int* counter, int target) {
  if (threadIdx.x == 0) {
    while (LoadAcquire(counter) < target) __nanosleep(128);
  }
  __syncthreads();
}

// Publishes this CTA's global writes, then adds one to *counter; returns the old value to all threads.
// The barrier orders every thread's writes before thread 0's acq_rel atomic at GPU scope, whose release
// half makes them visible before the count (cumulativity) and whose acquire half lets the caller that
// sees the final count read what the others published. No per-thread fences (as in the GEMV).
__device__ int ArriveAndCount(int* counter, MoePlan& plan) {
  __syncthreads();
  if (threadIdx.x == 0) plan.flag = ArriveAcqRelGpu(counter);
  __syncthreads();
  const int old = plan.flag;
  __syncthreads();
  return old;
}

// Rows routed to expert e, and the row of its j-th pair. A sorted launch (p.sorted: one slot per row,
// rows ordered by expert id) has each expert's rows contiguous from its pair base, and the pair of row r
// is r itself.
__device__ __forceinline__ int RowsOf(const MoeParams& p, const MoePlan& plan, int e) {
  return p.sorted ? static_cast<int>(plan.mask[e]) : __popc(plan.mask[e]);
}
__device__ __forceinline__ int RowOf(const MoeParams& p, uint32_t mask, int pair_base, int j) {
  return p.sorted ? pair_base + j : __fns(mask, 0, j + 1);
}

// Returns the number of active experts (groups); every thread computes the same value.
__device__ int BuildPlan(const MoeParams& p, MoePlan& plan) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e < kMoeMaxExperts; e += kThreads) plan.mask[e] = 0;
  __syncthreads();
  for (int i = tid; i < p.m * p.topk; i += kThreads) {
    const int e = p.ids[i];
    if (e >= 0 && e < p.num_experts) {
      if (p.sorted) {
        atomicAdd(&plan.mask[e], 1u);
      } else {
        atomicOr(&plan.mask[e], 1u << (i / p.topk));
      }
    } else {
      p.control->error = 1;
    }
  }
  __syncthreads();
  // Exclusive scans over experts (one per thread) of "has rows" and "row count".
  const int cnt = RowsOf(p, plan, tid), has = cnt != 0;
  int incl_has = has, incl_cnt = cnt;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int h = __shfl_up_sync(0xFFFFFFFFu, incl_has, off), c = __shfl_up_sync(0xFFFFFFFFu, incl_cnt, off);
    if (lane >= off) {
      incl_has += h;
      incl_cnt += c;
    }
  }
  if (lane == 31) {
    plan.warp_has[warp] = incl_has;
    plan.warp_cnt[warp] = incl_cnt;
  }
  __syncthreads();
  int base_has = 0, base_cnt = 0, total_has = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) {
      base_has += plan.warp_has[w];
      base_cnt += plan.warp_cnt[w];
    }
    total_has += plan.warp_has[w];
  }
  const int group = base_has + incl_has - has;
  plan.pair_base[tid] = base_cnt + incl_cnt - cnt;
  if (has) plan.group_expert[group] = tid;
  __syncthreads();
  return total_has;
}

// Largest number of 128-blocks whose activations for `rows` rows (times `copies` buffers) fit the
// activation region.
__device__ __forceinline__ int ChunkBlocks(int rows, int copies) {
  const int halves = kMoeActBytes / 2 / (rows * copies);
  const int blocks = (halves - 8) / 128;
  return blocks < 1 ? 1 : blocks;
}

// The gate/up outputs of one row and 128-block (the lane's 4 columns, splits summed) to the down
// projection's input: output Hadamards with gate and up svh, clamped SwiGLU in fp32, down suh, input
// Hadamard; the lane's 4 fp16 values.
__device__ __forceinline__ uint2 DownInputFromGateUp(float gv[4], float uv[4], uint2 gsvh, uint2 usvh, uint2 dsuh,
                                                     float L, int lane) {
  OutputHadamard128Regs(gv, gsvh, lane);
  OutputHadamard128Regs(uv, usvh, lane);
  const half2 s0 = *reinterpret_cast<const half2*>(&dsuh.x), s1 = *reinterpret_cast<const half2*>(&dsuh.y);
  const float su[4] = {__low2float(s0), __high2float(s0), __low2float(s1), __high2float(s1)};
  float v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float gj = gv[j], uj = uv[j];
    if (L > 0.f) {
      gj = fminf(gj, L);
      uj = fminf(fmaxf(uj, -L), L);
    }
    const float a = gj / (1.f + expf(-gj)) * uj;  // clamped SwiGLU in fp32
    v[j] = a * su[j];
  }
  return Hadamard128ToHalf4(v, lane);
}

struct GateUpSums {
  float4 g, u;
};

// The G group sums of one task, written by G warps to esum[(task * G + grp) * 2 + {0 gate, 1 up}][lane],
// added in group order into gv and uv (zeroed here).
__device__ __forceinline__ void AddGroupSums(const float4* esum, int task, int G, int lane, float gv[4], float uv[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) gv[j] = uv[j] = 0.f;
  for (int grp = 0; grp < G; ++grp) {
    const float4 a0 = esum[((task * G + grp) * 2 + 0) * 32 + lane], a1 = esum[((task * G + grp) * 2 + 1) * 32 + lane];
    gv[0] += a0.x; gv[1] += a0.y; gv[2] += a0.z; gv[3] += a0.w;
    uv[0] += a1.x; uv[1] += a1.y; uv[2] += a1.z; uv[3] += a1.w;
  }
}

// Sums splits first, first + stride, ... < S of one row's gate/up partials (this lane's 4 columns of one
// 128-block; part points at split 0's gate values), in that order.
__device__ __forceinline__ GateUpSums SumSplits(const float* part, int64_t inter, int first, int stride, int S) {
  GateUpSums acc{make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f)};
  StridedSum<GateUpSums, 4>(
      first, stride, S,
      [&](int s2) {
        return GateUpSums{__ldcg(reinterpret_cast<const float4*>(part + (int64_t)(s2 * 2 + 0) * inter)),
                          __ldcg(reinterpret_cast<const float4*>(part + (int64_t)(s2 * 2 + 1) * inter))};
      },
      [&](const GateUpSums& v) {
        AddTo(acc.g, v.g);
        AddTo(acc.u, v.u);
      });
  return acc;
}

// The gate/up sums of N (row, 128-block) tasks, each over the S splits in a fixed order, handed to
// finish(task, gv, uv); part_of(task) points at the task's split-0 gate values (this lane's 4 columns).
// With fewer tasks than warps, G warps share a task, each summing splits grp, grp + G, ...; the G sums
// then meet in esum ([N * G][2][32] float4, shared) and are added in group order (AddGroupSums).
template <class PartOf, class Finish>
__device__ __forceinline__ void SumSplitsPerTask(int N, int S, int64_t inter, float4* esum, PartOf&& part_of,
                                                 Finish&& finish) {
  constexpr int kWarps = kThreads / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, G = N >= kWarps ? 1 : kWarps / N;
  for (int tg = warp; tg < N * G; tg += kWarps) {
    const int task = tg / G, grp = tg - task * G;
    const GateUpSums sum = SumSplits(part_of(task), inter, grp, G, S);
    if (G == 1) {
      float gv[4] = {sum.g.x, sum.g.y, sum.g.z, sum.g.w}, uv[4] = {sum.u.x, sum.u.y, sum.u.z, sum.u.w};
      finish(task, gv, uv);
    } else {
      esum[(tg * 2 + 0) * 32 + lane] = sum.g;
      esum[(tg * 2 + 1) * 32 + lane] = sum.u;
    }
  }
  if (G > 1) {
    __syncthreads();
    for (int task = warp; task < N; task += kWarps) {
      float gv[4], uv[4];
      AddGroupSums(esum, task, G, lane, gv, uv);
      finish(task, gv, uv);
    }
  }
}

// kFused: the group's down items finish the gate/up sums themselves (FinishIntoSharedAct), so the item
// only stores its partials and counts itself in ready[g].
template <int K, bool kFused>
__device__ void GateUpItem(const MoeParams& p, MoePlan& plan, int t, uint8_t* ring, __half* act) {
  using Core = TileGemv<K, kCbMcg, 2>;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int NB = p.inter >> 7, nblk_d = p.d >> 7, S = p.splits;
  const int g = t / (NB * S), rem = t - g * NB * S, b = rem / S, s = rem - b * S;
  const int e = plan.group_expert[g];
  const uint32_t mask = plan.mask[e];
  const int R = RowsOf(p, plan, e), pb = plan.pair_base[e];
  const int kb0 = s * nblk_d / S, kb1 = (s + 1) * nblk_d / S;
  const int64_t tiles_i = p.inter >> 4;
  const uint8_t* gt = reinterpret_cast<const uint8_t*>(p.gate_trellis[e]);
  const uint8_t* ut = reinterpret_cast<const uint8_t*>(p.up_trellis[e]);
  const __half* gsuh = reinterpret_cast<const __half*>(p.gate_suh[e]);
  const __half* usuh = reinterpret_cast<const __half*>(p.up_suh[e]);
  const __half* x = reinterpret_cast<const __half*>(p.x);
  // The finishing split needs block b's gate svh, up svh and down suh: the last warp stages them in
  // shared memory now (published by the main loop's first barrier), so the finish does not wait for
  // an L2 round trip after the split sums.
  __shared__ uint2 s_scales[3][32];
  if (!kFused && warp == kThreads / 32 - 1) {
    s_scales[0][lane] = *reinterpret_cast<const uint2*>(reinterpret_cast<const __half*>(p.gate_svh[e]) + b * 128 + lane * 4);
    s_scales[1][lane] = *reinterpret_cast<const uint2*>(reinterpret_cast<const __half*>(p.up_svh[e]) + b * 128 + lane * 4);
    s_scales[2][lane] = *reinterpret_cast<const uint2*>(reinterpret_cast<const __half*>(p.down_suh[e]) + b * 128 + lane * 4);
  }

  for (int slab0 = 0; slab0 < R; slab0 += kMaxRowsPerPass) {
    const int Rs = min(kMaxRowsPerPass, R - slab0);
    const int cbk = ChunkBlocks(Rs, 2);
    float acc[Core::kAccTiles][2][4];
    for (int c0 = kb0; c0 < kb1; c0 += cbk) {
      const int nbc = min(cbk, kb1 - c0), astride = nbc * 128 + 8;
      typename Core::Source src;
      src.row_stride = tiles_i * Core::kTileBytes;
      src.base[0] = gt + ((int64_t)c0 * 8 * tiles_i + b * 8) * Core::kTileBytes;
      src.base[1] = ut + ((int64_t)c0 * 8 * tiles_i + b * 8) * Core::kTileBytes;
      Core::Prologue(src, nbc * 8, ring);
      __half* ag = act;
      __half* au = act + Rs * astride;
      InputHadamardTasks(warp, kThreads / 32, Rs * nbc * 2, lane, [&](int task) {
        const int which = task & 1, rr = task >> 1, i = rr / nbc, bb = rr - i * nbc;
        const int row = RowOf(p, mask, pb, slab0 + i);
        const int64_t kofs = (int64_t)(c0 + bb) * 128 + lane * 4;
        return InputTask{x + (int64_t)row * p.d + kofs, (which ? usuh : gsuh) + kofs,
                         (which ? au : ag) + i * astride + bb * 128 + lane * 4};
      });
      const __half* a[2] = {ag, au};
      Core::MainLoop(src, nbc * 8, a, astride, Rs, ring, acc, p.one, c0 != kb0);
    }
    float* out = reinterpret_cast<float*>(act);  // [2][Rs][128]
    Core::ReduceOnePass(acc, Rs, reinterpret_cast<float*>(ring), out);
    for (int i2 = tid; i2 < 2 * Rs * 32; i2 += kThreads) {
      const int w = i2 / (Rs * 32), r2 = i2 - w * Rs * 32, i = r2 >> 5, q = r2 & 31;
      const int64_t pair = pb + slab0 + i;
      float* dst = p.part_gu + ((pair * S + s) * 2 + w) * p.inter + b * 128 + q * 4;
      *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(out + (w * Rs + i) * 128 + q * 4);
    }
    __syncthreads();
  }

  if constexpr (kFused) {
    ArriveAndCount(&p.control->ready[g], plan);
    return;
  }
  if (ArriveAndCount(&p.control->gu_done[g * NB + b], plan) != S - 1) return;

  // Last split of (g, b): finish the gate/up outputs of block b and build the down input.
  const float L = p.swiglu_limit;
  // One task per row: its S splits summed in fixed order, then the down input of block b.
  SumSplitsPerTask(
      R, S, p.inter, reinterpret_cast<float4*>(ring),  // esum: 8 KB of the ring
      [&](int i) { return p.part_gu + (pb + i) * S * 2 * p.inter + b * 128 + lane * 4; },
      [&](int i, float gv[4], float uv[4]) {
        *reinterpret_cast<uint2*>(p.act + (int64_t)(pb + i) * p.inter + b * 128 + lane * 4) =
            DownInputFromGateUp(gv, uv, s_scales[0][lane], s_scales[1][lane], s_scales[2][lane], L, lane);
      });
  ArriveAndCount(&p.control->ready[g], plan);
}

// y[r, c-block] = sum_k w[r, k] * out[pair(r, k), c-block] for every row, in slot order k = 0..topk-1. Run
// by the CTA whose down item completed column block c (the last of the groups to arrive), so nobody
// waits for it and the sum starts as soon as its inputs exist.
__device__ void GatherColumn(const MoeParams& p, const MoePlan& plan, int c) {
  for (int idx = threadIdx.x; idx < p.m * 32; idx += kThreads) {
    const int r = idx >> 5, q = idx & 31;
    // All slots' ids, weights and expert outputs are loaded before the first multiply-add (a loop that
    // adds slot k before loading slot k + 1 waits for 6 x 2 dependent round trips); the adds stay in
    // slot order. (w[k] of unused slots is zeroed although never read: without it ptxas put 56-96 B of
    // spill stores in the down kernels this is inlined into.)
    int64_t pair[kMoeMaxTopK];
    float w[kMoeMaxTopK];
#pragma unroll
    for (int k = 0; k < kMoeMaxTopK; ++k) {
      pair[k] = -1;
      w[k] = 0.f;
      if (k < p.topk) {
        const int e = p.ids[r * p.topk + k];
        w[k] = p.weights[r * p.topk + k];
        if (e >= 0 && e < p.num_experts) pair[k] = plan.pair_base[e] + __popc(plan.mask[e] & ((1u << r) - 1u));
      }
    }
    float4 v[kMoeMaxTopK];
#pragma unroll
    for (int k = 0; k < kMoeMaxTopK; ++k)  // unconditional loads (see StridedSum); pair 0 always exists
      v[k] = __ldcg(reinterpret_cast<const float4*>(p.down_out + max(pair[k], int64_t{0}) * p.d + c * 128 + q * 4));
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < kMoeMaxTopK; ++k) {
      if (pair[k] < 0) continue;
      sum.x = fmaf(w[k], v[k].x, sum.x);
      sum.y = fmaf(w[k], v[k].y, sum.y);
      sum.z = fmaf(w[k], v[k].z, sum.z);
      sum.w = fmaf(w[k], v[k].w, sum.w);
    }
    *reinterpret_cast<float4*>(p.y + (int64_t)r * p.d + c * 128 + q * 4) = sum;
  }
}

// Fused finish (few experts, p.fused_finish): a down item builds its own input chunk. For rows pair0 ..
// pair0 + Rs - 1 and I-blocks c0 .. c0 + nbc - 1: the gate/up partials summed over the S splits in a
// fixed order, then DownInputFromGateUp, as fp16 into act[i * astride + bb * 128 + column]. Every down
// item of the group repeats this (a few KB of L2 reads); in exchange nothing waits for a finishing
// gate/up item, its arrival, a global store and reload of the down input. With fewer (row, block) tasks
// than warps, G warps share a task, each summing splits grp, grp + G, ..., added in group order through
// the end of the activation region (the chunk itself is small then).
__device__ void FinishIntoSharedAct(const MoeParams& p, int e, int64_t pair0, int Rs, int c0, int nbc, int astride,
                                    __half* act) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x & 31, S = p.splits;
  const float L = p.swiglu_limit;
  const uint2* gsvh = reinterpret_cast<const uint2*>(p.gate_svh[e]);
  const uint2* usvh = reinterpret_cast<const uint2*>(p.up_svh[e]);
  const uint2* dsuh = reinterpret_cast<const uint2*>(p.down_suh[e]);
  float4* esum = reinterpret_cast<float4*>(reinterpret_cast<uint8_t*>(act) + kMoeActBytes) - kWarps * 2 * 32;
  SumSplitsPerTask(
      Rs * nbc, S, p.inter, esum,
      [&](int task) {
        const int i = task / nbc, bb = task - i * nbc;
        return p.part_gu + (pair0 + i) * S * 2 * p.inter + (c0 + bb) * 128 + lane * 4;
      },
      [&](int task, float gv[4], float uv[4]) {
        const int i = task / nbc, bb = task - i * nbc, q = (c0 + bb) * 32 + lane;
        *reinterpret_cast<uint2*>(act + i * astride + bb * 128 + lane * 4) =
            DownInputFromGateUp(gv, uv, __ldg(gsvh + q), __ldg(usvh + q), __ldg(dsuh + q), L, lane);
      });
}

// Down item t: group g, WN adjacent 128-column blocks c .. c + WN - 1 of d. WN = 2 when there are
// items enough (p.down_wn, chosen on the host): each warp then decodes twice the tiles per
// item (4 k-splits of 128 columns instead of 8), so the per-item costs (pipeline fill, the down input
// copy, the waits and barriers of the item boundary) are paid half as often per weight.
// kFused: the item finishes its group's gate/up sums itself (FinishIntoSharedAct) instead of copying
// the down input that a finishing gate/up item stored.
template <int K, int WN, bool kFused>
__device__ void DownItem(const MoeParams& p, MoePlan& plan, int num_groups, int t, uint8_t* ring, __half* act) {
  using Core = TileGemv<K, kCbMcg, WN>;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int NB = p.inter >> 7, NCW = (p.d >> 7) / WN;
  const int g = t / NCW, c = (t - g * NCW) * WN;
  const int e = plan.group_expert[g];
  // The column blocks' down svh, staged in shared memory before the wait (as in GateUpItem).
  __shared__ uint2 s_dsvh[WN][32];
  if (warp >= kThreads / 32 - WN)
    s_dsvh[warp - (kThreads / 32 - WN)][lane] = *reinterpret_cast<const uint2*>(
        reinterpret_cast<const __half*>(p.down_svh[e]) + (c + warp - (kThreads / 32 - WN)) * 128 + lane * 4);
  if (!kFused) WaitFor(&p.control->ready[g], NB);
  const int R = RowsOf(p, plan, e), pb = plan.pair_base[e];
  const int64_t tiles_d = p.d >> 4;
  const uint8_t* dt = reinterpret_cast<const uint8_t*>(p.down_trellis[e]);

  for (int slab0 = 0; slab0 < R; slab0 += kMaxRowsPerPass) {
    const int Rs = min(kMaxRowsPerPass, R - slab0);
    const int cbk = ChunkBlocks(Rs, 1);
    float acc[Core::kAccTiles][2][4];
    for (int c0 = 0; c0 < NB; c0 += cbk) {
      const int nbc = min(cbk, NB - c0), kc = nbc * 128, astride = kc + 8;
      typename Core::Source src;
      src.row_stride = tiles_d * Core::kTileBytes;
#pragma unroll
      for (int w = 0; w < WN; ++w) src.base[w] = dt + ((int64_t)c0 * 8 * tiles_d + (c + w) * 8) * Core::kTileBytes;
      Core::Prologue(src, nbc * 8, ring);
      if constexpr (kFused) {
        // The weights do not depend on the gate/up results: the first chunk's trellis is in flight
        // before the wait for all S x NB gate/up items of the group.
        if (slab0 == 0 && c0 == 0) WaitFor(&p.control->ready[g], NB * p.splits);
        FinishIntoSharedAct(p, e, pb + slab0, Rs, c0, nbc, astride, act);
      } else {
        const int vecs = kc / 8;
        // 4 loads in flight per thread before the stores (a plain copy loop waits for each load);
        // unconditional loads, see StridedSum.
        constexpr int kBatch = 4;
        for (int idx0 = tid; idx0 < Rs * vecs; idx0 += kBatch * kThreads) {
          uint4 v[kBatch];
#pragma unroll
          for (int q2 = 0; q2 < kBatch; ++q2) {
            const int idx = min(idx0 + q2 * kThreads, Rs * vecs - 1), i = idx / vecs, q = idx - i * vecs;
            v[q2] = __ldcg(reinterpret_cast<const uint4*>(p.act + (pb + slab0 + i) * p.inter + c0 * 128 + q * 8));
          }
#pragma unroll
          for (int q2 = 0; q2 < kBatch; ++q2) {
            const int idx = idx0 + q2 * kThreads, i = idx / vecs, q = idx - i * vecs;
            if (idx < Rs * vecs) *reinterpret_cast<uint4*>(act + i * astride + q * 8) = v[q2];
          }
        }
      }
      const __half* a[WN];
#pragma unroll
      for (int w = 0; w < WN; ++w) a[w] = act;  // every column group multiplies the same down input
      Core::MainLoop(src, nbc * 8, a, astride, Rs, ring, acc, p.one, c0 != 0);
    }
    float* out = reinterpret_cast<float*>(act);  // [WN][Rs][128]
    Core::ReduceOnePass(acc, Rs, reinterpret_cast<float*>(ring), out);
#pragma unroll
    for (int w = 0; w < WN; ++w)
      for (int i = warp; i < Rs; i += kThreads / 32) {
        const float4 o = *reinterpret_cast<const float4*>(out + (w * Rs + i) * 128 + lane * 4);
        float v[4] = {o.x, o.y, o.z, o.w};
        OutputHadamard128(v, reinterpret_cast<const __half*>(&s_dsvh[w][lane]), lane);
        const int64_t pair = pb + slab0 + i;
        if (p.sorted) {  // pair == row, one slot: the row's output is its only term
          const float wt = p.weights[pair];
          *reinterpret_cast<float4*>(p.y + pair * p.d + (c + w) * 128 + lane * 4) =
              make_float4(wt * v[0], wt * v[1], wt * v[2], wt * v[3]);
        } else {
          *reinterpret_cast<float4*>(p.down_out + pair * p.d + (c + w) * 128 + lane * 4) =
              make_float4(v[0], v[1], v[2], v[3]);
        }
      }
    __syncthreads();
  }
  if (p.sorted) return;  // no gather: rows of ids out of range keep y as it was (the caller skips them)
#pragma unroll
  for (int w = 0; w < WN; ++w)
    if (ArriveAndCount(&p.control->col_done[c + w], plan) == num_groups - 1) GatherColumn(p, plan, c + w);
}

// WND: 128-column blocks per down item (1 or 2, p.down_wn); one instantiation each, so that the
// narrow kernel keeps its own register allocation (both item shapes in one kernel: m1 +2..5%).
template <int K, int WND, bool kFused>
__global__ void __launch_bounds__(kThreads, 2) Exl3MoeKernel(const MoeParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ MoePlan plan;
  uint8_t* ring = smem;
  __half* act = reinterpret_cast<__half*>(smem + RingBytes(K));
  PdlWait();
  const int U = BuildPlan(p, plan), NB = p.inter >> 7, NC = p.d >> 7;
  // Without any valid expert (U = 0) there are no down items to finish the columns: NC plain gather
  // items write the zero outputs instead.
  const int T1 = U * NB * p.splits, T2 = U * (NC / WND), T = T1 + T2 + (U == 0 && !p.sorted ? NC : 0);
  for (;;) {
    if (threadIdx.x == 0) plan.ticket = atomicAdd(&p.control->ticket, 1);
    __syncthreads();
    const int t = plan.ticket;
    __syncthreads();
    if (t >= T) break;
    if (t < T1) {
      GateUpItem<K, kFused>(p, plan, t, ring, act);
    } else if (t < T1 + T2) {
      DownItem<K, WND, kFused>(p, plan, U, t - T1, ring, act);
    } else {
      GatherColumn(p, plan, t - T1 - T2);
    }
    __syncthreads();
  }
  PdlTrigger();
  // The last CTA out resets the counters for the next launch (all items are finished by then).
  if (ArriveAndCount(&p.control->exited, plan) != (int)gridDim.x - 1) return;
  for (int i = threadIdx.x; i < U * NB; i += kThreads) p.control->gu_done[i] = 0;
  for (int i = threadIdx.x; i < U; i += kThreads) p.control->ready[i] = 0;
  for (int i = threadIdx.x; i < NC; i += kThreads) p.control->col_done[i] = 0;
  if (threadIdx.x == 0) {
    p.control->ticket = 0;
    p.control->exited = 0;
  }
}

// One instantiation per (K, down item width, fused finish), so that each keeps its own register
// allocation.
const void* MoeKernelFor(int K, int down_wn, bool fused) {
  return DispatchK(K, static_cast<const void*>(nullptr), [&](auto k) {
    constexpr int kK = decltype(k)::value;
    if (fused)
      return down_wn == 2 ? reinterpret_cast<const void*>(Exl3MoeKernel<kK, 2, true>)
                          : reinterpret_cast<const void*>(Exl3MoeKernel<kK, 1, true>);
    return down_wn == 2 ? reinterpret_cast<const void*>(Exl3MoeKernel<kK, 2, false>)
                        : reinterpret_cast<const void*>(Exl3MoeKernel<kK, 1, false>);
  });
}

// fn(kernel) for every instantiation of K; stops at the first CUDA error and returns it.
template <class Fn>
int ForEachMoeKernel(int K, Fn&& fn) {
  for (const int down_wn : {1, 2})
    for (const bool fused : {false, true}) {
      const cudaError_t e = fn(MoeKernelFor(K, down_wn, fused));
      if (e != cudaSuccess) return static_cast<int>(e);
    }
  return 0;
}

}  // namespace

int LaunchMoeMcg(int K, const MoeParams& p, int grid, void* stream) {
  if (p.down_wn != 1 && p.down_wn != 2) return static_cast<int>(cudaErrorInvalidValue);
  const void* f = MoeKernelFor(K, p.down_wn, p.fused_finish != 0);
  if (!f) return static_cast<int>(cudaErrorInvalidValue);
  MoeParams copy = p;
  void* args[] = {&copy};
  return static_cast<int>(
      PdlLaunchKernel(f, dim3(grid), dim3(kThreads), args, MoeSmemBytes(K), static_cast<cudaStream_t>(stream)));
}

int PrepareMoeMcg() {
  for (int K = 1; K <= 8; ++K) {
    const int e = ForEachMoeKernel(K, [&](const void* f) {
      return cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, MoeSmemBytes(K));
    });
    if (e != 0) return e;
  }
  return 0;
}

int MoeBlocksPerSm(int K, int* blocks) {
  // The grid is sized once per K: the fewest resident CTAs of its instantiations.
  int fewest = 1 << 30;
  const int e = ForEachMoeKernel(K, [&](const void* f) {
    int b = 0;
    const cudaError_t r = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, f, kThreads, MoeSmemBytes(K));
    fewest = b < fewest ? b : fewest;
    return r;
  });
  if (e != 0) return e;
  *blocks = fewest;
  return 0;
}

}  // namespace dsmesh::exl3cuda
