// GPU parity and safety tests of the prefill EXL3 GEMM (kernels/cuda/exl3_gemm.h) and of its weight
// kernel (W_eff = Ŵ Hn diag(svh), exl3_gemm_kernels.h).
// Oracles: an fp64 reference built on the CPU decoder of kernels/exl3 (Exl3ReconstructFp16, bit-exact Ŵ,
// exact Hadamards) for every row and every W_eff element, and the CPU linear Exl3LinearCpu. Without a
// GPU every test skips with a message; on the GPU machine they run for real.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/half.h"
#include "kernels/cuda/exl3_gemm.h"
#include "kernels/cuda/exl3_gemm_kernels.h"
#include "kernels/cuda/gpu_test_util.h"
#include "kernels/exl3/exl3_linear.h"

namespace dsmesh {
namespace {

using testing::DeviceBuffer;
using testing::DeviceExl3;

// Spacing of fp16 numbers around |v| (one unit in the last place; 2^-24 in the subnormal range).
double Fp16Ulp(double v) {
  const double a = std::fabs(v);
  if (a < std::ldexp(1.0, -14)) return std::ldexp(1.0, -24);
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - 10);
}

// Runs the GEMM (fp32 out) and checks every row against the fp64 reference, that no NaN poison is
// left, that a second call gives the same bits, and the fp16 output (see below).
void RunAndCheck(const Exl3Weight& w, const DeviceExl3& d, const std::vector<uint16_t>& what, int m,
                 Exl3GemmWorkspace& ws, std::mt19937& rng) {
  const int64_t k = w.k_padded(), n = w.n_padded();
  const std::vector<uint16_t> x = testing::RandomFp16(static_cast<size_t>(m) * k, rng);
  DeviceBuffer<uint16_t> dx(x);
  DeviceBuffer<float> dy(static_cast<size_t>(m) * n);
  dy.PoisonNaN();
  Exl3Gemm(d.linear, dx.get(), m, dy.get(), Exl3Out::kF32, ws, nullptr);
  CudaCheck(cudaDeviceSynchronize(), "sync");
  const std::vector<float> y = dy.Download();
  const std::string what_case = w.name + " cb=" + std::to_string(static_cast<int>(w.codebook)) + " " +
                                std::to_string(k) + "x" + std::to_string(n) + " m=" + std::to_string(m);
  ASSERT_TRUE(testing::AllFinite(y)) << what_case << ": NaN left in the output (unwritten element)";
  std::vector<double> xr(k);
  std::vector<std::vector<double>> refs(m);
  double worst = 0;
  for (int r = 0; r < m; ++r) {
    for (int64_t i = 0; i < k; ++i) xr[i] = Fp16ToFloat(x[r * k + i]);
    refs[r] = testing::Exl3RowF64(what, w.suh.as<uint16_t>(), w.svh.as<uint16_t>(), xr.data(), k, n);
    const double rel = testing::RelL2(y.data() + r * n, refs[r].data(), n);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 2e-3) << what_case << " row " << r;
  }
  std::printf("  %s: worst row rel L2 vs fp64 %.2e\n", what_case.c_str(), worst);
  dy.PoisonNaN();
  Exl3Gemm(d.linear, dx.get(), m, dy.get(), Exl3Out::kF32, ws, nullptr);
  CudaCheck(cudaDeviceSynchronize(), "sync");
  EXPECT_EQ(0, std::memcmp(y.data(), dy.Download().data(), y.size() * 4)) << what_case << ": not bitwise reproducible";
  DeviceBuffer<uint16_t> dh(static_cast<size_t>(m) * n);
  dh.PoisonNaN();
  Exl3Gemm(d.linear, dx.get(), m, dh.get(), Exl3Out::kF16, ws, nullptr);
  CudaCheck(cudaDeviceSynchronize(), "sync");
  const std::vector<uint16_t> h = dh.Download();
  // cuBLAS writes fp16 y itself now and may pick another algorithm (tiling, split-K order) for fp16 C
  // than for fp32 C, so the fp16 output need not be the bitwise RNE of the fp32 output. What must hold:
  // every fp16 element within 1 fp16 ulp of the fp32 result, plus a slack of 1e-4 x the row's RMS for
  // elements near zero (where the fp16 ulp is smaller than the difference two fp32 summation orders
  // can make), and every fp16 row within the parity bound.
  size_t far = 0, rne = 0;
  for (int r = 0; r < m; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < n; ++j) ss += refs[r][j] * refs[r][j];
    const double slack = 1e-4 * std::sqrt(ss / n);
    for (int64_t j = 0; j < n; ++j) {
      const size_t i = static_cast<size_t>(r) * n + j;
      far += !(std::fabs(Fp16ToFloat(h[i]) - y[i]) <= Fp16Ulp(y[i]) + slack);
      rne += h[i] == FloatToFp16(y[i]);
    }
  }
  EXPECT_EQ(far, 0u) << what_case << ": fp16 output elements more than 1 ulp from the fp32 output";
  std::vector<float> hf(n);
  double worst16 = 0;
  for (int r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) hf[j] = Fp16ToFloat(h[r * n + j]);
    const double rel = testing::RelL2(hf.data(), refs[r].data(), n);
    worst16 = std::max(worst16, rel);
    EXPECT_LE(rel, 2e-3) << what_case << " fp16 output, row " << r;
  }
  std::printf("  %s: fp16 out worst row rel L2 %.2e, %.4f%% of elements = RNE(fp32 out)\n", what_case.c_str(), worst16,
              100.0 * rne / h.size());
}

