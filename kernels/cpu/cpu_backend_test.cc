// Every CPU backend op against a plain double-precision loop written straight from docs/model-v4.md, on
// random inputs and awkward sizes (odd widths, partial vector lanes, m not a multiple of the row group).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "common/half.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/dense_linear.h"
#include "kernels/cpu/thread_pool.h"

#include <atomic>

namespace dsmesh {
namespace {

class CpuOpsTest : public ::testing::Test {
 protected:
  std::shared_ptr<Backend> be_ = MakeCpuBackend();
  std::mt19937 rng_{1234};

  Tensor Rand(std::vector<int64_t> shape, float scale = 1.0f) {
    Tensor t = be_->Alloc(DType::kF32, std::move(shape));
    std::normal_distribution<float> d(0.0f, scale);
    for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = d(rng_);
    return t;
  }
  static void ExpectClose(const Tensor& got, const std::vector<double>& want, double tol, const std::string& what) {
    ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
    double scale = 1e-30;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got.as<float>()[i], want[i], tol * scale) << what << " index " << i;
  }
  static double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
};

TEST_F(CpuOpsTest, DenseLinearAllDtypes) {
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32})
    for (int64_t m : {1, 2, 3, 4, 5, 9})
      for (int64_t in : {7, 64, 130})
        for (int64_t out : {1, 17, 40}) {
          Tensor x = Rand({m, in});
          std::vector<uint8_t> w(out * in * DTypeSize(dt));
          std::normal_distribution<float> d(0, 1);
          for (int64_t i = 0; i < out * in; ++i) {
            float v = d(rng_);
            if (dt == DType::kBF16) reinterpret_cast<uint16_t*>(w.data())[i] = FloatToBf16(v);
            if (dt == DType::kF16) reinterpret_cast<uint16_t*>(w.data())[i] = FloatToFp16(v);
            if (dt == DType::kF32) reinterpret_cast<float*>(w.data())[i] = v;
          }
          std::vector<float> y(m * out), ref(m * out);
          cpu::DenseLinear(x.as<float>(), in, m, w.data(), dt, in, out, in, y.data(), out);
          cpu::DenseLinearReference(x.as<float>(), in, m, w.data(), dt, in, out, in, ref.data(), out);
          for (int64_t i = 0; i < m * out; ++i)
            ASSERT_NEAR(y[i], ref[i], 1e-4 * (1 + std::fabs(ref[i])))
                << DTypeName(dt) << " m=" << m << " in=" << in << " out=" << out;
        }
}

TEST_F(CpuOpsTest, LinearAndGroupedLinear) {
  const int64_t m = 3, groups = 2, in_g = 24, out_g = 5;
  Tensor x = Rand({m, groups * in_g});
  Tensor w = Rand({groups * out_g, in_g});
  LinearWeight lw;
  lw.in = in_g;
  lw.out = groups * out_g;
  lw.dense = w;
  Tensor y = be_->Alloc(DType::kF32, {m, groups * out_g});
  be_->GroupedLinear(x, lw, groups, &y);
  std::vector<double> want;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t o = 0; o < out_g; ++o) {
        double s = 0;
        for (int64_t i = 0; i < in_g; ++i)
          s += (double)x.as<float>()[r * groups * in_g + g * in_g + i] * w.as<float>()[(g * out_g + o) * in_g + i];
        want.push_back(s);
      }
  ExpectClose(y, want, 1e-5, "GroupedLinear");
}

TEST_F(CpuOpsTest, RmsNormWeightedAndPerHead) {
  Tensor x = Rand({3, 40}), w = Rand({20});
  Tensor y = be_->Alloc(DType::kF32, {3, 40});
  be_->RmsNorm(x, 20, &w, 1e-6f, &y);
  std::vector<double> want;
  for (int g = 0; g < 6; ++g) {
    double ss = 0;
    for (int k = 0; k < 20; ++k) ss += (double)x.as<float>()[g * 20 + k] * x.as<float>()[g * 20 + k];
    double r = 1.0 / std::sqrt(ss / 20 + 1e-6);
    for (int k = 0; k < 20; ++k) want.push_back(x.as<float>()[g * 20 + k] * r * w.as<float>()[k]);
  }
  ExpectClose(y, want, 1e-5, "RmsNorm");
}

