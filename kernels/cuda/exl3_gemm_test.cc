// GPU parity and safety tests of the prefill EXL3 GEMM (kernels/cuda/exl3_gemm.h).
// Oracles: an fp64 reference built on the CPU decoder of kernels/exl3 (Exl3ReconstructFp16, bit-exact Ŵ,
// exact Hadamards) for every row, and the CPU linear Exl3LinearCpu. Without a GPU every test skips with
// a message; on the GPU machine they run for real.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/half.h"
#include "kernels/cuda/exl3_gemm.h"
#include "kernels/cuda/gpu_test_util.h"
#include "kernels/exl3/exl3_linear.h"

namespace dsmesh {
namespace {

using testing::DeviceBuffer;
using testing::DeviceExl3;

// Runs the GEMM (fp32 out) and checks every row against the fp64 reference, that no NaN poison is
// left, that a second call gives the same bits and that fp16 output is the RNE rounding of fp32 output.
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
  double worst = 0;
  for (int r = 0; r < m; ++r) {
    for (int64_t i = 0; i < k; ++i) xr[i] = Fp16ToFloat(x[r * k + i]);
    const auto ref = testing::Exl3RowF64(what, w.suh.as<uint16_t>(), w.svh.as<uint16_t>(), xr.data(), k, n);
    const double rel = testing::RelL2(y.data() + r * n, ref.data(), n);
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
  size_t bad = 0;
  for (size_t i = 0; i < h.size(); ++i) bad += h[i] != FloatToFp16(y[i]);
  EXPECT_EQ(bad, 0u) << what_case << ": fp16 output is not the rounding of the fp32 output";
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
