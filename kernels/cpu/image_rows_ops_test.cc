// The CPU ops of image rows in the language model (docs/vision.md): SpanWindowAttention against a
// double-precision loop over the visible positions, and MoeRoute's bias_vl choice on hash and routed layers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace dsmesh {
namespace {

class ImageRowsOpsTest : public ::testing::Test {
 protected:
  std::shared_ptr<Backend> be_ = MakeCpuBackend(1);
  std::mt19937 rng_{7};
  Tensor Random(std::vector<int64_t> shape) {
    Tensor t = be_->Alloc(DType::kF32, std::move(shape));
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = n(rng_);
    return t;
  }
};

TEST_F(ImageRowsOpsTest, SpanWindowAttentionSeesExactlyItsBounds) {
  const int64_t heads = 2, d = 8, n = 12, start = 20, window = 5, slots = 8;
  Tensor q = Random({n, heads * d}), kv = Random({n, d}), ring = Random({slots, d}), sinks = Random({heads});
  Tensor out = be_->Alloc(DType::kF32, {n, heads * d});
  // Rows 3..9 are a span [23, 29]: they see back to min(t-4, 23) and forward to 29; the others are causal.
  std::vector<int64_t> from(n), to(n);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = start + r;
    const bool in = r >= 3 && r <= 9;
    from[r] = in ? std::min<int64_t>(t - window + 1, start + 3) : t - window + 1;
    to[r] = in ? start + 9 : t;
  }
  be_->SpanWindowAttention(q, heads, d, start, ring, kv, window, from.data(), to.data(), nullptr, 0, 0, nullptr,
                           sinks, 0.3f, &out);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      auto key = [&](int64_t p) { return p < start ? ring.as<float>() + (p % slots) * d : kv.as<float>() + (p - start) * d; };
      const float* qh = q.as<float>() + (r * heads + h) * d;
      std::vector<double> s;
      double mx = sinks.as<float>()[h];
      for (int64_t p = from[r]; p <= to[r]; ++p) {
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(qh[i]) * key(p)[i];
        s.push_back(dot * 0.3);
        mx = std::max(mx, s.back());
      }
      double denom = std::exp(sinks.as<float>()[h] - mx);
      for (double& v : s) denom += (v = std::exp(v - mx));
      for (int64_t i = 0; i < d; ++i) {
        double want = 0;
        for (int64_t p = from[r]; p <= to[r]; ++p) want += s[p - from[r]] / denom * key(p)[i];
        EXPECT_NEAR(out.as<float>()[(r * heads + h) * d + i], want, 1e-5) << "row " << r << " head " << h;
      }
    }
  // Causal bounds give Attention's answer bit for bit.
  Tensor plain = be_->Alloc(DType::kF32, {n, heads * d});
  for (int64_t r = 0; r < n; ++r) from[r] = start + r - window + 1, to[r] = start + r;
  be_->SpanWindowAttention(q, heads, d, start, ring, kv, window, from.data(), to.data(), nullptr, 0, 0, nullptr,
                           sinks, 0.3f, &out);
  be_->Attention(q, heads, d, start, ring, kv, window, nullptr, 0, 0, nullptr, sinks, 0.3f, &plain);
  EXPECT_EQ(0, std::memcmp(out.data, plain.data, out.nbytes()));
  // A row may not reach past the step or further back than the ring holds.
  to[n - 1] = start + n;
  EXPECT_THROW(be_->SpanWindowAttention(q, heads, d, start, ring, kv, window, from.data(), to.data(), nullptr, 0, 0,
                                        nullptr, sinks, 0.3f, &out),
               std::runtime_error);
  to[n - 1] = start + n - 1;
  from[0] = start - window;
  EXPECT_THROW(be_->SpanWindowAttention(q, heads, d, start, ring, kv, window, from.data(), to.data(), nullptr, 0, 0,
                                        nullptr, sinks, 0.3f, &out),
               std::runtime_error);
}

TEST_F(ImageRowsOpsTest, MoeRouteTakesBiasVlForImageRowsOnEveryLayerKind) {
  const int64_t n = 4, E = 8;
  const int k = 2;
  Tensor logits = Random({n, E}), bias = Random({E}), bias_vl = be_->Alloc(DType::kF32, {E});
  bias_vl.as<float>()[5] = 50.0f;  // image rows must pick 5 and 6
  bias_vl.as<float>()[6] = 40.0f;
  Tensor tid2eid = be_->Alloc(DType::kI32, {16, k});
  for (int64_t i = 0; i < 16 * k; ++i) tid2eid.as<int32_t>()[i] = static_cast<int32_t>(i % 3);  // experts 0..2
  const std::vector<int32_t> tokens = {3, 4, 5, 6};
  const std::vector<uint8_t> image = {0, 1, 0, 1};
  for (bool hash : {true, false}) {
    RouterParams p;
    p.top_k = k;
    p.routed_scale = 1.5f;
    p.hash = hash;
    p.bias = hash ? nullptr : &bias;
    p.tid2eid = hash ? &tid2eid : nullptr;
    p.image_rows = image.data();
    p.bias_vl = &bias_vl;
    Tensor idx = be_->Alloc(DType::kI32, {n, k}), wt = be_->Alloc(DType::kF32, {n, k});
    be_->MoeRoute(logits, tokens.data(), p, &idx, &wt);
    for (int64_t r = 0; r < n; ++r) {
      const int32_t* ix = idx.as<int32_t>() + r * k;
      if (image[r]) {
        EXPECT_EQ(ix[0], 5) << "hash " << hash << " row " << r;
        EXPECT_EQ(ix[1], 6) << "hash " << hash << " row " << r;
      } else if (hash) {
        EXPECT_EQ(ix[0], tid2eid.as<int32_t>()[tokens[r] * k]);
      } else {
        EXPECT_NE(ix[0], 5);  // text rows keep their own bias, which does not favour 5 by 50
      }
      // Weights from the unbiased scores.
      double s0 = std::sqrt(std::log1p(std::exp(static_cast<double>(logits.as<float>()[r * E + ix[0]]))));
      double s1 = std::sqrt(std::log1p(std::exp(static_cast<double>(logits.as<float>()[r * E + ix[1]]))));
      EXPECT_NEAR(wt.as<float>()[r * k], s0 / (s0 + s1) * 1.5, 1e-5);
    }
  }
  RouterParams missing;
  missing.top_k = k;
  missing.image_rows = image.data();
  Tensor idx = be_->Alloc(DType::kI32, {n, k}), wt = be_->Alloc(DType::kF32, {n, k});
  EXPECT_THROW(be_->MoeRoute(logits, tokens.data(), missing, &idx, &wt), std::runtime_error);
}

}  // namespace
}  // namespace dsmesh