TEST_F(CpuOpsTest, RopeRotatesInterleavedPairsOfTheLastDims) {
  const int64_t n = 3, heads = 2, hd = 12, rd = 4;
  Tensor x = Rand({n, heads * hd});
  Tensor orig = be_->Alloc(DType::kF32, {n, heads * hd});
  std::copy(x.as<float>(), x.as<float>() + x.numel(), orig.as<float>());
  std::vector<int64_t> pos = {0, 5, 1000};
  std::vector<float> inv = {1.0f, 0.01f};
  be_->Rope(&x, heads, hd, rd, pos.data(), inv, false);
  std::vector<double> want;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t k = 0; k < hd; ++k) {
        const float* o = orig.as<float>() + r * heads * hd + h * hd;
        if (k < hd - rd) {
          want.push_back(o[k]);
          continue;
        }
        int64_t j = k - (hd - rd), i = j / 2;
        double a = (double)(float)(pos[r] * inv[i]);
        double re = o[hd - rd + 2 * i], im = o[hd - rd + 2 * i + 1];
        want.push_back(j % 2 == 0 ? re * std::cos(a) - im * std::sin(a) : im * std::cos(a) + re * std::sin(a));
      }
  ExpectClose(x, want, 1e-5, "Rope");
  be_->Rope(&x, heads, hd, rd, pos.data(), inv, true);
  std::vector<double> back(orig.as<float>(), orig.as<float>() + orig.numel());
  ExpectClose(x, back, 1e-5, "inverse Rope");
}

// Plain hc_pre from docs/model-v4.md section 2.1: returns y, post, comb.
void HcPreReference(const float* X, const float* fn, const float* base, const float* scale, int hc, int64_t D,
                    int iters, double eps, std::vector<double>* y, std::vector<double>* post, std::vector<double>* comb) {
  const int64_t W = hc * D, K = (2 + hc) * hc;
  double ss = 0;
  for (int64_t i = 0; i < W; ++i) ss += (double)X[i] * X[i];
  const double r = 1.0 / std::sqrt(ss / W + eps);
  std::vector<double> mix(K);
  for (int64_t k = 0; k < K; ++k) {
    double s = 0;
    for (int64_t i = 0; i < W; ++i) s += (double)fn[k * W + i] * X[i];
    mix[k] = s * r;
  }
  std::vector<double> pre(hc);
  post->assign(hc, 0);
  comb->assign(hc * hc, 0);
  for (int i = 0; i < hc; ++i) pre[i] = 1 / (1 + std::exp(-(mix[i] * scale[0] + base[i]))) + eps;
  for (int i = 0; i < hc; ++i) (*post)[i] = 2 / (1 + std::exp(-(mix[hc + i] * scale[1] + base[hc + i])));
  auto& c = *comb;
  for (int i = 0; i < hc; ++i) {
    double mx = -1e300, sum = 0;
    for (int j = 0; j < hc; ++j) mx = std::max(mx, mix[2 * hc + i * hc + j] * scale[2] + base[2 * hc + i * hc + j]);
    for (int j = 0; j < hc; ++j) sum += c[i * hc + j] = std::exp(mix[2 * hc + i * hc + j] * scale[2] + base[2 * hc + i * hc + j] - mx);
    for (int j = 0; j < hc; ++j) c[i * hc + j] = c[i * hc + j] / sum + eps;
  }
  auto cols = [&] {
    for (int j = 0; j < hc; ++j) {
      double s = 0;
      for (int i = 0; i < hc; ++i) s += c[i * hc + j];
      for (int i = 0; i < hc; ++i) c[i * hc + j] /= s + eps;
    }
  };
  cols();
  for (int t = 0; t < iters - 1; ++t) {
    for (int i = 0; i < hc; ++i) {
      double s = 0;
      for (int j = 0; j < hc; ++j) s += c[i * hc + j];
      for (int j = 0; j < hc; ++j) c[i * hc + j] /= s + eps;
    }
    cols();
  }
  y->assign(D, 0);
  for (int i = 0; i < hc; ++i)
    for (int64_t k = 0; k < D; ++k) (*y)[k] += pre[i] * X[i * D + k];
}

