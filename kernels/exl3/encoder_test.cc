// The encoder: ideal tiles re-encode with zero error for every K and codebook; MSE on i.i.d. Gaussian
// tiles per K (QTIP reports ~0.069 at K=2 for 16-bit trellis codes; the bound here is 0.075, with about
// 4x less error per extra bit); and whole linears round-trip through the decoder.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/half.h"
#include "kernels/exl3/exl3_linear.h"
#include "kernels/exl3/quantize_linear.h"
#include "kernels/exl3/trellis.h"
#include "kernels/exl3/viterbi.h"

namespace dsmesh {
namespace {

const Exl3Codebook kAllCodebooks[] = {Exl3Codebook::k3Inst, Exl3Codebook::kMcg, Exl3Codebook::kMul1};

TEST(Exl3Encoder, IdealTilesReencodeExactly) {
  std::mt19937 rng(21);
  for (int K = 1; K <= 8; ++K) {
    for (Exl3Codebook cb : kAllCodebooks) {
      Exl3TileEncoder enc(K, cb);
      const float* table = Exl3CodebookTableF32(cb);
      for (int rep = 0; rep < 2; ++rep) {
        std::vector<uint16_t> tile(16 * K), packed(16 * K);
        for (auto& w : tile) w = static_cast<uint16_t>(rng());
        uint16_t truth[256], states[256], unpacked[256];
        Exl3UnpackTileStates(tile.data(), K, truth);
        float targets[256];
        for (int t = 0; t < 256; ++t) targets[t] = table[truth[t]];
        const double err = enc.Encode(targets, states);
        ASSERT_EQ(err, 0.0) << "K=" << K << " cb=" << Exl3CodebookName(cb);
        ASSERT_TRUE(Exl3StatesTailBiting(states, K)) << "K=" << K;
        Exl3PackTileStates(states, K, packed.data());
        Exl3UnpackTileStates(packed.data(), K, unpacked);
        for (int t = 0; t < 256; ++t) {
          ASSERT_EQ(unpacked[t], states[t]) << "K=" << K << " t=" << t;
          ASSERT_EQ(table[unpacked[t]], targets[t]) << "K=" << K << " t=" << t;
        }
      }
    }
  }
}

// The AVX-512 search (when this CPU has it) and the AVX2 search pick the same states.
TEST(Exl3Encoder, Avx512AndAvx2PathsAgree) {
  if (!Exl3EncoderCanUseAvx512()) GTEST_SKIP() << "this CPU has no AVX-512; only the AVX2 path exists here";
  std::mt19937 rng(8);
  std::normal_distribution<float> nd;
  for (int K = 1; K <= 8; ++K) {
    Exl3TileEncoder wide(K, Exl3Codebook::kMcg, true), narrow(K, Exl3Codebook::kMcg, false);
    ASSERT_TRUE(wide.uses_avx512());
    ASSERT_FALSE(narrow.uses_avx512());
    float targets[256];
    for (float& t : targets) t = nd(rng) * 1.24f;
    uint16_t a[256], b[256];
    EXPECT_EQ(wide.Encode(targets, a), narrow.Encode(targets, b)) << "K=" << K;
    for (int t = 0; t < 256; ++t) ASSERT_EQ(a[t], b[t]) << "K=" << K << " t=" << t;
  }
}

// Normalized MSE on unit Gaussian tiles scaled to the codebook's std; printed per K.
double GaussianMse(int K, Exl3Codebook cb, int tiles, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  const float scale = cb == Exl3Codebook::kMul1 ? 1.00031f : 1.24411f;
  std::vector<float> w(static_cast<size_t>(tiles) * 256);
  // Encoded at the per-K global scale the quantizer uses; the error is measured in unscaled units.
  const float g = static_cast<float>(Exl3DefaultGlobalScale(K));
  for (auto& v : w) v = nd(rng) * scale * g;
  std::vector<uint16_t> trellis(static_cast<size_t>(tiles) * 16 * K);
  const double err = EncodeExl3Tiles(w.data(), 16 * tiles, 16, K, cb, trellis.data());
  // The packed result must decode to exactly what the encoder measured.
  Exl3Weight dec;
  dec.K = K;
  dec.codebook = cb;
  uint16_t tile[256];
  double err2 = 0;
  for (int i = 0; i < tiles; ++i) {
    Exl3DecodeTileFp16(trellis.data() + i * 16 * K, K, cb, tile);
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) {
        const double d = Fp16ToFloat(tile[16 * r + c]) - w[(16 * i + r) * 16 + c];
        err2 += d * d;
      }
  }
  EXPECT_NEAR(err2, err, 1e-6 * err + 1e-9) << "decoded error differs from the encoder's, K=" << K;
  return err / (double(tiles) * 256 * scale * scale * g * g);
}

TEST(Exl3Encoder, GaussianMsePerK) {
  const double bound[9] = {0, 0.3, 0.075, 0.1, 0.1, 0.1, 0.07, 0.05, 0.04};  // K=2 is the bound
  double mse[9] = {};
  for (int K = 1; K <= 8; ++K) {
    mse[K] = GaussianMse(K, Exl3Codebook::kMcg, 24, 1000 + K);
    std::printf("EXL3 encoder, i.i.d. Gaussian tiles, MCG, K=%d: normalized MSE %.5f", K, mse[K]);
    if (K > 1) std::printf("  (%.2fx below K=%d)", mse[K - 1] / mse[K], K - 1);
    std::printf("\n");
    EXPECT_LE(mse[K], bound[K]) << "K=" << K;
  }
  // About 4x per extra bit up to K=6. Beyond that the 16-bit trellis approaches its limit (at K=8 each step
  // picks among 256 pseudo-random codebook values with 8 bits of memory), so the drop shrinks; it must
  // still fall with every bit.
  for (int K = 2; K <= 6; ++K) {
    EXPECT_GT(mse[K - 1] / mse[K], 3.3) << "K=" << K;
    EXPECT_LT(mse[K - 1] / mse[K], 5.0) << "K=" << K;
  }
  for (int K = 7; K <= 8; ++K) EXPECT_GT(mse[K - 1] / mse[K], 1.5) << "K=" << K;
  for (Exl3Codebook cb : {Exl3Codebook::k3Inst, Exl3Codebook::kMul1}) {
    const double m2 = GaussianMse(2, cb, 16, 77);
    std::printf("EXL3 encoder, i.i.d. Gaussian tiles, %s, K=2: normalized MSE %.5f\n", Exl3CodebookName(cb), m2);
    EXPECT_LE(m2, 0.085) << Exl3CodebookName(cb);
  }
}

// A whole linear: quantize, then the CPU linear must approximate x W^T with the expected error, padded
// outputs must be exactly zero scales, and more bits must mean less error.
TEST(Exl3Encoder, QuantizedLinearRoundTrip) {
  const int64_t out = 300, in = 200;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> W(out * in);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) W[o * in + i] = nd(rng) * 0.02f * (1 + (o % 7)) * (1 + 0.5f * (i % 3));
  std::vector<float> x(3 * in), y(3 * out);
  for (auto& v : x) v = nd(rng);
  double prev_err = 1e9;
  for (int K : {2, 4, 6}) {
    Exl3QuantOptions opt;
    opt.K = K;
    const Exl3QuantizedLinear q = QuantizeExl3Linear(W.data(), out, in, opt);
    ASSERT_EQ(q.trellis.shape, (std::vector<int64_t>{256 / 16, 384 / 16, 16 * K}));
    for (int64_t c = out; c < 384; ++c) ASSERT_EQ(q.svh.as<uint16_t>()[c] & 0x7FFF, 0) << "padded column " << c;
    Exl3LinearCpu(q.AsWeight(), x.data(), 3, y.data());
    double err2 = 0, ref2 = 0;
    for (int r = 0; r < 3; ++r)
      for (int64_t o = 0; o < out; ++o) {
        double ref = 0;
        for (int64_t i = 0; i < in; ++i) ref += double(x[r * in + i]) * W[o * in + i];
        err2 += (y[r * out + o] - ref) * (y[r * out + o] - ref);
        ref2 += ref * ref;
      }
    const double rel = std::sqrt(err2 / ref2);
    std::printf("QuantizeExl3Linear 300x200 K=%d: output rel L2 error %.4f, rotated MSE/var %.5f, g=%.3f\n", K, rel,
                q.stats.rotated_mse / q.stats.rotated_var, q.stats.scale);
    EXPECT_LT(rel, K == 2 ? 0.35 : K == 4 ? 0.1 : 0.03) << "K=" << K;
    EXPECT_LT(rel, prev_err / 2.5) << "K=" << K;
    prev_err = rel;
  }
}

}  // namespace
}  // namespace dsmesh
