// The CPU linear against an independent fp64 reference built from the scalar tile decoder and the
// Hadamard matrix by definition; and the loader's validation messages.
#include <bit>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/half.h"
#include "kernels/exl3/exl3_linear.h"
#include "kernels/exl3/trellis.h"

namespace dsmesh {
namespace {

struct Fixture {
  std::map<std::string, Tensor> tensors;
  TensorLookup Lookup() const {
    return [this](const std::string& name) -> std::optional<Tensor> {
      auto it = tensors.find(name);
      if (it == tensors.end()) return std::nullopt;
      return it->second;
    };
  }
};

Tensor Scalar32(uint32_t v) {
  Tensor t = AllocateTensor(DType::kI32, {});
  *t.as<uint32_t>() = v;
  return t;
}

// A random EXL3 linear "P" of padded size k x n with realistic suh/svh magnitudes.
Fixture RandomLinear(int64_t k, int64_t n, int K, Exl3Codebook cb, bool bias, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  Fixture f;
  Tensor tr = AllocateTensor(DType::kI16, {k / 16, n / 16, 16 * K});
  for (int64_t i = 0; i < tr.numel(); ++i) tr.as<uint16_t>()[i] = static_cast<uint16_t>(rng());
  f.tensors["P.trellis"] = tr;
  for (auto [name, len] : {std::pair<const char*, int64_t>{"P.suh", k}, {"P.svh", n}}) {
    Tensor s = AllocateTensor(DType::kF16, {len});
    for (int64_t i = 0; i < len; ++i)
      s.as<uint16_t>()[i] = FloatToFp16((rng() & 1 ? -1.0f : 1.0f) * (1.0f + 0.3f * nd(rng)) * 0.05f);
    f.tensors[name] = s;
  }
  if (cb == Exl3Codebook::kMcg) f.tensors["P.mcg"] = Scalar32(kExl3McgMultiplier);
  if (cb == Exl3Codebook::kMul1) f.tensors["P.mul1"] = Scalar32(kExl3Mul1Multiplier);
  if (bias) {
    Tensor b = AllocateTensor(DType::kF16, {n});
    for (int64_t i = 0; i < n; ++i) b.as<uint16_t>()[i] = FloatToFp16(nd(rng));
    f.tensors["P.bias"] = b;
  }
  return f;
}

// W = diag(suh) Hk Ŵ Hn diag(svh) in fp64 from the scalar decoder.
std::vector<double> ReferenceWeight(const Exl3Weight& w) {
  const int64_t k = w.k_padded(), n = w.n_padded();
  std::vector<double> what(k * n), tmp(k * n), out(k * n);
  uint16_t tile[256];
  for (int64_t i = 0; i < k / 16; ++i)
    for (int64_t j = 0; j < n / 16; ++j) {
      Exl3DecodeTileFp16(w.trellis.as<uint16_t>() + (i * (n / 16) + j) * 16 * w.K, w.K, w.codebook, tile);
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) what[(16 * i + r) * n + 16 * j + c] = Fp16ToFloat(tile[16 * r + c]);
    }
  auto H = [](int a, int b) { return (std::popcount(unsigned(a & b)) % 2 ? -1.0 : 1.0) / std::sqrt(128.0); };
  for (int64_t r = 0; r < k; ++r)  // tmp = Hk Ŵ
    for (int64_t c = 0; c < n; ++c) {
      double s = 0;
      const int64_t base = r / 128 * 128;
      for (int b = 0; b < 128; ++b) s += H(r % 128, b) * what[(base + b) * n + c];
      tmp[r * n + c] = s;
    }
  for (int64_t r = 0; r < k; ++r)  // out = tmp Hn, scaled
    for (int64_t c = 0; c < n; ++c) {
      double s = 0;
      const int64_t base = c / 128 * 128;
      for (int b = 0; b < 128; ++b) s += tmp[r * n + base + b] * H(b, c % 128);
      out[r * n + c] = s * Fp16ToFloat(w.suh.as<uint16_t>()[r]) * Fp16ToFloat(w.svh.as<uint16_t>()[c]);
    }
  return out;
}

void CheckLinear(int K, Exl3Codebook cb, int64_t in, int64_t out, bool bias,
                 std::initializer_list<int64_t> ms = {1, 2, 5, 16, 17, 40}) {
  const int64_t k = (in + 127) / 128 * 128, n = (out + 127) / 128 * 128;
  Fixture f = RandomLinear(k, n, K, cb, bias, 100 + K);
  const Exl3Weight w = LoadExl3Weight(f.Lookup(), "P", in, out);
  ASSERT_EQ(w.K, K);
  ASSERT_EQ(w.codebook, cb);
  const std::vector<double> W = ReferenceWeight(w);
  const std::vector<float> Wf = Exl3OriginalWeightF32(w);
  for (int64_t i = 0; i < k * n; ++i) ASSERT_NEAR(Wf[i], W[i], 1e-5 * 0.01) << i;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  for (int64_t m : ms) {
    std::vector<float> x(m * in), y(m * out);
    for (auto& v : x) v = nd(rng);
    Exl3LinearCpu(w, x.data(), m, y.data());
    double err2 = 0, ref2 = 0;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < out; ++c) {
        double ref = bias ? Fp16ToFloat(w.bias->as<uint16_t>()[c]) : 0.0;
        for (int64_t i = 0; i < in; ++i) ref += double(x[r * in + i]) * W[i * n + c];
        err2 += (y[r * out + c] - ref) * (y[r * out + c] - ref);
        ref2 += ref * ref;
      }
    EXPECT_LT(std::sqrt(err2 / ref2), 2e-6) << "K=" << K << " cb=" << Exl3CodebookName(cb) << " m=" << m;
  }
}