TEST_F(CpuOpsTest, HyperConnectionPrePostAndHead) {
  const int hc = 4;
  const int64_t D = 24, n = 3, K = (2 + hc) * hc;
  Tensor X = Rand({n, hc * D}), fn = Rand({K, hc * D}, 0.2f), base = Rand({K}, 0.5f), scale = Rand({3}, 0.5f);
  Tensor y = be_->Alloc(DType::kF32, {n, D}), post = be_->Alloc(DType::kF32, {n, hc}),
         comb = be_->Alloc(DType::kF32, {n, hc * hc});
  be_->HcPre(X, fn, base, scale, hc, 20, 1e-6f, 1e-6f, &y, &post, &comb);
  std::vector<double> wy, wp, wc, all_y, all_p, all_c;
  for (int64_t r = 0; r < n; ++r) {
    HcPreReference(X.as<float>() + r * hc * D, fn.as<float>(), base.as<float>(), scale.as<float>(), hc, D, 20, 1e-6,
                   &wy, &wp, &wc);
    all_y.insert(all_y.end(), wy.begin(), wy.end());
    all_p.insert(all_p.end(), wp.begin(), wp.end());
    all_c.insert(all_c.end(), wc.begin(), wc.end());
  }
  ExpectClose(y, all_y, 1e-5, "HcPre y");
  ExpectClose(post, all_p, 1e-5, "HcPre post");
  ExpectClose(comb, all_c, 1e-5, "HcPre comb");
  // Sinkhorn leaves comb (nearly) doubly stochastic.
  for (int64_t r = 0; r < n; ++r)
    for (int i = 0; i < hc; ++i) {
      double row = 0, col = 0;
      for (int j = 0; j < hc; ++j) row += comb.as<float>()[r * 16 + i * 4 + j], col += comb.as<float>()[r * 16 + j * 4 + i];
      EXPECT_NEAR(row, 1.0, 1e-3);
      EXPECT_NEAR(col, 1.0, 1e-3);
    }
  // hc_post: X'[j] = post[j] f + sum_i comb[i][j] X[i]  (note the transpose).
  Tensor f = Rand({n, D}), out = be_->Alloc(DType::kF32, {n, hc * D});
  be_->HcPost(X, f, post, comb, hc, &out);
  std::vector<double> want;
  for (int64_t r = 0; r < n; ++r)
    for (int j = 0; j < hc; ++j)
      for (int64_t k = 0; k < D; ++k) {
        double v = post.as<float>()[r * hc + j] * (double)f.as<float>()[r * D + k];
        for (int i = 0; i < hc; ++i) v += comb.as<float>()[r * 16 + i * 4 + j] * (double)X.as<float>()[r * hc * D + i * D + k];
        want.push_back(v);
      }
  ExpectClose(out, want, 1e-5, "HcPost");
  // hc head.
  Tensor hfn = Rand({hc, hc * D}, 0.2f), hbase = Rand({hc}, 0.5f), hscale = Rand({1}, 0.5f);
  Tensor hy = be_->Alloc(DType::kF32, {n, D});
  be_->HcHead(X, hfn, hbase, hscale, hc, 1e-6f, 1e-6f, &hy);
  want.clear();
  for (int64_t r = 0; r < n; ++r) {
    const float* x = X.as<float>() + r * hc * D;
    double ss = 0;
    for (int64_t i = 0; i < hc * D; ++i) ss += (double)x[i] * x[i];
    double rs = 1.0 / std::sqrt(ss / (hc * D) + 1e-6);
    std::vector<double> acc(D, 0);
    for (int i = 0; i < hc; ++i) {
      double m = 0;
      for (int64_t k = 0; k < hc * D; ++k) m += (double)hfn.as<float>()[i * hc * D + k] * x[k];
      double pre = Sigmoid(m * rs * hscale.as<float>()[0] + hbase.as<float>()[i]) + 1e-6;
      for (int64_t k = 0; k < D; ++k) acc[k] += pre * x[i * D + k];
    }
    want.insert(want.end(), acc.begin(), acc.end());
  }
  ExpectClose(hy, want, 1e-5, "HcHead");
}

