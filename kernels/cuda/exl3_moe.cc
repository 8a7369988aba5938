#include "kernels/cuda/exl3_moe.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <stdexcept>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/exl3_moe_params.h"

namespace dsmesh {
namespace {

std::once_flag g_active_log;
int g_blocks_per_sm[64][9];  // resident CTAs per SM, per device and K (set once, before any capture)

void PrepareOnce() {
  static PerDeviceOnce once;
  once.Run([](int dev) {
    CudaCheck(static_cast<cudaError_t>(exl3cuda::PrepareMoeMcg()), "routed-expert kernel setup");
    for (int K = 1; K <= 8; ++K) {
      int b = 0;
      CudaCheck(static_cast<cudaError_t>(exl3cuda::MoeBlocksPerSm(K, &b)), "routed-expert kernel occupancy");
      g_blocks_per_sm[dev][K] = b;
    }
  });
}

bool Aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// The launch-shape rules assume the m * topk slots hit distinct experts (the common case at decode
// sizes; the actual count can only be smaller, and every rule stays correct then, only less tuned).
int ExpectedGroups(int m, int topk, int num_experts) { return std::max(1, std::min(num_experts, m * topk)); }

}  // namespace

int Exl3MoeSplits(int m, int topk, int num_experts, int hidden, int inter, int num_sms, int items_per_sm) {
  // Enough gate/up items for items_per_sm per SM (kExl3MoeItemsPerSm = 2 by default; at 3 the H200
  // measured 2.39-2.40x vs 2.42x, min 1.56x vs 1.69x, K3 I1024 m1 8% faster the one exception).
  const int groups = ExpectedGroups(m, topk, num_experts);
  const int nb = inter / 128, nblk_d = hidden / 128;
  const int target = items_per_sm * num_sms;
  const int per = groups * nb;
  int s = (target + per - 1) / per;
  // With few experts (their down items cannot fill the target, e.g. the 6 of m = 1), the gate/up items
  // are the whole critical path: one split fewer when the last one would only add a short partial round
  // (under a quarter of the target), whose items start when the first round ends and hold back their
  // groups' down items. Measured: m1 I1024 6 -> 5 splits -7..9%, m1 I2048 3 -> 2 K2 -2.5%, K3 +2%.
  if (s > 1 && groups * nblk_d < target && per * s > target && (per * s - target) * 4 < target) --s;
  return std::max(1, std::min(s, nblk_d));
}

bool Exl3MoeWideDownItems(int m, int topk, int num_experts, int hidden, int inter, int grid) {
  // Wide items when narrow ones would be short (I <= kExl3MoeDownWideMaxInter: at most 8 pipeline
  // stages per warp, so the per-item costs weigh) and the wide ones still give kExl3MoeDownWideRounds
  // rounds of the grid. Measured: m16 I256 -8%, I1024 -1%, I2048 +1% (hence the I limit).
  const int64_t groups = ExpectedGroups(m, topk, num_experts), nc = hidden / 128;
  return nc % 2 == 0 && inter <= kExl3MoeDownWideMaxInter &&
         groups * (nc / 2) >= static_cast<int64_t>(kExl3MoeDownWideRounds) * grid;
}

int Exl3MoeFusedSplits(int m, int topk, int num_experts, int hidden, int inter, int num_sms, int items_per_sm) {
  // Every down item of a fused launch sums all S partials of its group (repeated 32 times per expert at
  // d = 4096) and each gate/up item's duration is on the critical path: equal items (S divides d / 128)
  // and no more than one round of the target. Measured: I256 m1 S = 16 18.8 us vs the plain
  // rule's 22 (items of 1 or 2 blocks) 20.1-20.3 us, S = 8 21.8, S = 32 22.1; I1024 m1 S = 4 vs 5 mixed.
  const int groups = ExpectedGroups(m, topk, num_experts);
  const int nb = inter / 128, nblk_d = hidden / 128, target = items_per_sm * num_sms;
  int best = 1;
  for (int s = 1; s <= nblk_d; ++s)
    if (nblk_d % s == 0 && groups * nb * s <= target) best = s;
  return best;
}

bool Exl3MoeFusedFinish(int m, int topk, int num_experts, int hidden, int grid) {
  return static_cast<int64_t>(ExpectedGroups(m, topk, num_experts)) * (hidden / 128) < grid;
}

Exl3MoeWorkspace::Exl3MoeWorkspace(int max_rows, int topk, int hidden, int inter, const Exl3MoeTuning& tuning)
    : Exl3MoeWorkspace(max_rows, topk, hidden, inter, false, tuning) {}

std::unique_ptr<Exl3MoeWorkspace> Exl3MoeWorkspace::ForSortedPairs(int max_pairs, int hidden, int inter,
                                                                   const Exl3MoeTuning& tuning) {
  return std::unique_ptr<Exl3MoeWorkspace>(new Exl3MoeWorkspace(max_pairs, 1, hidden, inter, true, tuning));
}

Exl3MoeWorkspace::Exl3MoeWorkspace(int max_rows, int topk, int hidden, int inter, bool sorted_pairs,
                                   const Exl3MoeTuning& tuning)
    : max_rows_(max_rows), topk_(topk), hidden_(hidden), inter_(inter), sorted_pairs_(sorted_pairs) {
  const auto in_range = [](const char* what, int v, int lo, int hi) {
    if (v < lo || v > hi)
      throw std::runtime_error("Exl3MoeWorkspace: " + std::string(what) + " " + std::to_string(v) + " (must be " +
                               std::to_string(lo) + ".." + std::to_string(hi) + ")");
  };
  in_range("items_per_sm", tuning.items_per_sm, 1, 64);
  in_range("down_wide", tuning.down_wide, -1, 1);
  in_range("fused_finish", tuning.fused_finish, -1, 1);
  in_range("splits", tuning.splits, 0, exl3cuda::kMoeMaxHiddenBlocks);
  if (sorted_pairs && (max_rows < 1 || topk != 1))
    throw std::runtime_error("Exl3MoeWorkspace: sorted pairs need max_rows >= 1 and top-k 1");
  if (!sorted_pairs && (max_rows < 1 || max_rows > kExl3MoeMaxRows))
    throw std::runtime_error("Exl3MoeWorkspace: max_rows " + std::to_string(max_rows) + " (must be 1..24)");
  if (topk < 1 || topk > exl3cuda::kMoeMaxTopK)
    throw std::runtime_error("Exl3MoeWorkspace: top-k " + std::to_string(topk) + " (must be 1..8)");
  if (hidden <= 0 || hidden % 128 || hidden / 128 > exl3cuda::kMoeMaxHiddenBlocks)
    throw std::runtime_error("Exl3MoeWorkspace: hidden " + std::to_string(hidden) + " (multiple of 128, at most 8192)");
  if (inter <= 0 || inter % 128 || inter / 128 > exl3cuda::kMoeMaxInterBlocks)
    throw std::runtime_error("Exl3MoeWorkspace: intermediate " + std::to_string(inter) +
                             " (multiple of 128, at most 4096)");
  CudaCheck(cudaGetDevice(&device_), "cudaGetDevice");
  CudaCheck(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_), "SM count");
  PrepareOnce();
  items_per_sm_ = tuning.items_per_sm;
  down_wide_ = tuning.down_wide;
  fused_finish_ = tuning.fused_finish;
  forced_splits_ = std::min(tuning.splits, hidden / 128);
  max_splits_ = std::max(1, forced_splits_);
  for (int m = 1; m <= (sorted_pairs ? 0 : max_rows); ++m)
    max_splits_ = std::max({max_splits_,
                            Exl3MoeSplits(m, topk, exl3cuda::kMoeMaxExperts, hidden, inter, num_sms_, items_per_sm_),
                            Exl3MoeFusedSplits(m, topk, exl3cuda::kMoeMaxExperts, hidden, inter, num_sms_,
                                               items_per_sm_)});
  if (sorted_pairs) max_splits_ = kExl3MoeSortedMaxSplits;
  const size_t pairs = static_cast<size_t>(max_rows) * topk;
  CudaCheck(cudaMalloc(&control_, sizeof(exl3cuda::MoeControl)), "Exl3MoeWorkspace control");
  CudaCheck(cudaMemset(control_, 0, sizeof(exl3cuda::MoeControl)), "Exl3MoeWorkspace control");
  CudaCheck(cudaMalloc(&part_gu_, pairs * max_splits_ * 2 * inter * sizeof(float)), "Exl3MoeWorkspace partials");
  CudaCheck(cudaMalloc(&act_, pairs * inter * sizeof(uint16_t)), "Exl3MoeWorkspace activations");
  // (Sorted launches write y directly: no per-pair outputs.)
  if (!sorted_pairs) CudaCheck(cudaMalloc(&down_out_, pairs * hidden * sizeof(float)), "Exl3MoeWorkspace outputs");
  CudaCheck(cudaDeviceSynchronize(), "Exl3MoeWorkspace init");
}