// Tensor-parallel slices (aligned and not) equal the matching part of the full product.
TEST(Exl3Linear, SlicesMatchFullProduct) {
  const int64_t in = 576, out = 300, m = 3;
  Fixture f = RandomLinear(640, 384, 3, Exl3Codebook::kMcg, true, 42);
  const Exl3Weight w = LoadExl3Weight(f.Lookup(), "P", in, out);
  const std::vector<double> W = ReferenceWeight(w);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> x(m * in);
  for (auto& v : x) v = nd(rng);
  const Exl3Slice slices[] = {{0, 256, 128, 256, true}, {37, 150, 10, 290, false}, {300, 576, 0, 300, true}, {0, -1, 299, 300, true}};
  for (const Exl3Slice& s : slices) {
    const int64_t i1 = s.in_end < 0 ? in : s.in_end, o1 = s.out_end < 0 ? out : s.out_end;
    const int64_t kin = i1 - s.in_begin, nout = o1 - s.out_begin;
    std::vector<float> xs(m * kin), y(m * nout);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < kin; ++c) xs[r * kin + c] = x[r * in + s.in_begin + c];
    Exl3LinearCpu(w, xs.data(), m, y.data(), s);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < nout; ++c) {
        const int64_t o = s.out_begin + c;
        double ref = s.add_bias ? Fp16ToFloat(w.bias->as<uint16_t>()[o]) : 0.0;
        for (int64_t i = s.in_begin; i < i1; ++i) ref += double(x[r * in + i]) * W[i * 384 + o];
        ASSERT_NEAR(y[r * nout + c], ref, 1e-4 + 1e-5 * std::fabs(ref)) << "slice in " << s.in_begin << " out " << s.out_begin;
      }
  }
  EXPECT_THROW(Exl3LinearCpu(w, x.data(), 1, x.data(), Exl3Slice{0, 600, 0, -1, true}), std::invalid_argument);
}

