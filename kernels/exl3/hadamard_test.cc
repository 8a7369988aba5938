// Hadamard 128 against the definition H[a][b] = (-1)^popcount(a & b) in fp64.
#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/exl3/hadamard.h"

namespace dsmesh {
namespace {

TEST(Hadamard128, MatchesDefinition) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> v(128);
  for (auto& x : v) x = nd(rng);
  std::vector<float> h = v;
  Hadamard128(h.data(), 1.0f);
  for (int a = 0; a < 128; ++a) {
    double ref = 0;
    for (int b = 0; b < 128; ++b) ref += (std::popcount(unsigned(a & b)) % 2 ? -1.0 : 1.0) * v[b];
    EXPECT_NEAR(h[a], ref, 1e-4) << a;
  }
}

TEST(Hadamard128, OrthonormalScaleIsSelfInverse) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> v(256);
  for (auto& x : v) x = nd(rng);
  std::vector<float> h = v;
  Hadamard128Rows(h.data(), 2, 128, kHadamard128Scale);
  Hadamard128Rows(h.data(), 2, 128, kHadamard128Scale);
  for (int i = 0; i < 256; ++i) EXPECT_NEAR(h[i], v[i], 1e-5);
  EXPECT_THROW(Hadamard128Rows(h.data(), 1, 200, 1.0f), std::invalid_argument);
}

}  // namespace
}  // namespace dsmesh