Exl3MoeWorkspace::~Exl3MoeWorkspace() {
  cudaFree(control_);
  cudaFree(part_gu_);
  cudaFree(act_);
  cudaFree(down_out_);
}

bool Exl3MoeWorkspace::TakeBadIdFlag() {
  CudaCheck(cudaDeviceSynchronize(), "Exl3MoeWorkspace::TakeBadIdFlag");
  auto* ctrl = static_cast<exl3cuda::MoeControl*>(control_);
  int err = 0;
  CudaCheck(cudaMemcpy(&err, &ctrl->error, sizeof(int), cudaMemcpyDeviceToHost), "read error flag");
  CudaCheck(cudaMemset(&ctrl->error, 0, sizeof(int)), "clear error flag");
  return err != 0;
}

std::string Exl3MoeUnsupportedReason(const Exl3MoeLayer& l, int m, int topk) {
  if (m < 1 || m > kExl3MoeMaxRows) return "m = " + std::to_string(m) + " rows (the kernel takes 1..24)";
  if (topk < 1 || topk > exl3cuda::kMoeMaxTopK) return "top-k " + std::to_string(topk) + " (1..8)";
  if (l.num_experts < 1 || l.num_experts > exl3cuda::kMoeMaxExperts)
    return std::to_string(l.num_experts) + " experts (1..256)";
  if (l.codebook != 1) return "codebook " + std::to_string(l.codebook) + " (only MCG = 1 is compiled)";
  if (l.K < 1 || l.K > 8) return "K = " + std::to_string(l.K);
  if (l.hidden <= 0 || l.hidden % 128 || l.hidden / 128 > exl3cuda::kMoeMaxHiddenBlocks)
    return "hidden " + std::to_string(l.hidden);
  if (l.inter <= 0 || l.inter % 128 || l.inter / 128 > exl3cuda::kMoeMaxInterBlocks)
    return "intermediate " + std::to_string(l.inter);
  if (!l.gate_trellis || !l.gate_suh || !l.gate_svh || !l.up_trellis || !l.up_suh || !l.up_svh || !l.down_trellis ||
      !l.down_suh || !l.down_svh)
    return "missing pointer table";
  return "";
}