TEST(Exl3GemmTest, MatchesFp64ReferenceAcrossKCodebooksAndRows) {
  DSMESH_REQUIRE_GPU();
  struct Case {
    int K, cb;
    int64_t k, n;
    std::vector<int> ms;
  };
  const std::vector<Case> cases = {
      {2, 1, 256, 384, {1, 17, 128, 512}},  {3, 1, 512, 256, {33, 512}},  {6, 1, 1024, 640, {64, 512}},
      {3, 0, 256, 384, {5, 200}},           {3, 2, 384, 256, {100}},      {1, 1, 256, 256, {300}},
      {4, 1, 256, 512, {48}},               {8, 2, 128, 384, {512}},      {5, 0, 640, 128, {77}},
  };
  Exl3GemmWorkspace ws(512, 1024, 1024, 1024 * 1024);
  std::mt19937 rng(11);
  for (const Case& c : cases) {
    const Exl3Weight w = testing::RandomExl3Weight(c.k, c.n, c.K, static_cast<Exl3Codebook>(c.cb), rng);
    DeviceExl3 d;
    testing::UploadExl3(w, d);
    const std::vector<uint16_t> what = Exl3ReconstructFp16(w);
    for (int m : c.ms) RunAndCheck(w, d, what, m, ws, rng);
  }
}

// The CPU linear (fp32 activations, its own tile decode) as a second, independent reference.
TEST(Exl3GemmTest, MatchesExl3LinearCpu) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(12);
  const int m = 96;
  const Exl3Weight w = testing::RandomExl3Weight(512, 768, 3, Exl3Codebook::kMcg, rng);
  DeviceExl3 d;
  testing::UploadExl3(w, d);
  const std::vector<uint16_t> x = testing::RandomFp16(static_cast<size_t>(m) * 512, rng);
  std::vector<float> xf(x.size());
  for (size_t i = 0; i < x.size(); ++i) xf[i] = Fp16ToFloat(x[i]);
  std::vector<float> ref(static_cast<size_t>(m) * 768);
  Exl3LinearCpu(w, xf.data(), m, ref.data());
  Exl3GemmWorkspace ws(m, 512, 768, 512 * 768);
  DeviceBuffer<uint16_t> dx(x);
  DeviceBuffer<float> dy(ref.size());
  dy.PoisonNaN();
  Exl3Gemm(d.linear, dx.get(), m, dy.get(), Exl3Out::kF32, ws, nullptr);
  CudaCheck(cudaDeviceSynchronize(), "sync");
  const std::vector<float> y = dy.Download();
  for (int r = 0; r < m; ++r) {
    std::vector<double> rr(ref.begin() + r * 768, ref.begin() + (r + 1) * 768);
    EXPECT_LE(testing::RelL2(y.data() + r * 768, rr.data(), 768), 2e-3) << "row " << r;
  }
}

