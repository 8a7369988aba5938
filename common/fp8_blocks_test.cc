// FP8 block scales: per-row encoding round trip within e4m3 precision, DeepSeek's 128 x 128 block grid,
// and clear errors for scale shapes and dtypes that fit no block grid.
#include "common/fp8_blocks.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/half.h"

namespace dsmesh {
namespace {

TEST(Fp8Blocks, RowRoundTripWithinE4m3Precision) {
  const int64_t rows = 37, cols = 96;
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> w(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) w[r * cols + c] = n(rng) * std::ldexp(1.0f, static_cast<int>(r % 9) - 6);
  for (int64_t c = 0; c < cols; ++c) w[3 * cols + c] = 0;  // an all-zero row
  const Fp8RowQuantized q = QuantizeFp8Rows(w.data(), rows, cols);
  ASSERT_EQ(q.weight.dtype, DType::kF8E4M3);
  ASSERT_EQ(q.scale.shape, (std::vector<int64_t>{rows, 1}));
  const Tensor back = DequantizeFp8ToBf16(q.weight, q.scale, "test");
  const uint16_t* b = static_cast<const uint16_t*>(back.data);
  for (int64_t r = 0; r < rows; ++r) {
    const float s = q.scale.as<float>()[r];
    EXPECT_EQ(std::exp2(std::round(std::log2(s))), s) << "row " << r << ": scale is not a power of two";
    float amax = 0;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
    for (int64_t c = 0; c < cols; ++c) {
      const float x = w[r * cols + c], y = Bf16ToFloat(b[r * cols + c]);
      // e4m3: 3 mantissa bits -> relative error <= 2^-4 for normals; subnormals (below 2^-6 * s) are
      // spaced 2^-9 * s, so the absolute error is at most 2^-10 * s.
      EXPECT_LE(std::fabs(x - y), std::max(std::fabs(x) * 0.0625f, s * std::ldexp(1.0f, -10)) + 1e-30f)
          << r << "," << c << ": " << x << " vs " << y;
      // The bf16 dequantization of fp8 x power-of-two is exact.
      EXPECT_EQ(y, Fp8E4M3ToFloat(static_cast<const uint8_t*>(q.weight.data)[r * cols + c]) * s);
    }
    if (amax > 0) EXPECT_GT(amax / s, 224.0f) << r;
  }
}

TEST(Fp8Blocks, DeepSeekBlockGrid) {
  const int64_t rows = 200, cols = 300;  // a ragged last block in both directions
  Tensor w = AllocateTensor(DType::kF8E4M3, {rows, cols});
  uint8_t* q = static_cast<uint8_t*>(w.data);
  for (int64_t i = 0; i < rows * cols; ++i) q[i] = FloatToFp8E4M3(1.5f);
  Tensor s = AllocateTensor(DType::kF32, {2, 3});
  for (int i = 0; i < 6; ++i) s.as<float>()[i] = static_cast<float>(i + 1);
  const Fp8BlockSize b = Fp8BlockSizeOf(rows, cols, s.shape, "x");
  EXPECT_EQ(b.rows, 100);  // ceil(200/2); 128 x 128 would give the same grid [2, 3]
  EXPECT_EQ(b.cols, 100);
  const Tensor out = DequantizeFp8ToBf16(w, s, "x");
  const uint16_t* o = static_cast<const uint16_t*>(out.data);
  EXPECT_EQ(Bf16ToFloat(o[0]), 1.5f);
  EXPECT_EQ(Bf16ToFloat(o[299]), 4.5f);
  EXPECT_EQ(Bf16ToFloat(o[150 * cols + 150]), 7.5f);
}

TEST(Fp8Blocks, BadScalesNameTheTensor) {
  Tensor w = AllocateTensor(DType::kF8E4M3, {10, 8});
  auto expect = [&](const Tensor& s, const std::string& what) {
    try {
      DequantizeFp8ToBf16(w, s, "file.safetensors: \"embed.scale\"");
      ADD_FAILURE() << "accepted " << what;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("embed.scale"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect(AllocateTensor(DType::kF32, {7, 1}), "no block grid");  // blocks of 2 rows make 5, not 7
  expect(AllocateTensor(DType::kF32, {10, 1, 1}), "no block grid");
  expect(AllocateTensor(DType::kI32, {10, 1}), "dtype I32");
  Tensor nan = AllocateTensor(DType::kF32, {10});
  for (int i = 0; i < 10; ++i) nan.as<float>()[i] = i == 4 ? NAN : 1.0f;
  expect(nan, "non-finite");
  EXPECT_NO_THROW(DequantizeFp8ToBf16(w, AllocateTensor(DType::kF32, {10}), "1-D per-row scale"));
}

}  // namespace
}  // namespace dsmesh
