#include "kernels/kv_rows.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace dsmesh {
namespace {

double RelL2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / den);
}

TEST(KvRows, BytesAreTheCostedLayouts) {
  // V4-Flash: entries of 512 with 64 rope dims, indexer keys of 128 (model/kv_layout.h: 580 B and 132 B).
  EXPECT_EQ(KvRowBytes(DType::kU8, 512, 64), 580);
  EXPECT_EQ(KvRowBytes(DType::kU8, 128, 0), 132);
  EXPECT_EQ(KvRowBytes(DType::kBF16, 512, 64), 1024);
  EXPECT_EQ(KvRowBytes(DType::kF32, 512, 64), 2048);
  EXPECT_THROW(KvRowBytes(DType::kF16, 512, 64), std::invalid_argument);
}

TEST(KvRows, RoundTripsWithinEachFormsPrecision) {
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const int64_t rows = 33, dim = 96, rope = 16;
  std::vector<float> x(rows * dim);
  for (float& v : x) v = g(rng) * 3.0f;
  x[5] = 0.0f;
  for (int64_t i = 0; i < dim; ++i) x[7 * dim + i] = 0.0f;  // an all-zero row (scale 1, zeros back)
  for (DType s : {DType::kF32, DType::kBF16, DType::kU8}) {
    std::vector<uint8_t> stored(rows * KvRowBytes(s, dim, rope));
    std::vector<float> back(rows * dim, -1.0f);
    EncodeKvRows(x.data(), rows, dim, rope, s, stored.data());
    DecodeKvRows(stored.data(), rows, dim, rope, s, back.data());
    const double err = RelL2(back, x);
    std::printf("%s: rel L2 %.3g\n", DTypeName(s), err);
    if (s == DType::kF32) EXPECT_EQ(err, 0.0);
    if (s == DType::kBF16) EXPECT_LT(err, 4e-3);    // 8 mantissa bits: <= 2^-9 relative per value
    if (s == DType::kU8) EXPECT_LT(err, 4e-2);      // e4m3: 3 mantissa bits over a per-row scale
    for (int64_t i = 0; i < dim; ++i) EXPECT_EQ(back[7 * dim + i], 0.0f);
    EXPECT_EQ(back[5], 0.0f);
    if (s == DType::kU8) {
      // The rope dims are bf16, not fp8: their error is bf16's.
      double num = 0, den = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = dim - rope; i < dim; ++i) {
          const double d = back[r * dim + i] - x[r * dim + i];
          num += d * d, den += x[r * dim + i] * x[r * dim + i];
        }
      EXPECT_LT(std::sqrt(num / den), 4e-3);
      // The row's largest magnitude is stored exactly (it maps to 448).
      float amax = 0;
      int64_t at = 0;
      for (int64_t i = 0; i < dim - rope; ++i)
        if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), at = i;
      EXPECT_NEAR(back[at], x[at], 1e-6f * amax);
    }
  }
}

}  // namespace
}  // namespace dsmesh
