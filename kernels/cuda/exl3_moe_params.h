// Launch parameters of the routed-expert kernel (plain struct shared by host and device code) and the
// layout of its per-stream scratch.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dsmesh::exl3cuda {

constexpr int kMoeMaxExperts = 256;
constexpr int kMoeMaxRows = 24;    // rows per launch (row masks are one 32-bit word)
constexpr int kMoeMaxTopK = 8;
constexpr int kMoeMaxInterBlocks = 32;   // I <= 4096
constexpr int kMoeMaxHiddenBlocks = 64;  // d <= 8192

// Control words at the start of the scratch; they are zero between launches (the last CTA of each
// launch resets them).
struct MoeControl {
  int ticket;                                   // next work item
  int exited;                                   // CTAs that found no more work
  int error;                                    // 1: an expert id was out of range (ids ignored)
  int pad;
  int gu_done[kMoeMaxExperts * kMoeMaxInterBlocks];  // gate/up k-splits finished per (group, I-block)
  int ready[kMoeMaxExperts];                    // per group: I-blocks whose down input is ready, or
                                                // with fused_finish, gate/up items done
  int col_done[kMoeMaxHiddenBlocks];            // groups whose down output is written, per 128 columns
};

struct MoeParams {
  const uint16_t* x;        // fp16 [m, d]
  const int32_t* ids;       // [m, topk] expert ids
  const float* weights;     // [m, topk] routing weights
  float* y;                 // fp32 [m, d], overwritten
  // Per-expert device pointer tables [num_experts].
  const uint16_t* const* gate_trellis;
  const uint16_t* const* gate_suh;
  const uint16_t* const* gate_svh;
  const uint16_t* const* up_trellis;
  const uint16_t* const* up_suh;
  const uint16_t* const* up_svh;
  const uint16_t* const* down_trellis;
  const uint16_t* const* down_suh;
  const uint16_t* const* down_svh;
  // Scratch.
  MoeControl* control;
  float* part_gu;           // [pairs, splits, 2, I] gate/up partial sums
  uint16_t* act;            // [pairs, I] fp16 down-projection input (after suh and Hadamard)
  float* down_out;          // [pairs, d] expert outputs before routing weights
  int m, topk, num_experts, d, inter;
  int splits;               // gate/up k-splits of d (whole 128-blocks)
  int down_wn;              // 128-column blocks per down item: 1, or 2 when there are items enough
  int fused_finish;         // 1: the down items finish the gate/up sums themselves (few experts)
  int sorted;               // 1: topk 1, rows sorted by expert id (ids out of range last), any m: the down
                            // items write y[r] = weights[r] * expert(x[r]) themselves, rows of bad ids untouched
  float swiglu_limit;       // <= 0: no clamp
  uint32_t one;             // always 1 (see GemvParams::one)
};

// Shared memory of the routed-expert kernel for K: trellis ring, activation region, route plan.
constexpr int kMoeActBytes = 16 * (1024 + 8) * 2;
int MoeSmemBytes(int K);

int LaunchMoeMcg(int K, const MoeParams& p, int grid, void* stream);
int PrepareMoeMcg();
// CTAs of the kernel for K that fit on one SM (after PrepareMoeMcg).
int MoeBlocksPerSm(int K, int* blocks);

}  // namespace dsmesh::exl3cuda