TEST_F(CpuOpsTest, CompressorPoolWithAndWithoutOverlap) {
  for (bool overlap : {false, true}) {
    const int ratio = 4;
    const int64_t d = 6, width = (overlap ? 2 : 1) * d;
    const int64_t base = overlap ? 4 : 8, rows = 16;  // positions base .. base+15
    const int64_t first = 2, count = overlap ? 3 : 4;
    Tensor kv = Rand({rows, width}), sc = Rand({rows, width});
    Tensor out = be_->Alloc(DType::kF32, {count, d});
    be_->CompressorPool(kv, sc, base, first, count, ratio, overlap, d, &out);
    std::vector<double> want;
    for (int64_t w = first; w < first + count; ++w)
      for (int64_t ch = 0; ch < d; ++ch) {
        std::vector<std::pair<double, double>> slots;  // (score, kv)
        if (overlap)
          for (int t = 0; t < ratio; ++t) {
            int64_t row = (w - 1) * ratio + t - base;
            slots.push_back({sc.as<float>()[row * width + ch], kv.as<float>()[row * width + ch]});
          }
        for (int t = 0; t < ratio; ++t) {
          int64_t row = w * ratio + t - base, c = (overlap ? d : 0) + ch;
          slots.push_back({sc.as<float>()[row * width + c], kv.as<float>()[row * width + c]});
        }
        double mx = -1e300, s = 0, acc = 0;
        for (auto& p : slots) mx = std::max(mx, p.first);
        for (auto& p : slots) s += std::exp(p.first - mx), acc += std::exp(p.first - mx) * p.second;
        want.push_back(acc / s);
      }
    ExpectClose(out, want, 1e-5, overlap ? "CSA pool" : "HCA pool");
  }
  // Window 0 with overlap has no previous window: only its own second halves count.
  Tensor kv = Rand({4, 4}), sc = Rand({4, 4}), out = be_->Alloc(DType::kF32, {1, 2});
  be_->CompressorPool(kv, sc, 0, 0, 1, 4, true, 2, &out);
  for (int ch = 0; ch < 2; ++ch) {
    double mx = -1e300, s = 0, acc = 0;
    for (int t = 0; t < 4; ++t) mx = std::max(mx, (double)sc.as<float>()[t * 4 + 2 + ch]);
    for (int t = 0; t < 4; ++t) {
      double e = std::exp(sc.as<float>()[t * 4 + 2 + ch] - mx);
      s += e;
      acc += e * kv.as<float>()[t * 4 + 2 + ch];
    }
    EXPECT_NEAR(out.as<float>()[ch], acc / s, 1e-5);
  }
}

TEST_F(CpuOpsTest, IndexerTopKIsTheBruteForceSelection) {
  const int64_t n = 4, heads = 5, dim = 8, keys_n = 20;
  const int ratio = 4, top_k = 3;
  Tensor q = Rand({n, heads * dim}), w = Rand({n, heads}), keys = Rand({keys_n, dim});
  Tensor out = be_->Alloc(DType::kI32, {n, top_k});
  std::vector<int64_t> pos = {2, 9, 40, 79};  // visible entries: 0, 2, 10, 20
  be_->IndexerTopK(q, w, ContiguousRows(keys), keys_n, heads, dim, pos.data(), ratio, top_k, &out);
  for (int64_t r = 0; r < n; ++r) {
    int64_t visible = std::min<int64_t>(keys_n, (pos[r] + 1) / ratio);
    std::vector<std::pair<double, int>> sc;
    for (int64_t k = 0; k < visible; ++k) {
      double s = 0;
      for (int64_t h = 0; h < heads; ++h) {
        double dot = 0;
        for (int64_t i = 0; i < dim; ++i) dot += (double)q.as<float>()[r * heads * dim + h * dim + i] * keys.as<float>()[k * dim + i];
        s += w.as<float>()[r * heads + h] * std::max(0.0, dot);
      }
      sc.push_back({-s, (int)k});
    }
    std::sort(sc.begin(), sc.end());
    std::vector<int> want, got;
    for (int i = 0; i < top_k; ++i) want.push_back(i < (int)sc.size() ? sc[i].second : -1);
    for (int i = 0; i < top_k; ++i) got.push_back(out.as<int32_t>()[r * top_k + i]);
    EXPECT_EQ(got, want) << "row " << r;
  }
}

