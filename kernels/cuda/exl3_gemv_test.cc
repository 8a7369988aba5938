// GPU parity and safety tests of the dense EXL3 GEMV (kernels/cuda/exl3_gemv.h).
// Oracles: exllamav3's own vectors (kernels/exl3/testdata: Ŵ bit for bit, y of exl3_gemm) and an fp64
// reference built on the CPU decoder of kernels/exl3 (Exl3ReconstructFp16, bit-exact Ŵ).
// Without a GPU every test skips with a message; on the GPU machine they run for real.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/repo_file.h"
#include "common/safetensors.h"
#include "kernels/cuda/exl3_gemv.h"
#include "kernels/cuda/exl3_gemv_params.h"
#include "kernels/cuda/gpu_test_util.h"
#include "kernels/exl3/exl3_linear.h"

namespace dsmesh {
namespace {

using testing::DeviceBuffer;
using testing::DeviceExl3;

std::string TestdataPath(const std::string& file) { return RepoFile("kernels/exl3/testdata/" + file); }

std::vector<uint16_t> TensorU16(const Tensor& t) {
  const auto* p = static_cast<const uint16_t*>(t.data);
  return std::vector<uint16_t>(p, p + t.numel());
}

// Runs the GEMV and checks every row against the fp64 reference; returns the fp32 output.
std::vector<float> RunAndCheck(const Exl3Weight& w, const DeviceExl3& d, const std::vector<uint16_t>& what,
                               const std::vector<uint16_t>& x, int m, Exl3GemvWorkspace& ws, cudaStream_t stream,
                               double tol = 2e-3) {
  const int64_t k = w.k_padded(), n = w.n_padded();
  DeviceBuffer<uint16_t> dx(x);
  DeviceBuffer<float> dy(static_cast<size_t>(m) * n);
  dy.PoisonNaN();
  Exl3Gemv(d.linear, dx.get(), m, dy.get(), Exl3Out::kF32, ws, stream);
  CudaCheck(cudaStreamSynchronize(stream), "sync");
  std::vector<float> y = dy.Download();
  EXPECT_TRUE(testing::AllFinite(y)) << w.name << " m=" << m << ": NaN left in the output (unwritten element)";
  std::vector<double> xr(k);
  for (int r = 0; r < m; ++r) {
    for (int64_t i = 0; i < k; ++i) xr[i] = Fp16ToFloat(x[r * k + i]);
    const auto ref = testing::Exl3RowF64(what, w.suh.as<uint16_t>(), w.svh.as<uint16_t>(), xr.data(), k, n);
    const double rel = testing::RelL2(y.data() + r * n, ref.data(), n);
    EXPECT_LE(rel, tol) << w.name << " cb=" << static_cast<int>(w.codebook) << " k=" << k << " n=" << n
                        << " m=" << m << " row " << r;
  }
  // Bitwise reproducible: the same launch again gives the same bits.
  dy.PoisonNaN();
  Exl3Gemv(d.linear, dx.get(), m, dy.get(), Exl3Out::kF32, ws, stream);
  CudaCheck(cudaStreamSynchronize(stream), "sync");
  const std::vector<float> y2 = dy.Download();
  EXPECT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * sizeof(float))) << w.name << " m=" << m << ": not bitwise reproducible";
  return y;
}

