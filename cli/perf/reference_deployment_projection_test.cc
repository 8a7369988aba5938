#include "cli/perf/reference_deployment_projection.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "model/v4_flash_config.h"

namespace dsmesh {
namespace {

TEST(ReferenceDeploymentProjection, PerKindOpsSumToTheFloorsOps) {
  const ModelConfig c = ModelConfig::FromJson(kV4FlashConfigJson, "v4-flash");
  const DecodeStepFloor f = ComputeDecodeStepFloor(c, Exl3BitsSpec::Parse("experts=2,dense=6"), DecodeStepShape{});
  EXPECT_GT(f.dense_ops, 0);
  EXPECT_GT(f.expert_ops, 0);
  EXPECT_EQ(f.head_ops, 0);  // the deployment's head is bf16
  EXPECT_DOUBLE_EQ(f.decode_ops, f.dense_ops + f.expert_ops + f.head_ops);
}

TEST(ReferenceDeploymentProjection, EfficiencyTimesRtxFloorPlusCollectives) {
  const ModelConfig c = ModelConfig::FromJson(kV4FlashConfigJson, "v4-flash");
  const Exl3BitsSpec bits = Exl3BitsSpec::Parse("experts=2,dense=6");
  const std::vector<MeasuredPhase> phases = {{"routed experts / MoeExperts", 4.0},
                                             {"attention inputs (hc, norms, projections, rope) / LinearBatch", 2.0},
                                             {"attention inputs (hc, norms, projections, rope) / HcPre", 1.0},
                                             {"shared expert / SharedExpert", 2.0},
                                             {"head + logits / Linear head.weight [BF16]", 0.5},
                                             {"attention core / Attention", 1.0},
                                             {"(host gaps between ops)", 1.5}};
  // Graphs took half the eager time: every phase is halved first.
  const ReferenceDeploymentProjection p = ProjectToReferenceDeployment(c, bits, 1, 4096, phases, 6.0, 12.0);
  std::printf("%s", p.Describe(1).c_str());
  ASSERT_EQ(p.kinds.size(), 4u);
  double sum = 0;
  for (const ProjectedKind& k : p.kinds) {
    sum += k.rtx_ms;
    if (k.kind == "latency-bound") {
      EXPECT_DOUBLE_EQ(k.h200_ms, 1.75);
      EXPECT_DOUBLE_EQ(k.rtx_ms, k.h200_ms);
    } else {
      EXPECT_GT(k.h200_floor_ms, 0);
      EXPECT_NEAR(k.rtx_ms, k.h200_ms / k.h200_floor_ms * k.rtx_floor_ms, 1e-12);
      EXPECT_DOUBLE_EQ(k.rtx_fixed_cost_ms, std::max(k.h200_ms, k.rtx_floor_ms));
    }
    if (k.kind == "dense linears") {
      EXPECT_DOUBLE_EQ(k.h200_ms, 2.0);
    }
    if (k.kind == "routed experts") {
      EXPECT_DOUBLE_EQ(k.h200_ms, 2.0);
      // One RTX PRO 2000's floor: its eighth of the expert slices over the card's bandwidth and integer rate.
      DecodeStepShape tp8;
      tp8.world = 8;
      tp8.kv = KvCacheDtype::kF32;
      const DecodeStepFloor f = ComputeDecodeStepFloor(c, bits, tp8);
      const ReferenceDeploymentHardware hardware;
      EXPECT_NEAR(k.rtx_floor_ms,
                  1e3 * std::max(f.expert_bytes / hardware.copy_bytes_per_s, f.expert_ops / hardware.int_ops_per_s), 1e-9);
    }
  }
  EXPECT_EQ(p.allreduces, 86);
  EXPECT_NEAR(p.collectives_ms, 86 * ReferenceDeploymentHardware{}.allreduce_s * 1e3, 1e-12);
  EXPECT_NEAR(p.rtx_ms, sum + p.collectives_ms, 1e-9);
  EXPECT_NEAR(p.h200_ms, 6.0, 1e-12);
}

}  // namespace
}  // namespace dsmesh