TEST_F(CpuOpsTest, PagedEntriesEqualContiguousOnes) {
  // 10 entries in blocks of 4 rows spread over a pool of 5 blocks in table order {3, 0, 4}: attention and
  // the indexer read row e from block table[e / 4] and give exactly the contiguous results.
  const int64_t heads = 2, d = 8, n = 3, start = 40, per = 4, num = 10;
  const int window = 4, ratio = 4, top_k = 3;
  Tensor entries = Rand({num, d}), pool = Rand({5 * per, d});
  const std::vector<int32_t> table = {3, 0, 4};
  for (int64_t e = 0; e < num; ++e)
    std::copy_n(entries.as<float>() + e * d, d, pool.as<float>() + (table[e / per] * per + e % per) * d);
  const PagedRows paged{&pool, per, table.data(), 3}, flat = ContiguousRows(entries);
  Tensor q = Rand({n, heads * d}), ring = Rand({window, d}), kv = Rand({n, d}), sinks = Rand({heads});
  Tensor a = be_->Alloc(DType::kF32, {n, heads * d}), b = be_->Alloc(DType::kF32, {n, heads * d});
  be_->Attention(q, heads, d, start, ring, kv, window, &flat, num, ratio, nullptr, sinks, 0.25f, &a);
  be_->Attention(q, heads, d, start, ring, kv, window, &paged, num, ratio, nullptr, sinks, 0.25f, &b);
  for (int64_t i = 0; i < n * heads * d; ++i) ASSERT_EQ(a.as<float>()[i], b.as<float>()[i]) << i;
  Tensor w = Rand({n, heads});
  Tensor ta = be_->Alloc(DType::kI32, {n, top_k}), tb = be_->Alloc(DType::kI32, {n, top_k});
  std::vector<int64_t> pos = {40, 41, 42};
  be_->IndexerTopK(q, w, flat, num, heads, d, pos.data(), ratio, top_k, &ta);
  be_->IndexerTopK(q, w, paged, num, heads, d, pos.data(), ratio, top_k, &tb);
  for (int64_t i = 0; i < n * top_k; ++i) ASSERT_EQ(ta.as<int32_t>()[i], tb.as<int32_t>()[i]) << i;
  EXPECT_THROW(be_->IndexerTopK(q, w, paged, 13, heads, d, pos.data(), ratio, top_k, &tb), std::runtime_error);
}

TEST_F(CpuOpsTest, RingWithSpareSlotsKeepsTheWindowAcrossForgottenWrites) {
  // A ring of window + 2 slots: two rows written past position P and then forgotten leave every row of
  // the window ending at P in place, so attention at P+1 (rows before it from the ring) is unchanged.
  const int64_t heads = 2, d = 8, P = 21;
  const int window = 4, slots = window + 2;
  Tensor ring = be_->Alloc(DType::kF32, {slots, d});
  Tensor hist = Rand({P + 1, d});
  be_->UpdateRing(hist, 0, window, &ring);
  Tensor q = Rand({1, heads * d}), kv = Rand({1, d}), sinks = Rand({heads});
  Tensor before = be_->Alloc(DType::kF32, {1, heads * d}), after = be_->Alloc(DType::kF32, {1, heads * d});
  be_->Attention(q, heads, d, P + 1, ring, kv, window, nullptr, 0, 0, nullptr, sinks, 0.25f, &before);
  Tensor junk = Rand({2, d});
  be_->UpdateRing(junk, P + 1, window, &ring);  // rows for P+1, P+2, then rolled back
  be_->Attention(q, heads, d, P + 1, ring, kv, window, nullptr, 0, 0, nullptr, sinks, 0.25f, &after);
  for (int64_t i = 0; i < heads * d; ++i) EXPECT_EQ(before.as<float>()[i], after.as<float>()[i]);
}

