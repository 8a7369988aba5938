#include "cli/perf/reference_deployment_projection.h"

#include <algorithm>
#include <cstdio>
#include <map>

namespace dsmesh {
namespace {

// The kind of a profiled op ("phase / op" as `dsmesh bench --profile` names it, or a phase alone): the
// linears by their op, the rest latency-bound.
std::string KindOf(const std::string& name) {
  const size_t cut = name.find(" / ");
  const std::string op = cut == std::string::npos ? name : name.substr(cut + 3);
  if (op == "MoeExperts" || op == "routed experts") return "routed experts";
  if (op.find("head.weight") != std::string::npos || op == "head + logits") return "head";
  if (op.rfind("Linear", 0) == 0 || op.rfind("GroupedLinear", 0) == 0 || op == "SharedExpert" ||
      op == "shared expert")
    return "dense linears";
  return "latency-bound";
}

struct KindFloors {
  double dense = 0, experts = 0, head = 0;
};

KindFloors FloorsOf(const DecodeStepFloor& f, double bytes_per_s, double ops_per_s) {
  KindFloors k;
  k.dense = std::max((f.dense_bytes + f.small_bytes) / bytes_per_s, f.dense_ops / ops_per_s);
  k.experts = std::max(f.expert_bytes / bytes_per_s, f.expert_ops / ops_per_s);
  k.head = std::max(f.head_bytes / bytes_per_s, f.head_ops / ops_per_s);
  return k;
}

}  // namespace

ReferenceDeploymentProjection ProjectToReferenceDeployment(const ModelConfig& c, const Exl3BitsSpec& bits, int streams, int64_t context,
                             const std::vector<MeasuredPhase>& phases, double graphs_ms, double eager_ms,
                             const ReferenceDeploymentHardware& hardware, const RooflineCeilings& h200) {
  ReferenceDeploymentProjection p;
  p.hardware = hardware;
  DecodeStepShape shape;
  shape.streams = streams;
  shape.context = context;
  shape.kv = KvCacheDtype::kF32;
  const KindFloors hf = FloorsOf(ComputeDecodeStepFloor(c, bits, shape, h200), h200.copy_bytes_per_s,
                                 h200.int_ops_per_s);
  shape.world = hardware.world;
  const KindFloors sf = FloorsOf(ComputeDecodeStepFloor(c, bits, shape, h200), hardware.copy_bytes_per_s,
                                 hardware.int_ops_per_s);
  const double scale = eager_ms > 0 ? graphs_ms / eager_ms : 1.0;
  std::map<std::string, ProjectedKind> by_kind;
  for (const char* k : {"dense linears", "routed experts", "head", "latency-bound"}) by_kind[k].kind = k;
  for (const MeasuredPhase& m : phases) {
    ProjectedKind& k = by_kind[KindOf(m.phase)];
    k.phases.push_back(m.phase);
    k.h200_ms += m.ms * scale;
  }
  auto set = [&](const char* kind, double h200_floor_s, double rtx_floor_s) {
    ProjectedKind& k = by_kind[kind];
    k.h200_floor_ms = h200_floor_s * 1e3;
    k.rtx_floor_ms = rtx_floor_s * 1e3;
    k.rtx_ms = k.efficiency() * k.rtx_floor_ms;
    k.rtx_fixed_cost_ms = std::max(k.h200_ms, k.rtx_floor_ms);
  };
  set("dense linears", hf.dense, sf.dense);
  set("routed experts", hf.experts, sf.experts);
  set("head", hf.head, sf.head);
  by_kind["latency-bound"].rtx_ms = by_kind["latency-bound"].rtx_fixed_cost_ms = by_kind["latency-bound"].h200_ms;
  for (const char* k : {"dense linears", "routed experts", "head", "latency-bound"}) {
    p.kinds.push_back(by_kind[k]);
    p.h200_ms += by_kind[k].h200_ms;
    p.rtx_ms += by_kind[k].rtx_ms;
    p.rtx_fixed_cost_ms += by_kind[k].rtx_fixed_cost_ms;
  }
  p.allreduces = hardware.world > 1 ? 2 * c.num_layers : 0;
  p.collectives_ms = p.allreduces * hardware.allreduce_s * 1e3;
  p.rtx_ms += p.collectives_ms;
  p.rtx_fixed_cost_ms += p.collectives_ms;
  return p;
}

std::string ReferenceDeploymentProjection::Describe(int streams) const {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line),
                "projection to the reference deployment (%d x RTX PRO 2000, TP%d), %d stream(s): H200 phase efficiency x RTX floor\n",
                hardware.world, hardware.world, streams);
  out += line;
  std::snprintf(line, sizeof(line), "  %-16s %10s %10s %8s %11s %10s %14s\n", "kind", "H200 ms", "floor ms",
                "x floor", "RTX floor", "RTX ms", "(fixed cost)");
  out += line;
  for (const ProjectedKind& k : kinds) {
    if (k.kind == "latency-bound") {
      std::snprintf(line, sizeof(line), "  %-16s %10.3f %10s %8s %11s %10.3f %14.3f  (as measured)\n",
                    k.kind.c_str(), k.h200_ms, "-", "-", "-", k.rtx_ms, k.rtx_fixed_cost_ms);
    } else {
      std::snprintf(line, sizeof(line), "  %-16s %10.3f %10.3f %8.1f %11.3f %10.3f %14.3f\n", k.kind.c_str(),
                    k.h200_ms, k.h200_floor_ms, k.efficiency(), k.rtx_floor_ms, k.rtx_ms, k.rtx_fixed_cost_ms);
    }
    out += line;
  }
  std::snprintf(line, sizeof(line),
                "  %-16s %10s %10s %8s %11s %10.3f %14.3f  (2 x %d all-reduces x %.1f us, the deployment's)\n", "collectives",
                "-", "-", "-", "-", collectives_ms, collectives_ms, allreduces / 2, hardware.allreduce_s * 1e6);
  out += line;
  std::snprintf(line, sizeof(line),
                "  total: H200 %.2f ms/step -> RTX PRO 2000 x8 %.2f ms/step (efficiency model), %.2f ms/step (fixed-cost reading); "
                "the deployment today (vLLM + exllamav3): 21.03 ms (1 stream), target <= 14 ms\n",
                h200_ms, rtx_ms, rtx_fixed_cost_ms);
  out += line;
  std::snprintf(line, sizeof(line),
                "  inputs: RTX PRO 2000 bandwidth %.0f GB/s (measured cold read), integer rate %.2f Tops/s (assumed: the H200's "
                "per-SM-clock rate x 34 SMs x 2.6 GHz), all-reduce %.1f us (the deployment's NCCL share of its step)\n",
                hardware.copy_bytes_per_s / 1e9, hardware.int_ops_per_s / 1e12, hardware.allreduce_s * 1e6);
  out += line;
  return out;
}

}  // namespace dsmesh
