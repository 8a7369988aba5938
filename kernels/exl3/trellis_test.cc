// Trellis tiles: the spec-derived one-tile vectors of docs/exl3-format.md §7.2, the element order of §2.4,
// pack/unpack round trips, and the fast AVX2 decoder against the scalar reference.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/half.h"
#include "common/tensor.h"
#include "kernels/exl3/exl3_linear.h"
#include "kernels/exl3/trellis.h"

namespace dsmesh {
namespace {

std::vector<uint16_t> SpecTile(int K) {
  std::vector<uint16_t> u(16 * K);
  for (int j = 0; j < 16 * K; ++j) u[j] = static_cast<uint16_t>((0x1234 + j * 0x9E37) % 65536);
  return u;
}

TEST(Exl3Trellis, ElementOrder) {
  const int expect[][2] = {{0, 0}, {1, 0}, {8, 0}, {9, 0}, {0, 8}, {1, 8}, {8, 8}, {9, 8}, {2, 0}};
  for (int t = 0; t < 9; ++t) {
    EXPECT_EQ(Exl3TileRow(t), expect[t][0]) << t;
    EXPECT_EQ(Exl3TileCol(t), expect[t][1]) << t;
  }
  EXPECT_EQ(Exl3TileRow(255), 15);
  EXPECT_EQ(Exl3TileCol(255), 15);
  std::vector<int> seen(256, 0);
  for (int t = 0; t < 256; ++t) ++seen[16 * Exl3TileRow(t) + Exl3TileCol(t)];
  for (int c : seen) EXPECT_EQ(c, 1);  // a permutation
}

TEST(Exl3Trellis, SpecTileStatesK4) {
  const std::vector<uint16_t> tile = SpecTile(4);
  uint16_t states[256];
  Exl3UnpackTileStates(tile.data(), 4, states);
  const uint16_t expect[8] = {0x386B, 0x86B0, 0x6B06, 0xB06B, 0x06B1, 0x6B12, 0xB123, 0x1234};
  for (int t = 0; t < 8; ++t) EXPECT_EQ(states[t], expect[t]) << t;
  EXPECT_EQ(states[255], 0x6386);
}

TEST(Exl3Trellis, SpecTileFirstStatePerK) {
  const uint16_t s0[8] = {0x726D, 0x729A, 0x00B5, 0x386B, 0xDED6, 0x99AC, 0xEB58, 0x46B0};
  for (int K = 1; K <= 8; ++K) {
    uint16_t states[256];
    Exl3UnpackTileStates(SpecTile(K).data(), K, states);
    EXPECT_EQ(states[0], s0[K - 1]) << "K=" << K;
  }
}

TEST(Exl3Trellis, SpecTileRow0AndSums) {
  const uint16_t row0[3][16] = {
      {0x3D08, 0xB85B, 0xB8EC, 0xB206, 0x3E48, 0x34A4, 0xBDB8, 0xB658, 0x38B8, 0xC313, 0x3EDC, 0x2AC0, 0xBC57, 0xBD4A, 0x41D2, 0xBA21},
      {0xB2AC, 0x3856, 0x3872, 0x3C40, 0xB960, 0xBF76, 0xB8F2, 0x360F, 0xBC93, 0x3F09, 0xA5A0, 0x3C38, 0xBC9E, 0xB7A2, 0xBEF6, 0x38F4},
      {0xBA30, 0xC12C, 0x3C8A, 0xB53A, 0xAC04, 0x32A8, 0x406C, 0xBBCF, 0xB7D3, 0xBFCE, 0x3E99, 0x3201, 0x373A, 0xBC0A, 0x3BE4, 0xB79C}};
  const double sums[8][3] = {{-8.308959961, 24.197387695, 3.902793884}, {14.661621094, 4.104003906, 16.012100220},
                             {4.766235352, -12.263671875, 3.091674805}, {5.005249023, -8.450073242, -13.199531555},
                             {-11.996948242, -2.609619141, 1.321762085}, {-2.532836914, 20.067993164, 4.999259949},
                             {7.760742188, -19.848266602, 9.840919495}, {6.346679688, 9.458251953, -2.409683228}};
  const Exl3Codebook cbs[3] = {Exl3Codebook::k3Inst, Exl3Codebook::kMcg, Exl3Codebook::kMul1};
  for (int c = 0; c < 3; ++c) {
    uint16_t out[256];
    Exl3DecodeTileFp16(SpecTile(4).data(), 4, cbs[c], out);
    for (int col = 0; col < 16; ++col) EXPECT_EQ(out[col], row0[c][col]) << Exl3CodebookName(cbs[c]) << " col " << col;
    for (int K = 1; K <= 8; ++K) {
      Exl3DecodeTileFp16(SpecTile(K).data(), K, cbs[c], out);
      double sum = 0;
      for (uint16_t h : out) sum += Fp16ToFloat(h);  // exact widening
      EXPECT_NEAR(sum, sums[K - 1][c], 5e-9) << Exl3CodebookName(cbs[c]) << " K=" << K;
    }
  }
}

TEST(Exl3Trellis, AllZeroAndAllOnes) {
  for (int K = 1; K <= 8; ++K) {
    std::vector<uint16_t> zeros(16 * K, 0), ones(16 * K, 0xFFFF);
    uint16_t out[256];
    Exl3DecodeTileFp16(zeros.data(), K, Exl3Codebook::kMcg, out);
    for (uint16_t h : out) ASSERT_EQ(h, 0x3F60);
    Exl3DecodeTileFp16(ones.data(), K, Exl3Codebook::kMcg, out);
    for (uint16_t h : out) ASSERT_EQ(h, 0x3ACD);
  }
}

TEST(Exl3Trellis, PackUnpackRoundTrip) {
  std::mt19937 rng(7);
  for (int K = 1; K <= 8; ++K) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<uint16_t> tile(16 * K), again(16 * K);
      for (auto& w : tile) w = static_cast<uint16_t>(rng());
      uint16_t states[256];
      Exl3UnpackTileStates(tile.data(), K, states);
      EXPECT_TRUE(Exl3StatesTailBiting(states, K));  // any bitstream is a valid tail-biting path
      Exl3PackTileStates(states, K, again.data());
      ASSERT_EQ(again, tile) << "K=" << K;
    }
    uint16_t broken[256] = {};
    broken[3] = 0xFFFF;
    EXPECT_FALSE(Exl3StatesTailBiting(broken, K));
  }
}