TEST_F(CpuOpsTest, AttentionWithSinksWindowAndEntries) {
  const int64_t heads = 3, d = 16, start = 10, n = 5;
  const int window = 4, ratio = 4;
  Tensor q = Rand({n, heads * d}), ring = Rand({window, d}), kv = Rand({n, d}), entries = Rand({3, d});
  Tensor sinks = Rand({heads});
  Tensor topk = be_->Alloc(DType::kI32, {n, 2});
  std::vector<int32_t> sel = {0, -1, 2, 1, 1, 0, -1, -1, 2, 0};
  std::copy(sel.begin(), sel.end(), topk.as<int32_t>());
  for (bool sparse : {false, true}) {
    Tensor out = be_->Alloc(DType::kF32, {n, heads * d});
    const PagedRows pe = ContiguousRows(entries);
    be_->Attention(q, heads, d, start, ring, kv, window, &pe, 3, ratio, sparse ? &topk : nullptr, sinks, 0.25f, &out);
    std::vector<double> want;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t t = start + r;
      std::vector<const float*> keys;
      for (int64_t p = t - window + 1; p <= t; ++p)
        keys.push_back(p < start ? ring.as<float>() + (p % window) * d : kv.as<float>() + (p - start) * d);
      const int64_t visible = std::min<int64_t>(3, (t + 1) / ratio);
      if (sparse) {
        for (int i = 0; i < 2; ++i)
          if (sel[r * 2 + i] >= 0 && sel[r * 2 + i] < visible) keys.push_back(entries.as<float>() + sel[r * 2 + i] * d);
      } else {
        for (int64_t w = 0; w < visible; ++w) keys.push_back(entries.as<float>() + w * d);
      }
      for (int64_t h = 0; h < heads; ++h) {
        std::vector<double> s;
        double denom = std::exp((double)sinks.as<float>()[h]);
        for (auto k : keys) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += (double)q.as<float>()[(r * heads + h) * d + i] * k[i];
          s.push_back(std::exp(dot * 0.25));
          denom += s.back();
        }
        for (int64_t i = 0; i < d; ++i) {
          double o = 0;
          for (size_t j = 0; j < keys.size(); ++j) o += s[j] / denom * keys[j][i];
          want.push_back(o);
        }
      }
    }
    ExpectClose(out, want, 1e-5, sparse ? "sparse attention" : "dense attention");
  }
  // The ring keeps the last `window` positions at slot pos % window.
  be_->UpdateRing(kv, start, window, &ring);
  for (int64_t p = start + n - window; p < start + n; ++p)
    for (int64_t i = 0; i < d; ++i) EXPECT_EQ(ring.as<float>()[(p % window) * d + i], kv.as<float>()[(p - start) * d + i]);
}