// The launch behind Exl3MoeForward and Exl3MoeForwardSorted (a friend of the workspace).
void LaunchExl3Moe(const Exl3MoeLayer& l, const uint16_t* x, const int32_t* ids, const float* weights, int m,
                   float* y, Exl3MoeWorkspace& ws, cudaStream_t stream, bool sorted);

void Exl3MoeForward(const Exl3MoeLayer& l, const uint16_t* x, const int32_t* ids, const float* weights, int m,
                    float* y, Exl3MoeWorkspace& ws, cudaStream_t stream) {
  LaunchExl3Moe(l, x, ids, weights, m, y, ws, stream, false);
}

void Exl3MoeForwardSorted(const Exl3MoeLayer& l, const uint16_t* x, const int32_t* ids, const float* weights,
                          int pairs, float* y, Exl3MoeWorkspace& ws, cudaStream_t stream) {
  LaunchExl3Moe(l, x, ids, weights, pairs, y, ws, stream, true);
}

void LaunchExl3Moe(const Exl3MoeLayer& l, const uint16_t* x, const int32_t* ids, const float* weights, int m,
                   float* y, Exl3MoeWorkspace& ws, cudaStream_t stream, bool sorted) {
  const std::string who = "routed-expert kernel, layer '" + l.name + "'";
  // A sorted launch takes any number of rows (checked against the workspace below): the layer is checked
  // as for one row.
  std::string why = Exl3MoeUnsupportedReason(l, sorted ? 1 : m, ws.topk_);
  if (why.empty() && sorted != ws.sorted_pairs_)
    why = sorted ? "the workspace is not one for sorted pairs (Exl3MoeWorkspace::ForSortedPairs)"
                 : "the workspace is one for sorted pairs";
  if (why.empty() && (m < 1 || m > ws.max_rows_ || l.hidden != ws.hidden_ || l.inter != ws.inter_))
    why = "workspace made for max_rows " + std::to_string(ws.max_rows_) + ", hidden " + std::to_string(ws.hidden_) +
          ", intermediate " + std::to_string(ws.inter_);
  if (why.empty() && (!x || !ids || !weights || !y)) why = "null input/output pointer";
  if (why.empty() && (!Aligned(x, 16) || !Aligned(y, 16))) why = "x and y must be 16-byte aligned";
  if (!why.empty()) {
    ++ws.counts_.rejected;
    throw std::runtime_error(who + ": cannot run: " + why);
  }
  int dev = 0;
  CudaCheck(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev != ws.device_) throw std::runtime_error(who + ": workspace belongs to another device");
  if (!ws.bound_) {
    ws.bound_ = true;
    ws.stream_ = stream;
  } else if (ws.stream_ != stream) {
    throw std::runtime_error(who + ": workspace is bound to another stream; use one Exl3MoeWorkspace per stream");
  }

  exl3cuda::MoeParams p{};
  p.x = x;
  p.ids = ids;
  p.weights = weights;
  p.y = y;
  p.gate_trellis = l.gate_trellis;
  p.gate_suh = l.gate_suh;
  p.gate_svh = l.gate_svh;
  p.up_trellis = l.up_trellis;
  p.up_suh = l.up_suh;
  p.up_svh = l.up_svh;
  p.down_trellis = l.down_trellis;
  p.down_suh = l.down_suh;
  p.down_svh = l.down_svh;
  p.control = static_cast<exl3cuda::MoeControl*>(ws.control_);
  p.part_gu = ws.part_gu_;
  p.act = ws.act_;
  p.down_out = ws.down_out_;
  p.m = m;
  p.topk = ws.topk_;
  p.num_experts = l.num_experts;
  p.d = l.hidden;
  p.inter = l.inter;
  p.swiglu_limit = l.swiglu_limit;
  p.one = 1;
  p.sorted = sorted ? 1 : 0;
  const int per_sm = dev < 64 ? g_blocks_per_sm[dev][l.K] : 0;
  if (per_sm < 1) throw std::runtime_error(who + ": kernel does not fit on an SM");
  const int grid = per_sm * ws.num_sms_;
  p.fused_finish = ws.fused_finish_ >= 0 ? ws.fused_finish_
                                         : Exl3MoeFusedFinish(m, ws.topk_, l.num_experts, l.hidden, grid);
  if (ws.forced_splits_ > 0) {
    p.splits = ws.forced_splits_;
  } else if (p.fused_finish) {
    p.splits = Exl3MoeFusedSplits(m, ws.topk_, l.num_experts, l.hidden, l.inter, ws.num_sms_, ws.items_per_sm_);
  } else {
    p.splits = Exl3MoeSplits(m, ws.topk_, l.num_experts, l.hidden, l.inter, ws.num_sms_, ws.items_per_sm_);
  }
  if (p.splits > ws.max_splits_) p.splits = ws.max_splits_;  // workspace sized for its max
  bool wide = Exl3MoeWideDownItems(m, ws.topk_, l.num_experts, l.hidden, l.inter, grid);
  if (ws.down_wide_ >= 0) {  // forced by Exl3MoeTuning::down_wide
    wide = ws.down_wide_ == 1;
    if (wide && (l.hidden / 128) % 2)
      throw std::runtime_error(who + ": down_wide = 1 (DSMESH_EXL3_MOE_DOWN_WIDE=1) needs hidden / 128 even, hidden = " +
                               std::to_string(l.hidden));
  }
  p.down_wn = wide ? 2 : 1;
  CudaCheck(static_cast<cudaError_t>(exl3cuda::LaunchMoeMcg(l.K, p, grid, stream)), who + " launch");
  ++ws.counts_.launches;
  ws.counts_.rows += m;
  std::call_once(g_active_log, [&] {
    std::fprintf(stderr, "routed-expert kernel ACTIVE (device %d, %d SMs, grid %d, K=%d, I=%d, d=%d, experts=%d)\n",
                 dev, ws.num_sms_, grid, l.K, l.inter, l.hidden, l.num_experts);
  });
}

}  // namespace dsmesh