TEST(Exl3GemmTest, GraphReplayWithFreshInputsEqualsDirectCalls) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(13);
  const int m = 200;
  const Exl3Weight w = testing::RandomExl3Weight(512, 384, 2, Exl3Codebook::kMcg, rng);
  DeviceExl3 d;
  testing::UploadExl3(w, d);
  cudaStream_t s;
  CudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  Exl3GemmWorkspace ws(m, 512, 384, 512 * 384);
  DeviceBuffer<uint16_t> dx(static_cast<size_t>(m) * 512);
  DeviceBuffer<float> dy(static_cast<size_t>(m) * 384);
  std::vector<std::vector<uint16_t>> inputs;
  std::vector<std::vector<float>> direct;
  for (int i = 0; i < 3; ++i) {
    inputs.push_back(testing::RandomFp16(dx.size(), rng));
    dx.Upload(inputs.back());
    // Upload/poison run on the legacy default stream, which does not order against a non-blocking
    // stream: finish them before launching on `s`.
    CudaCheck(cudaDeviceSynchronize(), "sync");
    Exl3Gemm(d.linear, dx.get(), m, dy.get(), Exl3Out::kF32, ws, s);
    CudaCheck(cudaStreamSynchronize(s), "sync");
    direct.push_back(dy.Download());
  }
  cudaGraph_t graph;
  CudaCheck(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
  Exl3Gemm(d.linear, dx.get(), m, dy.get(), Exl3Out::kF32, ws, s);
  CudaCheck(cudaStreamEndCapture(s, &graph), "end capture");
  cudaGraphExec_t exec;
  CudaCheck(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int i = 0; i < 3; ++i) {
    dx.Upload(inputs[i]);
    dy.PoisonNaN();
    CudaCheck(cudaDeviceSynchronize(), "sync");
    CudaCheck(cudaGraphLaunch(exec, s), "replay");
    CudaCheck(cudaStreamSynchronize(s), "sync");
    EXPECT_EQ(0, std::memcmp(direct[i].data(), dy.Download().data(), direct[i].size() * 4)) << "replay " << i;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// The weight kernel alone against W_eff computed in fp64 from the CPU decoder's bit-exact Ŵ: every
// element must be within 1 fp16 ulp (plus the fp32 butterflies' error bound) of the exact value (the
// kernel rounds its fp32 result once; a plain RNE of the exact value is within half an ulp), and zero
// svh columns (padding) exactly zero.
// svh spans realistic magnitudes (column RMS ratios, 1/64 .. 64) and both signs.
TEST(Exl3GemmTest, WeightKernelMatchesFp64Weff) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(15);
  struct Case {
    int K, cb;
    int64_t k, n;
  };
  for (const Case& c : std::vector<Case>{{2, 1, 256, 384}, {3, 0, 128, 256}, {4, 2, 384, 128}, {8, 1, 128, 512}}) {
    Exl3Weight w = testing::RandomExl3Weight(c.k, c.n, c.K, static_cast<Exl3Codebook>(c.cb), rng);
    std::uniform_real_distribution<float> log2mag(-6.f, 6.f);
    auto* svh = w.svh.as<uint16_t>();
    for (int64_t j = 0; j < c.n; ++j) svh[j] = FloatToFp16((j % 2 ? -1.f : 1.f) * std::exp2(log2mag(rng)));
    for (int64_t j = c.n - 5; j < c.n; ++j) svh[j] = 0;  // padded columns
    DeviceExl3 d;
    testing::UploadExl3(w, d);
    DeviceBuffer<uint16_t> weff(static_cast<size_t>(c.k) * c.n);
    DeviceBuffer<unsigned int> sat(std::vector<unsigned int>{0});
    weff.PoisonNaN();
    exl3cuda::GemmWeightParams p{};
    p.trellis = d.linear.trellis;
    p.svh = d.linear.svh;
    p.weff = weff.get();
    p.k = static_cast<int>(c.k);
    p.n = static_cast<int>(c.n);
    p.one = 1;
    p.saturated = sat.get();
    CudaCheck(static_cast<cudaError_t>(exl3cuda::LaunchGemmWeight(c.K, c.cb, p, nullptr)), "weight launch");
    CudaCheck(cudaDeviceSynchronize(), "sync");
    const std::vector<uint16_t> got = weff.Download();
    const std::vector<uint16_t> what = Exl3ReconstructFp16(w);
    size_t far = 0, rne = 0;
    std::vector<double> row(c.n);
    for (int64_t i = 0; i < c.k; ++i) {
      for (int64_t j = 0; j < c.n; ++j) row[j] = Fp16ToFloat(what[i * c.n + j]);
      testing::Hadamard128F64(row.data(), c.n);
      for (int64_t j = 0; j < c.n; ++j) {
        const double ref = row[j] * Fp16ToFloat(svh[j]);
        const double g = Fp16ToFloat(got[i * c.n + j]);
        // fp32 butterflies: 7 levels over 128 terms |Ŵ| < 4, error <= 7 * 2^-24 * 512 / sqrt(128) < 2e-5
        // per unit of |svh| (matters only for elements near zero, where the fp16 ulp is tiny).
        const double tol = Fp16Ulp(ref) + 2e-5 * std::fabs(Fp16ToFloat(svh[j]));
        const bool ok = svh[j] == 0 ? (got[i * c.n + j] & 0x7FFF) == 0 : std::fabs(g - ref) <= tol;  // +-0
        if (!ok && far++ < 5)
          ADD_FAILURE() << "K" << c.K << " cb" << c.cb << " W_eff[" << i << "][" << j << "] = " << g << ", fp64 " << ref;
        rne += got[i * c.n + j] == FloatToFp16(static_cast<float>(ref));
      }
    }
    EXPECT_EQ(far, 0u);
    EXPECT_EQ(sat.Download()[0], 0u) << "no |svh| here can overflow";
    std::printf("  W_eff K%d cb%d %lldx%lld: %.3f%% of elements = RNE(fp64)\n", c.K, c.cb, (long long)c.k,
                (long long)c.n, 100.0 * rne / got.size());
  }
}

// |svh| far beyond real EXL3 models (> 1447) can overflow fp16 W_eff: the kernel counts it, and the
// outputs it touches come out inf, never silently finite and wrong; columns with normal svh are unharmed.
TEST(Exl3GemmTest, HugeSvhIsCountedAsSaturation) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(16);
  const int m = 32;
  Exl3Weight w = testing::RandomExl3Weight(256, 256, 3, Exl3Codebook::kMcg, rng);
  Exl3GemmWorkspace ws(m, 256, 256, 256 * 256);
  DeviceBuffer<uint16_t> dx(testing::RandomFp16(static_cast<size_t>(m) * 256, rng));
  DeviceBuffer<float> dy(static_cast<size_t>(m) * 256);
  {
    DeviceExl3 d;
    testing::UploadExl3(w, d);
    Exl3Gemm(d.linear, dx.get(), m, dy.get(), Exl3Out::kF32, ws, nullptr);
    EXPECT_EQ(ws.SaturatedWeights(), 0u) << "realistic svh must never saturate";
  }
  for (int64_t j = 128; j < 256; ++j) w.svh.as<uint16_t>()[j] = FloatToFp16(j == 200 ? 60000.f : 1.f);
  DeviceExl3 d;
  testing::UploadExl3(w, d);
  Exl3Gemm(d.linear, dx.get(), m, dy.get(), Exl3Out::kF32, ws, nullptr);
  EXPECT_GT(ws.SaturatedWeights(), 0u) << "svh 60000 must saturate some W_eff elements";
  const std::vector<float> y = dy.Download();
  size_t nonfinite_elsewhere = 0, nonfinite_200 = 0;
  for (int r = 0; r < m; ++r)
    for (int j = 0; j < 256; ++j) {
      const bool bad = !std::isfinite(y[r * 256 + j]);
      (j == 200 ? nonfinite_200 : nonfinite_elsewhere) += bad;
    }
  EXPECT_EQ(nonfinite_elsewhere, 0u);
  EXPECT_GT(nonfinite_200, 0u) << "saturated weights must show in the output";
}

