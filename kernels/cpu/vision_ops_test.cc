// The vision-encoder ops of the CPU backend against plain double-precision loops written from the op
// descriptions in kernels/backend.h, on random inputs with odd sizes (grids that r does not divide, spans of
// one row, heads of a width that is not a multiple of 8).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace dsmesh {
namespace {

class VisionOpsTest : public ::testing::Test {
 protected:
  std::shared_ptr<Backend> be_ = MakeCpuBackend();
  std::mt19937 rng_{99};

  Tensor Rand(std::vector<int64_t> shape, float scale = 1.0f) {
    Tensor t = be_->Alloc(DType::kF32, std::move(shape));
    std::normal_distribution<float> d(0.0f, scale);
    for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = d(rng_);
    return t;
  }
  static void ExpectClose(const Tensor& got, const std::vector<double>& want, double tol) {
    ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got.as<float>()[i], want[i], tol * (1 + std::fabs(want[i]))) << "index " << i;
  }
};

TEST_F(VisionOpsTest, RotateHalf) {
  const int64_t n = 5, heads = 3, hd = 12, half = hd / 2;
  Tensor x = Rand({n, heads * hd}), angles = Rand({n, half}, 3.0f);
  std::vector<double> want(x.numel());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < hd; ++i) {
        const float* p = x.as<float>() + (r * heads + h) * hd;
        const double a = angles.as<float>()[r * half + i % half];
        // torch: cat([x1 cos - x2 sin, x2 cos + x1 sin])
        want[(r * heads + h) * hd + i] = i < half ? p[i] * std::cos(a) - p[i + half] * std::sin(a)
                                                  : p[i] * std::cos(a) + p[i - half] * std::sin(a);
      }
  be_->RotateHalf(&x, heads, hd, angles);
  ExpectClose(x, want, 1e-5);
}

TEST_F(VisionOpsTest, SpanAttentionSeesOnlyItsSpan) {
  const int64_t heads = 2, d = 9;
  const std::vector<int64_t> spans = {0, 7, 8, 20};  // spans of 7, 1 and 12 rows
  const int64_t n = spans.back(), w = heads * d;
  Tensor q = Rand({n, w}), k = Rand({n, w}), v = Rand({n, w}), out = be_->Alloc(DType::kF32, {n, w});
  const float scale = 0.3f;
  std::vector<double> want(n * w, 0.0);
  for (size_t s = 0; s + 1 < spans.size(); ++s)
    for (int64_t r = spans[s]; r < spans[s + 1]; ++r)
      for (int64_t h = 0; h < heads; ++h) {
        std::vector<double> p;
        double mx = -1e300, sum = 0;
        for (int64_t j = spans[s]; j < spans[s + 1]; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += (double)q.as<float>()[r * w + h * d + i] * k.as<float>()[j * w + h * d + i];
          p.push_back(dot * scale);
          mx = std::max(mx, p.back());
        }
        for (double& e : p) sum += (e = std::exp(e - mx));
        for (int64_t j = spans[s]; j < spans[s + 1]; ++j)
          for (int64_t i = 0; i < d; ++i)
            want[r * w + h * d + i] += p[j - spans[s]] / sum * v.as<float>()[j * w + h * d + i];
      }
  be_->SpanAttention(q, k, v, heads, d, spans.data(), spans.size() - 1, scale, &out);
  ExpectClose(out, want, 1e-5);
  // A one-row span returns its own value row.
  for (int64_t i = 0; i < w; ++i) EXPECT_FLOAT_EQ(out.as<float>()[7 * w + i], v.as<float>()[7 * w + i]);
}

TEST_F(VisionOpsTest, SpanAttentionRejectsSpansThatMissRows) {
  Tensor q = Rand({4, 8}), out = be_->Alloc(DType::kF32, {4, 8});
  const std::vector<int64_t> spans = {0, 3};
  EXPECT_THROW(be_->SpanAttention(q, q, q, 2, 4, spans.data(), 1, 1.0f, &out), std::runtime_error);
}

TEST_F(VisionOpsTest, Gelu) {
  Tensor x = Rand({3, 1001}, 3.0f);
  std::vector<double> want;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.as<float>()[i];
    want.push_back(0.5 * v * (1 + std::erf(v / std::sqrt(2.0))));
  }
  be_->Gelu(&x);
  ExpectClose(x, want, 1e-6);
}

TEST_F(VisionOpsTest, Unfold2DMatchesTorchOrderAndPadsWithZeros) {
  for (int r : {1, 2, 3})
    for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 3}, {4, 5}, {7, 2}}) {
      const int64_t C = 5, bh = (h + r - 1) / r, bw = (w + r - 1) / r;
      Tensor x = Rand({h * w, C}), out = be_->Alloc(DType::kF32, {bh * bw, C * r * r});
      std::vector<double> want;
      // F.unfold of the [C, h', w'] grid zero-padded to multiples of r: block (by, bx) -> column, feature
      // index runs over (c, dy, dx).
      for (int64_t by = 0; by < bh; ++by)
        for (int64_t bx = 0; bx < bw; ++bx)
          for (int64_t c = 0; c < C; ++c)
            for (int dy = 0; dy < r; ++dy)
              for (int dx = 0; dx < r; ++dx) {
                const int64_t y = by * r + dy, xx = bx * r + dx;
                want.push_back(y < h && xx < w ? x.as<float>()[(y * w + xx) * C + c] : 0.0);
              }
      be_->Unfold2D(x, h, w, r, &out);
      ExpectClose(out, want, 0.0);
    }
}

TEST_F(VisionOpsTest, BiasedLinear) {
  // The ViT's projections carry a bias (LinearWeight::bias): y = x W^T + b.
  const int64_t m = 3, in = 11, outw = 6;
  Tensor x = Rand({m, in});
  LinearWeight lw;
  lw.in = in;
  lw.out = outw;
  lw.dense = Rand({outw, in});
  lw.bias = Rand({outw});
  Tensor y = be_->Alloc(DType::kF32, {m, outw});
  be_->Linear(x, lw, &y);
  std::vector<double> want;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t o = 0; o < outw; ++o) {
      double s = lw.bias.as<float>()[o];
      for (int64_t i = 0; i < in; ++i) s += (double)x.as<float>()[r * in + i] * lw.dense.as<float>()[o * in + i];
      want.push_back(s);
    }
  ExpectClose(y, want, 1e-5);
}

}  // namespace
}  // namespace dsmesh
