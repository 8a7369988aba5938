// The decode-step floor of V4-Flash with the reference deployment's pack (experts K2, dense K6): the estimate is
// about 7.4 GB per single-stream step at 4K context; 4 streams touch more experts; TP8 divides the split
// parts; the KV read grows with context.
#include "cli/perf/roofline.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "model/v4_flash_config.h"

namespace dsmesh {
namespace {

TEST(Roofline, V4FlashReferenceDeploymentPack) {
  const ModelConfig c = ModelConfig::FromJson(kV4FlashConfigJson, "v4-flash");
  const Exl3BitsSpec bits = Exl3BitsSpec::Parse("experts=2,dense=6");
  DecodeStepShape one;
  const DecodeStepFloor f1 = ComputeDecodeStepFloor(c, bits, one);
  std::printf("1 stream, 4K: %s\n", f1.Describe().c_str());
  EXPECT_NEAR(f1.bytes() / 1e9, 7.4, 0.6);
  EXPECT_NEAR(f1.expected_experts_per_layer, 6.0, 1e-9);
  EXPECT_GT(f1.byte_floor_s, 1.4e-3);
  EXPECT_LT(f1.floor_s(), 2.6e-3);

  DecodeStepShape four = one;
  four.streams = 4;
  const DecodeStepFloor f4 = ComputeDecodeStepFloor(c, bits, four);
  std::printf("4 streams, 4K: %s\n", f4.Describe().c_str());
  EXPECT_NEAR(f4.expected_experts_per_layer, 256 * (1 - std::pow(1 - 6.0 / 256, 4)), 1e-9);
  EXPECT_GT(f4.expert_bytes, 3.5 * f1.expert_bytes);
  EXPECT_EQ(f4.dense_bytes, f1.dense_bytes);

  DecodeStepShape verify = four;
  verify.rows_per_stream = 4;
  const DecodeStepFloor fv = ComputeDecodeStepFloor(c, bits, verify);
  std::printf("4 x 4 verify, 4K: %s\n", fv.Describe().c_str());
  EXPECT_GT(fv.decode_ops, f4.decode_ops);  // the packed loop above 8 rows costs more per weight

  DecodeStepShape tp8 = one;
  tp8.world = 8;
  const DecodeStepFloor f8 = ComputeDecodeStepFloor(c, bits, tp8);
  std::printf("1 stream, 4K, per rank at TP8: %s\n", f8.Describe().c_str());
  EXPECT_LT(f8.bytes(), f1.bytes() / 3);

  DecodeStepShape longctx = one;
  longctx.context = 166000;
  const DecodeStepFloor fl = ComputeDecodeStepFloor(c, bits, longctx);
  std::printf("1 stream, 166K: %s\n", fl.Describe().c_str());
  EXPECT_GT(fl.kv_bytes, 10 * f1.kv_bytes);
}

}  // namespace
}  // namespace dsmesh
