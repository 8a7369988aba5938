// Projects a decode step measured on one H200 (`dsmesh bench --profile`) onto the hardware of the reference
// deployment (vLLM + exllamav3 on 8 x RTX PRO 2000, sm_120, at TP8: docs/reference-deployment.md, section 6):
// each phase's efficiency on the H200 (measured time / its floor there) times the phase's floor on one
// RTX PRO 2000 for that card's shard, plus the all-reduces the TP8 split adds.
//
//   op kind           its floor (cli/perf/roofline.h, per rank)       projected on the RTX cards
//   dense linears     dense bytes (+ bf16 router, hc weights) and      efficiency x RTX floor
//   (Linear, LinearBatch, GroupedLinear, SharedExpert)  EXL3 decode ops
//   routed experts    expected experts' bytes and decode ops           efficiency x RTX floor
//   (MoeExperts)
//   head (head.weight) head bytes (bf16) or decode ops                 efficiency x RTX floor
//   latency-bound     (none: norms, hc, rope, attention over a 4K      time as measured on the H200
//                      context, compressors, indexer, host gaps)
//   collectives       -                                                2 all-reduces per layer x the
//                                                                      deployment's measured cost of one
//
// Inputs and where they come from are the fields of ReferenceDeploymentHardware; Describe() prints them.
#pragma once

#include <string>
#include <vector>

#include "kernels/exl3/quant_plan.h"
#include "model/config.h"
#include "cli/perf/roofline.h"

namespace dsmesh {

struct ReferenceDeploymentHardware {
  // RTX PRO 2000 Blackwell: cold-read bandwidth 264-275 GB/s measured in the deployment (270 used; nominal
  // 288 GB/s by NVIDIA's data sheet), 34 SMs measured, clock locked at 2600 MHz (docs/reference-deployment.md section 6).
  double copy_bytes_per_s = 270e9;
  // Integer (LOP3) rate: not measured in the deployment. Assumed to be the H200's measured rate per SM and
  // clock (16.47e12 / (132 x 1.98e9) = 63 per SM per cycle) x 34 SMs x 2.6 GHz = 5.57e12.
  double int_ops_per_s = 16.47e12 / (132 * 1.98e9) * 34 * 2.6e9;
  int world = 8;
  // One all-reduce of a hidden row over PCIe without P2P (NCCL ring LL): the deployment's profile gives NCCL
  // 18% of its 21.03 ms step (docs/reference-deployment.md section 5), over 2 x 43 all-reduces per step: 44 us.
  double allreduce_s = 0.18 * 21.03e-3 / 86;
};

// One op of the H200 profile, "phase / op" as `dsmesh bench --profile` names it, in ms per step.
struct MeasuredPhase {
  std::string phase;
  double ms = 0;
};

// The phases of one kind, aggregated: the H200 time (the eager split scaled to the graphs step), its
// floor there, the efficiency (time / floor), the floor on one RTX PRO 2000 and the projected time.
struct ProjectedKind {
  std::string kind;                  // "dense linears", "routed experts", "head", "latency-bound"
  std::vector<std::string> phases;
  double h200_ms = 0, h200_floor_ms = 0, rtx_floor_ms = 0, rtx_ms = 0;
  // The other reading of the same inputs: the H200 time is fixed cost (launches, latency) that carries
  // over to the RTX cards unchanged, and only an RTX floor above it is paid instead: max(H200 ms, RTX floor).
  double rtx_fixed_cost_ms = 0;
  double efficiency() const { return h200_floor_ms > 0 ? h200_ms / h200_floor_ms : 0; }
};

struct ReferenceDeploymentProjection {
  std::vector<ProjectedKind> kinds;
  int allreduces = 0;
  double collectives_ms = 0;
  double h200_ms = 0, rtx_ms = 0, rtx_fixed_cost_ms = 0;
  ReferenceDeploymentHardware hardware;
  // The table, the inputs and the total beside the deployment's 21.03 ms and the 14 ms target.
  std::string Describe(int streams) const;
};

// `phases` is the eager profile of `streams` decoding streams of one row each at `context` (ms per step,
// per op); it is scaled by graphs_ms / eager_ms (both measured in the same run) so that it sums to the
// step as served with CUDA graphs. Ops the table above does not name count as latency-bound.
ReferenceDeploymentProjection ProjectToReferenceDeployment(const ModelConfig& c, const Exl3BitsSpec& bits, int streams, int64_t context,
                             const std::vector<MeasuredPhase>& phases, double graphs_ms, double eager_ms,
                             const ReferenceDeploymentHardware& hardware = {}, const RooflineCeilings& h200 = {});

}  // namespace dsmesh