TEST(Exl3GemvTest, ReconstructMatchesExllamav3Vectors) {
  DSMESH_REQUIRE_GPU();
  auto file = SafetensorsFile::Open(TestdataPath("exl3_reconstruct.safetensors"));
  int checked = 0;
  for (int K = 1; K <= 8; ++K) {
    for (const char* shape : {"128x128", "256x384"}) {
      for (const char* cb : {"mcg", "3inst", "mul1"}) {
        const std::string base = "K" + std::to_string(K) + "." + shape;
        const std::string what_name = base + "." + cb + ".what";
        if (!file->Has(what_name)) continue;
        const Tensor trellis = file->Get(base + ".trellis");
        const Tensor what = file->Get(what_name);
        DeviceBuffer<uint16_t> dt(TensorU16(trellis));
        DeviceBuffer<uint16_t> dw(what.numel());
        Exl3DeviceLinear l;
        l.k = trellis.shape[0] * 16;
        l.n = trellis.shape[1] * 16;
        l.K = K;
        l.codebook = std::string(cb) == "3inst" ? 0 : std::string(cb) == "mcg" ? 1 : 2;
        l.trellis = dt.get();
        l.name = what_name;
        dw.PoisonNaN();
        Exl3Reconstruct(l, dw.get(), nullptr);
        CudaCheck(cudaDeviceSynchronize(), "sync");
        const auto got = dw.Download();
        const auto want = TensorU16(what);
        size_t bad = 0;
        for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
        EXPECT_EQ(bad, 0u) << what_name << ": " << bad << " of " << got.size() << " fp16 values differ";
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 8 * 2 + 8 * 2);  // every K, both shapes, three codebooks on 256x384
}

TEST(Exl3GemvTest, ReconstructMatchesCpuDecoderOnRandomTrellis) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(7);
  for (int K = 1; K <= 8; ++K)
    for (int cb = 0; cb < 3; ++cb) {
      const Exl3Weight w = testing::RandomExl3Weight(256, 640, K, static_cast<Exl3Codebook>(cb), rng);
      DeviceExl3 d;
      testing::UploadExl3(w, d);
      DeviceBuffer<uint16_t> dw(256 * 640);
      Exl3Reconstruct(d.linear, dw.get(), nullptr);
      CudaCheck(cudaDeviceSynchronize(), "sync");
      EXPECT_EQ(dw.Download(), Exl3ReconstructFp16(w)) << "K=" << K << " cb=" << cb;
    }
}

TEST(Exl3GemvTest, LinearMatchesExllamav3Vectors) {
  DSMESH_REQUIRE_GPU();
  auto file = SafetensorsFile::Open(TestdataPath("exl3_linear.safetensors"));
  Exl3GemvWorkspace ws;
  for (int K : {2, 3, 4, 6}) {
    const std::string base = "K" + std::to_string(K) + ".1024x512.mcg";
    const TensorLookup lookup = [&](const std::string& name) -> std::optional<Tensor> {
      if (name == "w.trellis") return file->Get(base + ".trellis");
      if (name == "w.suh") return file->Get(base + ".suh");
      if (name == "w.svh") return file->Get(base + ".svh");
      if (name == "w.mcg") {
        // The vector file carries no marker tensor; the spec fixes MCG's multiplier.
        static int32_t mcg = static_cast<int32_t>(0xCBAC1FEDu);
        Tensor t;
        t.dtype = DType::kI32;
        t.data = &mcg;
        return t;
      }
      return std::nullopt;
    };
    const Exl3Weight w = LoadExl3Weight(lookup, "w");
    ASSERT_EQ(w.codebook, Exl3Codebook::kMcg);
    DeviceExl3 d;
    testing::UploadExl3(w, d);
    const auto what = Exl3ReconstructFp16(w);
    for (int m : {1, 4, 16}) {
      const Tensor xt = file->Get(base + ".x" + std::to_string(m));
      const Tensor yt = file->Get(base + ".y" + std::to_string(m));
      const auto y = RunAndCheck(w, d, what, TensorU16(xt), m, ws, nullptr);
      // Against exllamav3's own exl3_gemm output (fp32 C): both are within ~5e-4 of the exact result.
      const float* yref = static_cast<const float*>(yt.data);
      for (int r = 0; r < m; ++r) {
        std::vector<double> ref(yref + r * 512, yref + (r + 1) * 512);
        EXPECT_LE(testing::RelL2(y.data() + r * 512, ref.data(), 512), 2e-3) << base << " m=" << m << " row " << r;
      }
    }
  }
}

TEST(Exl3GemvTest, RandomShapesEveryKCodebookAndRowCount) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(11);
  Exl3GemvWorkspace ws;
  // (512 x 256): two strips, split-K on; (2048 x 128): one strip, 16 single-block splits; (256 x 1152):
  // nine strips; covers the last-arriver reduction with very different split counts.
  const int64_t shapes[3][2] = {{512, 256}, {2048, 128}, {256, 1152}};
  int case_no = 0;
  for (int K = 1; K <= 8; ++K)
    for (int cb = 0; cb < 3; ++cb) {
      const auto& sh = shapes[case_no++ % 3];
      const Exl3Weight w = testing::RandomExl3Weight(sh[0], sh[1], K, static_cast<Exl3Codebook>(cb), rng);
      DeviceExl3 d;
      testing::UploadExl3(w, d);
      const auto what = Exl3ReconstructFp16(w);
      for (int m = 1; m <= 16; ++m) {
        const auto x = testing::RandomFp16(static_cast<size_t>(m) * sh[0], rng);
        RunAndCheck(w, d, what, x, m, ws, nullptr);
      }
    }
}