TEST(Exl3GemmTest, RejectsBadCallsWithClearErrors) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(14);
  const Exl3Weight w = testing::RandomExl3Weight(256, 256, 2, Exl3Codebook::kMcg, rng);
  DeviceExl3 d;
  testing::UploadExl3(w, d);
  Exl3GemmWorkspace ws(64, 256, 256, 256 * 256);
  DeviceBuffer<uint16_t> dx(128 * 256);
  DeviceBuffer<float> dy(128 * 256 + 4);
  auto expect_error = [&](auto&& call, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "no error, expected one containing '" << text << "'";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error([&] { Exl3Gemm(d.linear, dx.get(), 65, dy.get(), Exl3Out::kF32, ws, nullptr); }, "m = 65");
  expect_error([&] { Exl3Gemm(d.linear, dx.get(), 0, dy.get(), Exl3Out::kF32, ws, nullptr); }, "m = 0");
  expect_error([&] { Exl3Gemm(d.linear, dx.get(), 4, dy.get() + 1, Exl3Out::kF32, ws, nullptr); }, "misaligned");
  Exl3GemmWorkspace small(64, 128, 256, 128 * 256);
  expect_error([&] { Exl3Gemm(d.linear, dx.get(), 4, dy.get(), Exl3Out::kF32, small, nullptr); }, "exceeds the workspace");
  Exl3Gemm(d.linear, dx.get(), 4, dy.get(), Exl3Out::kF32, ws, nullptr);
  cudaStream_t other;
  CudaCheck(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), "stream");
  expect_error([&] { Exl3Gemm(d.linear, dx.get(), 4, dy.get(), Exl3Out::kF32, ws, other); }, "another stream");
  CudaCheck(cudaDeviceSynchronize(), "sync");
  cudaStreamDestroy(other);
}

}  // namespace
}  // namespace dsmesh
