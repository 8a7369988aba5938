// Routed experts of one MoE layer on the GPU in a single launch (m <= 24 rows; the decode shape of a
// seat is 4 streams x (1 + 3 draft tokens) = 16). EXL3 experts with the MCG codebook and one K (any of
// 1..8) for gate, up and down; up to 256 experts, top-k up to 8 from the config, intermediate size I
// (the rank's shard, a multiple of 128) and hidden size d (multiple of 128). See exl3_moe_kernel.cu for
// the work decomposition.
//
//   Exl3MoeLayer layer = ...;                       // device pointer tables, built once at load
//   Exl3MoeWorkspace ws(/*max_rows=*/24, topk, d, I);  // once per stream, before graph capture
//   Exl3MoeForward(layer, x, ids, weights, m, y, ws, stream);
//
// Strict by construction: there is no fallback inside. A shape or layer the kernel cannot run raises
// std::runtime_error naming the layer and the reason; callers that want a different path for, e.g.,
// prefill must ask Exl3MoeSupports() first and count their declines. The first successful launch in a
// process logs "routed-expert kernel ACTIVE" once; each workspace counts its launches (counts()).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

namespace dsmesh {

struct Exl3MoeLayer {
  std::string name;         // e.g. "layers.3.mlp.experts", for messages
  int num_experts = 0;      // <= 256
  int hidden = 0;           // d
  int inter = 0;            // I of this rank's shard
  int K = 0;                // bits per weight of gate, up and down (equal)
  int codebook = 1;         // must be 1 (MCG)
  float swiglu_limit = 0;   // clamp limit (config swiglu_limit); <= 0 disables the clamp
  // Device arrays of num_experts device pointers each (trellis int16 / suh fp16 / svh fp16 of every
  // expert's gate [d x I], up [d x I] and down [I x d]).
  const uint16_t* const* gate_trellis = nullptr;
  const uint16_t* const* gate_suh = nullptr;
  const uint16_t* const* gate_svh = nullptr;
  const uint16_t* const* up_trellis = nullptr;
  const uint16_t* const* up_suh = nullptr;
  const uint16_t* const* up_svh = nullptr;
  const uint16_t* const* down_trellis = nullptr;
  const uint16_t* const* down_suh = nullptr;
  const uint16_t* const* down_svh = nullptr;

  // Sets the nine arrays above from tables[9], ordered gate, up, down x trellis, suh, svh.
  void SetTables(const uint16_t** const (&tables)[9]) {
    const uint16_t* const** fields[9] = {&gate_trellis, &gate_suh, &gate_svh, &up_trellis, &up_suh,
                                         &up_svh,       &down_trellis, &down_suh, &down_svh};
    for (int t = 0; t < 9; ++t) *fields[t] = tables[t];
  }
};

constexpr int kExl3MoeMaxRows = 24;

// Gate/up work items per SM the routed-expert k-split aims for by default: one round of the 2
// resident CTAs per SM (measured, two runs: 2.42x vs 2.39-2.40x at 3; exl3_moe.cc).
constexpr int kExl3MoeItemsPerSm = 2;
// Down items take 256 output columns instead of 128 (halving the per-item costs, docs/cuda-kernels.md) when the
// 128-column ones would be short, I <= kExl3MoeDownWideMaxInter, and the wide ones still give
// kExl3MoeDownWideRounds rounds of the resident CTAs (m = 16 at d = 4096): Exl3MoeWideDownItems.
constexpr int kExl3MoeDownWideRounds = 2;
constexpr int kExl3MoeDownWideMaxInter = 1024;
// Whether a launch of m rows takes the 256-column down items (grid: resident CTAs of the launch).
bool Exl3MoeWideDownItems(int m, int topk, int num_experts, int hidden, int inter, int grid);

// Whether a launch of m rows lets its down items finish the gate/up sums themselves (fused finish):
// when the experts are too few for their 128-column down items to fill the grid (m = 1: 6 x 32 < 264),
// so the finish is on the critical path and the repeated partial-sum reads are cheap (H200: m1
// -1..-8%, MoE geomean 2.92x vs 2.88-2.89x; at m4/m16 the re-reads cost more than they save).
bool Exl3MoeFusedFinish(int m, int topk, int num_experts, int hidden, int grid);

// Scratch for one stream: control counters (zeroed once here, self-resetting after every launch),
// gate/up partial sums, the fp16 down inputs and the per-(row, expert) outputs. Bound to the first
// stream it is used on; using it on another stream throws.
// Tuning of the launches a workspace serves (A/B and sweep knobs: the CLI and dsmesh-kernel-bench read
// them from DSMESH_EXL3_MOE_*, Exl3MoeTuningFromEnvironment in cuda_backend_options.h).
struct Exl3MoeTuning {
  // Gate/up work items per SM the k-split aims for, 1..64 (DSMESH_EXL3_MOE_ITEMS_PER_SM).
  int items_per_sm = kExl3MoeItemsPerSm;
  // The down item shape: -1 = Exl3MoeWideDownItems (the default); 0 = never wide, 1 = always (tests and A/B
  // runs; forcing wide items on an odd hidden / 128 throws at the launch) (DSMESH_EXL3_MOE_DOWN_WIDE).
  int down_wide = -1;
  // The gate/up k-split: 0 = Exl3MoeSplits (the default); else this split for every m, clamped to
  // hidden / 128 (split sweeps; DSMESH_EXL3_MOE_SPLITS).
  int splits = 0;
  // Where the gate/up sums are finished: -1 = Exl3MoeFusedFinish (the default); 0 = never in the down
  // items, 1 = always (DSMESH_EXL3_MOE_FUSED_FINISH).
  int fused_finish = -1;
};

// What the launches on one workspace did (Exl3MoeWorkspace::counts).
struct Exl3MoeCounters {
  int64_t launches = 0;  // successful launches
  int64_t rows = 0;      // rows processed
  int64_t rejected = 0;  // calls that raised because the shape was unsupported
};

class Exl3MoeWorkspace {
 public:
  // Throws on shapes the kernel does not take and on a tuning out of range.
  Exl3MoeWorkspace(int max_rows, int topk, int hidden, int inter, const Exl3MoeTuning& tuning = {});
  // For Exl3MoeForwardSorted: up to max_pairs sorted pairs (any number; scratch ~ 8 I bytes per pair and
  // k-split), k-splits capped at kExl3MoeSortedMaxSplits.
  static std::unique_ptr<Exl3MoeWorkspace> ForSortedPairs(int max_pairs, int hidden, int inter,
                                                          const Exl3MoeTuning& tuning = {});
  int max_rows() const { return max_rows_; }
  int hidden() const { return hidden_; }
  int inter() const { return inter_; }
  ~Exl3MoeWorkspace();
  Exl3MoeWorkspace(const Exl3MoeWorkspace&) = delete;
  Exl3MoeWorkspace& operator=(const Exl3MoeWorkspace&) = delete;