// A batched launch: linears of one K, codebook and k but different n (one with its own input, two sharing
// one), each row within the fp64 bound and close to its own single launch; a second launch gives the same
// bits; linears that differ in k are refused by name.
TEST(Exl3GemvTest, BatchOfLinearsInOneLaunch) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(23);
  Exl3GemvWorkspace ws;
  for (int K : {2, 6})
    for (int cb : {0, 1}) {
      const int64_t k = 1024, ns[3] = {256, 1024, 128};
      std::vector<Exl3Weight> w;
      std::vector<DeviceExl3> d(3);
      for (int j = 0; j < 3; ++j) {
        w.push_back(testing::RandomExl3Weight(k, ns[j], K, static_cast<Exl3Codebook>(cb), rng));
        testing::UploadExl3(w[j], d[j]);
      }
      for (int m : {1, 4, 9, 16}) {
        const auto xa = testing::RandomFp16(static_cast<size_t>(m) * k, rng);
        const auto xb = testing::RandomFp16(static_cast<size_t>(m) * k, rng);
        DeviceBuffer<uint16_t> dxa(xa), dxb(xb);
        std::vector<DeviceBuffer<float>> dy;
        for (int j = 0; j < 3; ++j) {
          dy.emplace_back(static_cast<size_t>(m) * ns[j]);
          dy.back().PoisonNaN();
        }
        const Exl3GemvJob jobs[3] = {{&d[0].linear, dxa.get(), dy[0].get()},
                                     {&d[1].linear, dxb.get(), dy[1].get()},
                                     {&d[2].linear, dxb.get(), dy[2].get()}};
        Exl3GemvBatch(jobs, 3, m, Exl3Out::kF32, ws, nullptr);
        CudaCheck(cudaStreamSynchronize(nullptr), "sync");
        for (int j = 0; j < 3; ++j) {
          const std::vector<float> y = dy[j].Download();
          ASSERT_TRUE(testing::AllFinite(y)) << "K" << K << " cb" << cb << " m=" << m << " job " << j;
          const std::vector<float> alone = RunAndCheck(w[j], d[j], Exl3ReconstructFp16(w[j]), j == 0 ? xa : xb, m, ws,
                                                       nullptr);
          for (int r = 0; r < m; ++r) {
            const std::vector<double> ref(alone.begin() + r * ns[j], alone.begin() + (r + 1) * ns[j]);
            EXPECT_LE(testing::RelL2(y.data() + r * ns[j], ref.data(), ns[j]), 1e-5)
                << "K" << K << " cb" << cb << " m=" << m << " job " << j << " row " << r << " vs its own launch";
          }
        }
        std::vector<std::vector<float>> first;
        for (int j = 0; j < 3; ++j) first.push_back(dy[j].Download());
        Exl3GemvBatch(jobs, 3, m, Exl3Out::kF32, ws, nullptr);
        CudaCheck(cudaStreamSynchronize(nullptr), "sync");
        for (int j = 0; j < 3; ++j)
          EXPECT_EQ(first[j], dy[j].Download()) << "K" << K << " cb" << cb << " m=" << m << " job " << j
                                                << ": batch not bitwise reproducible";
      }
    }
  std::mt19937 rng2(5);
  const Exl3Weight a = testing::RandomExl3Weight(256, 128, 2, Exl3Codebook::kMcg, rng2);
  const Exl3Weight b = testing::RandomExl3Weight(512, 128, 2, Exl3Codebook::kMcg, rng2);
  DeviceExl3 da, db;
  testing::UploadExl3(a, da);
  testing::UploadExl3(b, db);
  DeviceBuffer<uint16_t> x(std::vector<uint16_t>(512, 0));
  DeviceBuffer<float> y(128);
  const Exl3GemvJob mixed[2] = {{&da.linear, x.get(), y.get()}, {&db.linear, x.get(), y.get()}};
  try {
    Exl3GemvBatch(mixed, 2, 1, Exl3Out::kF32, ws, nullptr);
    ADD_FAILURE() << "a batch mixing k = 256 and k = 512 was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot share the launch"), std::string::npos) << e.what();
  }
}