TEST_F(CpuOpsTest, MoeRoutingAndExperts) {
  const int64_t n = 3, E = 6, D = 8, I = 5;
  const int k = 2;
  Tensor logits = Rand({n, E}, 2.0f), bias = Rand({E}, 0.3f);
  Tensor tid = be_->Alloc(DType::kI32, {10, k});
  for (int v = 0; v < 10; ++v) tid.as<int32_t>()[v * k] = v % E, tid.as<int32_t>()[v * k + 1] = (v + 3) % E;
  std::vector<int32_t> tokens = {4, 9, 0};
  auto score = [&](int64_t r, int e) {
    double x = logits.as<float>()[r * E + e];
    return std::sqrt(x > 20 ? x : std::log1p(std::exp(x)));
  };
  for (bool hash : {false, true}) {
    RouterParams p;
    p.top_k = k;
    p.routed_scale = 1.5f;
    p.hash = hash;
    p.bias = hash ? nullptr : &bias;
    p.tid2eid = hash ? &tid : nullptr;
    Tensor idx = be_->Alloc(DType::kI32, {n, k}), wt = be_->Alloc(DType::kF32, {n, k});
    be_->MoeRoute(logits, tokens.data(), p, &idx, &wt);
    for (int64_t r = 0; r < n; ++r) {
      std::vector<int> want;
      if (hash) {
        want = {tid.as<int32_t>()[tokens[r] * k], tid.as<int32_t>()[tokens[r] * k + 1]};
      } else {
        std::vector<std::pair<double, int>> b;
        for (int e = 0; e < E; ++e) b.push_back({-(score(r, e) + bias.as<float>()[e]), e});
        std::sort(b.begin(), b.end());
        want = {b[0].second, b[1].second};
      }
      EXPECT_EQ(idx.as<int32_t>()[r * k], want[0]);
      EXPECT_EQ(idx.as<int32_t>()[r * k + 1], want[1]);
      double sum = score(r, want[0]) + score(r, want[1]);
      for (int i = 0; i < k; ++i) EXPECT_NEAR(wt.as<float>()[r * k + i], score(r, want[i]) / sum * 1.5, 1e-5);
    }
  }
  // Experts: out += w * w2(silu(min(w1 x, L)) * clamp(w3 x, -L, L)), and the shared expert unweighted.
  std::vector<ExpertWeights> experts(E);
  for (auto& e : experts) {
    e.w1.in = e.w3.in = D, e.w1.out = e.w3.out = I, e.w2.in = I, e.w2.out = D;
    e.w1.dense = Rand({I, D}, 2.0f), e.w3.dense = Rand({I, D}, 2.0f), e.w2.dense = Rand({D, I});
  }
  Tensor x = Rand({n, D});
  Tensor idx = be_->Alloc(DType::kI32, {n, k}), wt = Rand({n, k});
  std::vector<int32_t> chosen = {0, 5, 5, 2, 3, 0};
  std::copy(chosen.begin(), chosen.end(), idx.as<int32_t>());
  const float L = 1.0f;
  auto expert = [&](const ExpertWeights& e, int64_t r, std::vector<double>* y) {
    std::vector<double> a(I);
    for (int64_t i = 0; i < I; ++i) {
      double g = 0, u = 0;
      for (int64_t j = 0; j < D; ++j) {
        g += (double)e.w1.dense.as<float>()[i * D + j] * x.as<float>()[r * D + j];
        u += (double)e.w3.dense.as<float>()[i * D + j] * x.as<float>()[r * D + j];
      }
      g = std::min<double>(g, L);
      u = std::clamp<double>(u, -L, L);
      a[i] = g / (1 + std::exp(-g)) * u;
    }
    y->assign(D, 0);
    for (int64_t j = 0; j < D; ++j)
      for (int64_t i = 0; i < I; ++i) (*y)[j] += (double)e.w2.dense.as<float>()[j * I + i] * a[i];
  };
  Tensor out = be_->Alloc(DType::kF32, {n, D});
  be_->MoeExperts(x, idx, wt, experts, L, &out);
  be_->SharedExpert(x, experts[1], L, &out);
  std::vector<double> want(n * D, 0), y;
  for (int64_t r = 0; r < n; ++r) {
    for (int i = 0; i < k; ++i) {
      expert(experts[chosen[r * k + i]], r, &y);
      for (int64_t j = 0; j < D; ++j) want[r * D + j] += wt.as<float>()[r * k + i] * y[j];
    }
    expert(experts[1], r, &y);
    for (int64_t j = 0; j < D; ++j) want[r * D + j] += y[j];
  }
  ExpectClose(out, want, 1e-5, "MoE experts");
}

TEST_F(CpuOpsTest, EmbeddingConvertsRows) {
  std::vector<uint16_t> table(5 * 3);
  for (int i = 0; i < 15; ++i) table[i] = FloatToBf16(0.5f * i - 3);
  Tensor t{DType::kBF16, {5, 3}, table.data(), nullptr};
  std::vector<int32_t> tok = {4, 0};
  Tensor out = be_->Alloc(DType::kF32, {2, 3});
  be_->Embedding(t, tok.data(), 2, &out);
  ExpectClose(out, {3, 3.5, 4, -3, -2.5, -2}, 0, "Embedding");
}

}  // namespace
}  // namespace dsmesh

namespace dsmesh {
namespace {

TEST(ThreadPoolTest, EveryIndexRunsExactlyOnceAndNestingIsSerial) {
  cpu::SetCpuThreads(2);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::atomic<int>> hits(1000);
    std::atomic<int> nested{0};
    cpu::ParallelFor(1000, int64_t{1} << 30, [&](int64_t i) {
      hits[i].fetch_add(1);
      if (i == 7) cpu::ParallelFor(10, int64_t{1} << 30, [&](int64_t) { nested.fetch_add(1); });
    });
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(hits[i].load(), 1) << "round " << round << " index " << i;
    ASSERT_EQ(nested.load(), 10);
  }
}

}  // namespace
}  // namespace dsmesh