  // The launches made with this workspace (one stream's).
  const Exl3MoeCounters& counts() const { return counts_; }

  // Reads (and clears) the kernel's error flag: true if some launch saw an expert id outside
  // [0, num_experts) (those slots contributed nothing). Synchronizes the device: not inside capture.
  bool TakeBadIdFlag();

 private:
  friend void LaunchExl3Moe(const Exl3MoeLayer&, const uint16_t*, const int32_t*, const float*, int, float*,
                            Exl3MoeWorkspace&, cudaStream_t, bool);
  Exl3MoeWorkspace(int max_rows, int topk, int hidden, int inter, bool sorted_pairs, const Exl3MoeTuning& tuning);
  int max_rows_, topk_, hidden_, inter_, max_splits_, items_per_sm_ = kExl3MoeItemsPerSm;
  bool sorted_pairs_ = false;
  int down_wide_ = -1;     // Exl3MoeTuning::down_wide (-1: Exl3MoeWideDownItems)
  int forced_splits_ = 0;  // Exl3MoeTuning::splits (0: Exl3MoeSplits)
  int fused_finish_ = -1;  // Exl3MoeTuning::fused_finish (-1: Exl3MoeFusedFinish)
  int device_ = 0, num_sms_ = 0;
  void* control_ = nullptr;
  float* part_gu_ = nullptr;
  uint16_t* act_ = nullptr;
  float* down_out_ = nullptr;
  bool bound_ = false;
  cudaStream_t stream_ = nullptr;
  Exl3MoeCounters counts_;
};

// Empty string when the kernel can run this layer at m rows and top-k, else the reason.
std::string Exl3MoeUnsupportedReason(const Exl3MoeLayer& layer, int m, int topk);
inline bool Exl3MoeSupports(const Exl3MoeLayer& layer, int m, int topk) {
  return Exl3MoeUnsupportedReason(layer, m, topk).empty();
}

// y[m, d] (fp32, overwritten) = sum_k weights[r, k] * expert_{ids[r, k]}(x[r]).
// x: fp16 [m, d]; ids: int32 [m, topk]; weights: fp32 [m, topk]; all device pointers.
// topk is the workspace's. Throws (strict) when the shape is unsupported or the launch fails.
void Exl3MoeForward(const Exl3MoeLayer& layer, const uint16_t* x, const int32_t* ids, const float* weights, int m,
                    float* y, Exl3MoeWorkspace& ws, cudaStream_t stream);

// Routed experts of many rows (prefill chunks) in one launch, as (row, expert) pairs sorted by expert:
// y[r, :] = weights[r] * expert_{ids[r]}(x[r]) for r < pairs, where ids ascend (each expert's pairs
// contiguous) and ids out of range come last (their y rows are left as they were; the launch flags them
// like Exl3MoeForward). Each expert's weights are decoded once per 16 of its pairs. x fp16 [pairs, d], y
// fp32 [pairs, d]; ws from Exl3MoeWorkspace::ForSortedPairs with max_pairs >= pairs. The launch shape is
// tuned, as for any launch, for min(experts, pairs) distinct experts.
void Exl3MoeForwardSorted(const Exl3MoeLayer& layer, const uint16_t* x, const int32_t* ids, const float* weights,
                          int pairs, float* y, Exl3MoeWorkspace& ws, cudaStream_t stream);
constexpr int kExl3MoeSortedMaxSplits = 2;

// Number of k-splits of the gate/up projections for m rows (exposed for tests and the benchmark).
int Exl3MoeSplits(int m, int topk, int num_experts, int hidden, int inter, int num_sms,
                  int items_per_sm = kExl3MoeItemsPerSm);
// The k-split of a fused-finish launch (Exl3MoeFusedFinish): the largest divisor of hidden / 128 that
// keeps the gate/up items within one round of the target.
int Exl3MoeFusedSplits(int m, int topk, int num_experts, int hidden, int inter, int num_sms,
                       int items_per_sm = kExl3MoeItemsPerSm);


}  // namespace dsmesh