// Many rows over 8 input blocks per CTA: the input transform runs on tensor cores (m >= 6 here; see
// Exl3GemvKernel), below that on shuffles. One CTA per SM and one strip per SM make every CTA take
// all 8 blocks of k = 1024 (no split-K).
TEST(Exl3GemvTest, TensorCoreInputTransformForManyRows) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(17);
  Exl3GemvTuning one_cta;
  one_cta.ctas_per_sm = 1;
  Exl3GemvWorkspace ws(16u << 20, one_cta);
  const int64_t k = 1024, n = 128LL * ws.num_sms();
  ASSERT_EQ(1, Exl3GemvSplits(k, n, 1, ws.num_sms(), 1));
  for (const int K : {2, 6}) {
    const Exl3Weight w = testing::RandomExl3Weight(k, n, K, Exl3Codebook::kMcg, rng);
    DeviceExl3 d;
    testing::UploadExl3(w, d);
    const auto what = Exl3ReconstructFp16(w);
    for (const int m : {5, 6, 11, 16}) {
      const auto x = testing::RandomFp16(static_cast<size_t>(m) * k, rng);
      RunAndCheck(w, d, what, x, m, ws, nullptr);
    }
  }
}

TEST(Exl3GemvTest, Fp16OutputMatchesFp32Output) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(3);
  Exl3GemvWorkspace ws;
  const Exl3Weight w = testing::RandomExl3Weight(1024, 384, 3, Exl3Codebook::kMcg, rng);
  DeviceExl3 d;
  testing::UploadExl3(w, d);
  const auto x = testing::RandomFp16(8 * 1024, rng);
  DeviceBuffer<uint16_t> dx(x), dyh(8 * 384);
  DeviceBuffer<float> dyf(8 * 384);
  Exl3Gemv(d.linear, dx.get(), 8, dyf.get(), Exl3Out::kF32, ws, nullptr);
  Exl3Gemv(d.linear, dx.get(), 8, dyh.get(), Exl3Out::kF16, ws, nullptr);
  CudaCheck(cudaDeviceSynchronize(), "sync");
  const auto yf = dyf.Download();
  const auto yh = dyh.Download();
  for (size_t i = 0; i < yf.size(); ++i) EXPECT_EQ(yh[i], FloatToFp16(yf[i])) << i;
}

// y += x W (Exl3GemvJob::accumulate, the shared expert's down projection adding into the MoE output): bit for
// bit y + the plain launch's result, at one split and at several (the last CTA of a strip adds).
TEST(Exl3GemvTest, AccumulateAddsThePlainResult) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(41);
  Exl3GemvWorkspace ws;
  for (const int64_t k : {128, 2048}) {
    const int64_t n = 512;
    const Exl3Weight w = testing::RandomExl3Weight(k, n, 6, Exl3Codebook::kMcg, rng);
    DeviceExl3 d;
    testing::UploadExl3(w, d);
    for (const int m : {1, 3, 16}) {
      const auto x = testing::RandomFp16(static_cast<size_t>(m) * k, rng);
      std::vector<float> base(static_cast<size_t>(m) * n);
      std::uniform_real_distribution<float> ud(-2.0f, 2.0f);
      for (float& v : base) v = ud(rng);
      DeviceBuffer<uint16_t> dx(x);
      DeviceBuffer<float> plain(static_cast<size_t>(m) * n), acc(base);
      Exl3Gemv(d.linear, dx.get(), m, plain.get(), Exl3Out::kF32, ws, nullptr);
      const Exl3GemvJob job{&d.linear, dx.get(), acc.get(), true};
      Exl3GemvBatch(&job, 1, m, Exl3Out::kF32, ws, nullptr);
      CudaCheck(cudaDeviceSynchronize(), "sync");
      const std::vector<float> y = plain.Download(), sum = acc.Download();
      for (size_t i = 0; i < y.size(); ++i) {
        const float want = base[i] + y[i];
        ASSERT_EQ(0, std::memcmp(&want, &sum[i], sizeof(float)))
            << "k=" << k << " m=" << m << " element " << i << ": " << sum[i] << " vs " << want;
      }
    }
  }
  DeviceBuffer<uint16_t> x(std::vector<uint16_t>(128, 0)), yh(128);
  const Exl3Weight w = testing::RandomExl3Weight(128, 128, 2, Exl3Codebook::kMcg, rng);
  DeviceExl3 d;
  testing::UploadExl3(w, d);
  const Exl3GemvJob half{&d.linear, x.get(), yh.get(), true};
  EXPECT_THROW(Exl3GemvBatch(&half, 1, 1, Exl3Out::kF16, ws, nullptr), std::runtime_error);
}