TEST(Exl3Linear, MatchesFp64ReferenceMcg) {
  for (int K : {2, 3, 6}) CheckLinear(K, Exl3Codebook::kMcg, 256, 384, false);
}
TEST(Exl3Linear, MatchesFp64Reference3InstAndMul1) {
  CheckLinear(4, Exl3Codebook::k3Inst, 128, 256, false);
  CheckLinear(5, Exl3Codebook::kMul1, 256, 128, false);
}
TEST(Exl3Linear, ManyRows) { CheckLinear(2, Exl3Codebook::kMcg, 256, 128, true, {150, 512}); }

TEST(Exl3Linear, PaddedSizesAndBias) {
  CheckLinear(1, Exl3Codebook::kMcg, 200, 300, true);  // padded to 256 x 384
  CheckLinear(8, Exl3Codebook::kMul1, 576, 130, true);
}

// Each malformed tensor set is rejected with a message naming the offending tensor.
void ExpectRejected(const Fixture& f, const std::string& needle, int64_t in = -1, int64_t out = -1) {
  try {
    LoadExl3Weight(f.Lookup(), "P", in, out);
    ADD_FAILURE() << "accepted; expected an error mentioning " << needle;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Exl3Linear, RejectsBadTensorSets) {
  const Fixture good = RandomLinear(128, 256, 3, Exl3Codebook::kMcg, false, 1);
  EXPECT_NO_THROW(LoadExl3Weight(good.Lookup(), "P"));
  {
    Fixture f = good;
    f.tensors.erase("P.trellis");
    ExpectRejected(f, "P.trellis: missing");
  }
  {
    Fixture f = good;
    f.tensors["P.trellis"].shape = {8, 16 * 48};
    ExpectRejected(f, "P.trellis: rank 2");
  }
  {
    Fixture f = good;
    f.tensors["P.trellis"] = AllocateTensor(DType::kI16, {8, 16, 16 * 9});
    ExpectRejected(f, "P.trellis: K=9 out of range");
  }
  {
    Fixture f = good;
    f.tensors["P.trellis"] = AllocateTensor(DType::kI16, {8, 16, 40});
    ExpectRejected(f, "P.trellis: last dimension 40");
  }
  {
    Fixture f = good;
    f.tensors["P.trellis"] = AllocateTensor(DType::kI16, {4, 16, 48});
    ExpectRejected(f, "P.trellis: shape [4, 16, 48] gives k=64");
  }
  {
    Fixture f = good;
    f.tensors["P.trellis"] = AllocateTensor(DType::kF16, {8, 16, 48});
    ExpectRejected(f, "P.trellis: dtype F16");
  }
  {
    Fixture f = good;
    f.tensors["P.suh"] = AllocateTensor(DType::kF16, {256});
    ExpectRejected(f, "P.suh: shape [256], expected [128]");
  }
  {
    Fixture f = good;
    f.tensors["P.svh"] = AllocateTensor(DType::kF16, {128});
    ExpectRejected(f, "P.svh: shape [128], expected [256]");
  }
  {
    Fixture f = good;
    f.tensors.erase("P.svh");
    ExpectRejected(f, "P.svh: missing");
  }
  {
    Fixture f = good;
    f.tensors["P.mcg"] = Scalar32(12345);
    ExpectRejected(f, "P.mcg: multiplier 0x00003039");
  }
  {
    Fixture f = good;
    f.tensors["P.mul1"] = Scalar32(kExl3Mul1Multiplier);
    ExpectRejected(f, "both .mcg and .mul1");
  }
  {
    Fixture f = good;
    f.tensors["P.bias"] = AllocateTensor(DType::kF16, {100});
    ExpectRejected(f, "P.bias: shape [100]");
  }
  {
    Fixture f = good;
    f.tensors.erase("P.suh");
    f.tensors["P.su"] = AllocateTensor(DType::kI16, {8});
    ExpectRejected(f, "P.su: legacy");
  }
  ExpectRejected(good, "in_features 300 does not pad to k=128", 300, -1);
  ExpectRejected(good, "out_features 100 does not pad to n=256", -1, 100);
}

}  // namespace
}  // namespace dsmesh
