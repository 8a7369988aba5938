// The byte formulas of kernels/op_bytes.h against values worked out by hand for V4-Flash shapes.
#include "kernels/op_bytes.h"

#include <gtest/gtest.h>

#include <vector>

namespace dsmesh::op_bytes {
namespace {

TEST(OpBytes, Exl3WeightIsTheTrellisAndBothSignVectors) {
  // wq_a of V4-Flash at K6: 4096 x 1024 weights at 6 bits = 3 MiB, suh 8 KiB, svh 2 KiB.
  EXPECT_DOUBLE_EQ(Exl3Weight(4096, 1024, 6), 3145728.0 + 8192 + 2048);
  // One routed expert's gate at K2: 4096 x 2048 / 4 = 2 MiB.
  EXPECT_DOUBLE_EQ(Exl3Weight(4096, 2048, 2), 2097152.0 + 8192 + 4096);
  EXPECT_DOUBLE_EQ(Exl3Weight(128, 128, 1), 2048.0 + 256 + 256);
}

TEST(OpBytes, DenseWeightAndLinearActivations) {
  // The bf16 head of V4-Flash: 129280 x 4096 x 2 bytes.
  EXPECT_DOUBLE_EQ(DenseWeight(int64_t{129280} * 4096, 2), 1059061760.0);
  // One row through a 4096 -> 1024 linear: 16 KiB in, 4 KiB out; with a bias 4 KiB more.
  EXPECT_DOUBLE_EQ(LinearActivations(1, 4096, 1024, false), 16384.0 + 4096);
  EXPECT_DOUBLE_EQ(LinearActivations(4, 4096, 1024, true), 4 * 16384.0 + 4 * 4096 + 4096);
}

TEST(OpBytes, ElementwiseOps) {
  EXPECT_DOUBLE_EQ(RmsNorm(4096, 4096, true), 4.0 * (4096 + 4096 + 4096));
  EXPECT_DOUBLE_EQ(RmsNorm(8 * 512, 512, false), 4.0 * 2 * 8 * 512);
  EXPECT_DOUBLE_EQ(Add(100), 1200.0);
  EXPECT_DOUBLE_EQ(Scale(100), 800.0);
  EXPECT_DOUBLE_EQ(SwiGlu(2048), 4.0 * 3 * 2048);
  EXPECT_DOUBLE_EQ(Copy(1000), 2000.0);
  // 2 rows, 64 heads, 64 rotated dims: 2 * 64 * 64 floats read and written, 2 positions.
  EXPECT_DOUBLE_EQ(Rope(2, 64, 64), 4.0 * 2 * 2 * 64 * 64 + 16);
  // 3 tokens of a bf16 table of width 4096: ids, rows read, f32 rows written.
  EXPECT_DOUBLE_EQ(Embedding(3, 4096, 2), 12.0 + 3 * 4096 * 2 + 3 * 4096 * 4);
}

TEST(OpBytes, HyperConnections) {
  // One row, hc 4, D 4096: X 16384 floats, fn 6*4 x 16384 floats, y 4096, post 4, comb 16.
  EXPECT_DOUBLE_EQ(HcPre(1, 4096, 4), 4.0 * (16384 + 24 * 16384 + 4096 + 4 + 16));
  EXPECT_DOUBLE_EQ(HcPost(1, 4096, 4), 4.0 * (16384 + 4096 + 4 + 16 + 16384));
  EXPECT_DOUBLE_EQ(HcExpand(2, 4096, 4), 4.0 * (2 * 4096 + 2 * 16384));
  EXPECT_DOUBLE_EQ(HcHead(1, 4096, 4), 4.0 * (16384 + 4 * 16384 + 4096));
}

TEST(OpBytes, RoutingAttentionAndIndexer) {
  // 1 row, 256 experts, top 6, with the correction bias: logits and bias read, 6 ids and 6 weights written.
  EXPECT_DOUBLE_EQ(MoeRoute(1, 256, 6, true), 4.0 * 512 + 48);
  EXPECT_DOUBLE_EQ(MoeRoute(2, 256, 6, false), 4.0 * 512 + 96);
  EXPECT_DOUBLE_EQ(MoeExpertsActivations(1, 4096, 6), 4.0 * 3 * 4096 + 48);
  // 1 row, 64 heads of 512: q and out 2 x 32768 floats, 64 sinks, 128 window + 512 entries of 2 KiB.
  EXPECT_DOUBLE_EQ(Attention(1, 64, 512, 640, 2048), 4.0 * (65536 + 64) + 640.0 * 2048);
  // 1 row, 64 heads of 128, 1024 keys of 512 bytes, top 512.
  EXPECT_DOUBLE_EQ(IndexerTopK(1, 64, 128, 1024, 512, 512), 4.0 * (8192 + 64) + 1024.0 * 512 + 2048);
}

TEST(OpBytes, DistinctIdsCountEachExpertOnce) {
  // Two rows of top-3 sharing expert 7; -1 (no expert) is not read.
  const std::vector<int32_t> ids = {7, 3, 200, 7, 5, -1};
  EXPECT_DOUBLE_EQ(DistinctIdBytes(ids.data(), 6, 10.0), 40.0);
  EXPECT_DOUBLE_EQ(DistinctIdBytes(ids.data(), 0, 10.0), 0.0);
}

}  // namespace
}  // namespace dsmesh::op_bytes