TEST(Exl3GemvTest, GraphCaptureAndReplayWithFreshInputs) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(5);
  cudaStream_t stream;
  CudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  Exl3GemvWorkspace ws;  // allocated before capture
  const Exl3Weight w1 = testing::RandomExl3Weight(4096, 512, 6, Exl3Codebook::kMcg, rng);   // split-K
  const Exl3Weight w2 = testing::RandomExl3Weight(1024, 4096, 2, Exl3Codebook::kMul1, rng);  // one split
  DeviceExl3 d1, d2;
  testing::UploadExl3(w1, d1);
  testing::UploadExl3(w2, d2);
  const int m = 16;
  DeviceBuffer<uint16_t> x1(m * 4096), x2(m * 1024);
  DeviceBuffer<float> y1(m * 512), y2(m * 4096);
  cudaGraph_t graph;
  CudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  Exl3Gemv(d1.linear, x1.get(), m, y1.get(), Exl3Out::kF32, ws, stream);
  Exl3Gemv(d2.linear, x2.get(), m, y2.get(), Exl3Out::kF32, ws, stream);
  CudaCheck(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec;
  CudaCheck(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  DeviceBuffer<float> r1(m * 512), r2(m * 4096);
  for (int rep = 0; rep < 5; ++rep) {
    x1.Upload(testing::RandomFp16(m * 4096, rng));
    x2.Upload(testing::RandomFp16(m * 1024, rng));
    y1.PoisonNaN();
    y2.PoisonNaN();
    // Upload/poison use the legacy stream, unordered with the non-blocking `stream`: finish them first.
    CudaCheck(cudaDeviceSynchronize(), "sync");
    CudaCheck(cudaGraphLaunch(exec, stream), "graph launch");
    Exl3Gemv(d1.linear, x1.get(), m, r1.get(), Exl3Out::kF32, ws, stream);
    Exl3Gemv(d2.linear, x2.get(), m, r2.get(), Exl3Out::kF32, ws, stream);
    CudaCheck(cudaStreamSynchronize(stream), "sync");
    EXPECT_EQ(y1.Download(), r1.Download()) << "replay " << rep;
    EXPECT_EQ(y2.Download(), r2.Download()) << "replay " << rep;
    EXPECT_TRUE(testing::AllFinite(y1.Download()));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(Exl3GemvTest, TwoStreamsAtOnceWithOwnWorkspaces) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(9);
  const Exl3Weight w = testing::RandomExl3Weight(4096, 1024, 2, Exl3Codebook::kMcg, rng);
  DeviceExl3 d;
  testing::UploadExl3(w, d);
  const int m = 8;
  DeviceBuffer<uint16_t> xa(testing::RandomFp16(m * 4096, rng)), xb(testing::RandomFp16(m * 4096, rng));
  cudaStream_t sa, sb;
  CudaCheck(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking), "stream");
  CudaCheck(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking), "stream");
  Exl3GemvWorkspace wa, wb;
  DeviceBuffer<float> ya(m * 1024), yb(m * 1024), refa(m * 1024), refb(m * 1024);
  Exl3Gemv(d.linear, xa.get(), m, refa.get(), Exl3Out::kF32, wa, sa);
  Exl3Gemv(d.linear, xb.get(), m, refb.get(), Exl3Out::kF32, wb, sb);
  CudaCheck(cudaDeviceSynchronize(), "sync");
  for (int it = 0; it < 50; ++it) {
    Exl3Gemv(d.linear, xa.get(), m, ya.get(), Exl3Out::kF32, wa, sa);
    Exl3Gemv(d.linear, xb.get(), m, yb.get(), Exl3Out::kF32, wb, sb);
  }
  CudaCheck(cudaDeviceSynchronize(), "sync");
  EXPECT_EQ(ya.Download(), refa.Download());
  EXPECT_EQ(yb.Download(), refb.Download());
  // One workspace on two streams is refused with a clear error instead of racing on its counters.
  try {
    Exl3Gemv(d.linear, xa.get(), m, ya.get(), Exl3Out::kF32, wa, sb);
    ADD_FAILURE() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("another stream"), std::string::npos) << e.what();
  }
  cudaStreamDestroy(sa);
  cudaStreamDestroy(sb);
}

