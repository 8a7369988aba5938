// The integer weights of a draw: exact at the top, within a few ulps of exp elsewhere, monotone over the
// float inputs the sampler feeds them, zero where they must be, and sums that fit below 2^53.
#include "kernels/sampling/sampling_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace dsmesh::sampling {
namespace {

TEST(SamplingMath, ShiftKeepsEverySumBelow2To53) {
  EXPECT_EQ(WeightShift(129280), 36);
  for (int64_t v : {1, 2, 3, 1000, 129280, 1 << 20})
    EXPECT_LE(static_cast<double>(v) * std::ldexp(1.0, WeightShift(v)), std::ldexp(1.0, 53)) << v;
}

TEST(SamplingMath, WeightIsTwoToTheShiftAtTheTopAndZeroBelowOne) {
  EXPECT_EQ(SampleWeight(0.0, 36), uint64_t{1} << 36);
  EXPECT_EQ(SampleWeight(-0.0, 36), uint64_t{1} << 36);
  EXPECT_EQ(SampleWeight(-std::numeric_limits<double>::infinity(), 36), 0u);
  EXPECT_EQ(SampleWeight(std::nan(""), 36), 0u);
  EXPECT_EQ(SampleWeight(-26.0, 36), 0u);  // 2^36 e^-26 = 0.35
  EXPECT_GT(SampleWeight(-24.0, 36), 0u);  // 2.6
}

TEST(SamplingMath, WeightFollowsExpToAFewUlps) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-24.0f, 0.0f);
  for (int i = 0; i < 200000; ++i) {
    const double d = u(rng);
    const double want = std::floor(std::ldexp(std::exp(d), 36));
    EXPECT_NEAR(static_cast<double>(SampleWeight(d, 36)), want, 1.0 + want * 1e-15) << d;
  }
}

TEST(SamplingMath, WeightIsMonotoneOverConsecutiveFloats) {
  // Runs of consecutive floats: from random points, around every switch of the range reduction
  // (odd multiples of ln2 / 2) and next to zero.
  auto walk = [](float from, int n) {
    float f = from;
    uint64_t prev = SampleWeight(f, 36);
    for (int i = 0; i < n && f < 0.0f; ++i) {
      f = std::nextafter(f, 1.0f);
      const uint64_t w = SampleWeight(f, 36);
      ASSERT_GE(w, prev) << f;
      prev = w;
    }
  };
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-27.0f, 0.0f);
  for (int i = 0; i < 20000; ++i) walk(u(rng), 64);
  for (int j = 1; j < 80; j += 2) walk(static_cast<float>(-j * 0.34657359027997264) - 1e-4f, 4000);
  walk(-1e-6f, 100000);
}

TEST(SamplingMath, OrderKeyOrdersFloatsAndEqualsSignedZeros) {
  const float xs[] = {-std::numeric_limits<float>::infinity(), -3.5f, -1e-30f, 0.0f, 1e-30f, 2.0f,
                      std::numeric_limits<float>::infinity()};
  for (size_t i = 0; i + 1 < std::size(xs); ++i) EXPECT_LT(OrderKey(xs[i]), OrderKey(xs[i + 1])) << xs[i];
  EXPECT_EQ(OrderKey(-0.0f), OrderKey(0.0f));
}

TEST(SamplingMath, CutsAndDrawTarget) {
  EXPECT_EQ(MinPWeight(0.0f, 36), 0u);
  EXPECT_EQ(MinPWeight(0.5f, 36), uint64_t{1} << 35);
  EXPECT_EQ(TopPWeight(0.5f, 10), 5u);
  EXPECT_EQ(TopPWeight(0.55f, 10), 6u);
  EXPECT_EQ(DrawTarget(0.0, 7), 0u);
  EXPECT_EQ(DrawTarget(0.999, 7), 6u);
  EXPECT_EQ(DrawTarget(1.0 - 0x1p-53, (uint64_t{1} << 53) - 1), (uint64_t{1} << 53) - 2);
}

}  // namespace
}  // namespace dsmesh::sampling