// The fast AVX2 decoder (behind Exl3ReconstructFp16) against the scalar reference, every K and codebook.
TEST(Exl3Trellis, FastDecoderMatchesReference) {
  std::mt19937 rng(11);
  for (int K = 1; K <= 8; ++K) {
    Tensor trellis = AllocateTensor(DType::kI16, {8, 16, 16 * K});
    for (int64_t i = 0; i < trellis.numel(); ++i) trellis.as<uint16_t>()[i] = static_cast<uint16_t>(rng());
    for (Exl3Codebook cb : {Exl3Codebook::k3Inst, Exl3Codebook::kMcg, Exl3Codebook::kMul1}) {
      Exl3Weight w;
      w.trellis = trellis;
      w.K = K;
      w.codebook = cb;
      const std::vector<uint16_t> fast = Exl3ReconstructFp16(w);
      uint16_t ref[256];
      for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 16; ++j) {
          Exl3DecodeTileFp16(trellis.as<uint16_t>() + (i * 16 + j) * 16 * K, K, cb, ref);
          for (int r = 0; r < 16; ++r)
            for (int c = 0; c < 16; ++c)
              ASSERT_EQ(fast[(16 * i + r) * 256 + 16 * j + c], ref[16 * r + c])
                  << "K=" << K << " cb=" << Exl3CodebookName(cb) << " tile " << i << "," << j;
        }
    }
  }
}

}  // namespace
}  // namespace dsmesh