// The split-K rule on the DeepSeek-V4-Flash dense shapes (132 SMs, 2 CTAs per SM: the H200 defaults).
// Host code only: runs without a GPU.
TEST(Exl3GemvTest, SplitRuleOnTheAnchorShapes) {
  constexpr int kSms = 132;
  // m <= 8: the full target (264 CTAs) unless that gives more than 8 splits, then half of it.
  EXPECT_EQ(16, Exl3GemvSplits(4096, 1024, 1, kSms));    // wq_a: 32 splits at 264 CTAs -> 16
  EXPECT_EQ(8, Exl3GemvSplits(4096, 2048, 4, kSms));     // shared_gate: 16 -> 8
  EXPECT_EQ(8, Exl3GemvSplits(2048, 4096, 1, kSms));     // shared_down: 8, kept
  EXPECT_EQ(32, Exl3GemvSplits(4096, 512, 1, kSms));     // wkv: one block per split either way
  EXPECT_EQ(1, Exl3GemvSplits(1024, 32768, 1, kSms));    // wq_b: 256 strips fill the GPU
  EXPECT_EQ(8, Exl3GemvSplits(8192, 4096, 1, kSms));     // wo_b: 8 blocks per split at most
  // m > 8: always half the target.
  EXPECT_EQ(16, Exl3GemvSplits(4096, 1024, 16, kSms));
  EXPECT_EQ(4, Exl3GemvSplits(2048, 4096, 16, kSms));
  // Never more splits than 128-blocks, never more than 8 blocks per split, at least one.
  for (const int64_t k : {128, 1024, 4096, 16384})
    for (const int64_t n : {128, 4096, 65536})
      for (const int m : {1, 8, 9, 16}) {
        const int s = Exl3GemvSplits(k, n, m, kSms);
        EXPECT_GE(s, 1);
        EXPECT_LE(s, k / 128);
        EXPECT_LE((k / 128 + s - 1) / s, exl3cuda::kGemvMaxBlocksPerSplit) << k << "x" << n << " m" << m;
      }
}

TEST(Exl3GemvTest, BadArgumentsRaiseWithTheLinearsName) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(1);
  Exl3GemvWorkspace ws;
  const Exl3Weight w = testing::RandomExl3Weight(256, 256, 4, Exl3Codebook::kMcg, rng);
  DeviceExl3 d;
  testing::UploadExl3(w, d);
  DeviceBuffer<uint16_t> x(17 * 256);
  DeviceBuffer<float> y(17 * 256);
  auto expect_error = [&](Exl3DeviceLinear l, int m, const char* what) {
    try {
      Exl3Gemv(l, x.get(), m, y.get(), Exl3Out::kF32, ws, nullptr);
      ADD_FAILURE() << "expected an error for " << what;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(l.name), std::string::npos) << e.what();
    }
  };
  expect_error(d.linear, 0, "m = 0");
  expect_error(d.linear, 17, "m = 17");
  Exl3DeviceLinear bad = d.linear;
  bad.k = 200;
  expect_error(bad, 1, "k % 128");
  bad = d.linear;
  bad.K = 9;
  expect_error(bad, 1, "K = 9");
  bad = d.linear;
  bad.trellis = nullptr;
  expect_error(bad, 1, "null trellis");
}

}  // namespace
}  // namespace dsmesh
