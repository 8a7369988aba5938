// GPU parity and safety tests of the routed-expert kernel (kernels/cuda/exl3_moe.h).
// Oracle: an fp64 reference of every (row, expert) built on the CPU decoder of kernels/exl3
// (bit-exact Ŵ), exact Hadamards, clamped SwiGLU in fp64 and the weighted sum over the top-k slots.
// Without a GPU every test skips with a message; on the GPU machine they run for real.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cuda/exl3_device_weights.h"
#include "kernels/cuda/exl3_moe.h"
#include "kernels/cuda/gpu_test_util.h"

namespace dsmesh {
namespace {

using testing::DeviceBuffer;
using testing::DeviceExl3;

// 256 random EXL3 experts (MCG) on the host and the device, with the layer's pointer tables.
class Experts {
 public:
  Experts(int num_experts, int hidden, int inter, int K, float limit, uint32_t seed)
      : E_(num_experts), d_(hidden), I_(inter) {
    std::mt19937 rng(seed);
    host_.resize(E_ * 3);
    std::vector<Exl3DeviceMoeLayer::Expert> experts(E_);
    for (int e = 0; e < E_; ++e) {
      for (int p = 0; p < 3; ++p) {
        const int64_t k = p == 2 ? I_ : d_, n = p == 2 ? d_ : I_;
        host_[e * 3 + p] = testing::RandomExl3Weight(k, n, K, Exl3Codebook::kMcg, rng);
        host_[e * 3 + p].name = "experts." + std::to_string(e) + (p == 0 ? ".gate" : p == 1 ? ".up" : ".down");
      }
      experts[e] = {&host_[e * 3], &host_[e * 3 + 1], &host_[e * 3 + 2]};
    }
    device_ = std::make_unique<Exl3DeviceMoeLayer>("test.mlp.experts", experts, limit);
    layer_ = device_->layer();
  }

  const Exl3MoeLayer& layer() const { return layer_; }
  Exl3MoeLayer& layer() { return layer_; }
  int hidden() const { return d_; }

  // fp64 reference output of one row.
  std::vector<double> Reference(const uint16_t* x, const int32_t* ids, const float* w, int topk) {
    std::vector<double> xr(d_), y(d_, 0.0);
    for (int i = 0; i < d_; ++i) xr[i] = Fp16ToFloat(x[i]);
    const double L = layer_.swiglu_limit;
    for (int k = 0; k < topk; ++k) {
      const int e = ids[k];
      if (e < 0 || e >= E_) continue;
      const auto& g = host_[e * 3], &u = host_[e * 3 + 1], &dn = host_[e * 3 + 2];
      const auto gv = testing::Exl3RowF64(What(e * 3), g.suh.as<uint16_t>(), g.svh.as<uint16_t>(), xr.data(), d_, I_);
      const auto uv = testing::Exl3RowF64(What(e * 3 + 1), u.suh.as<uint16_t>(), u.svh.as<uint16_t>(), xr.data(), d_, I_);
      std::vector<double> a(I_);
      for (int j = 0; j < I_; ++j) {
        double gj = gv[j], uj = uv[j];
        if (L > 0) {
          gj = std::min(gj, L);
          uj = std::clamp(uj, -L, L);
        }
        a[j] = gj / (1.0 + std::exp(-gj)) * uj;
      }
      const auto o = testing::Exl3RowF64(What(e * 3 + 2), dn.suh.as<uint16_t>(), dn.svh.as<uint16_t>(), a.data(), I_, d_);
      for (int i = 0; i < d_; ++i) y[i] += static_cast<double>(w[k]) * o[i];
    }
    return y;
  }

 private:
  const std::vector<uint16_t>& What(int idx) {
    auto it = what_.find(idx);
    if (it == what_.end()) it = what_.emplace(idx, Exl3ReconstructFp16(host_[idx])).first;
    return it->second;
  }

  int E_, d_, I_;
  std::vector<Exl3Weight> host_;
  std::unique_ptr<Exl3DeviceMoeLayer> device_;
  std::map<int, std::vector<uint16_t>> what_;
  Exl3MoeLayer layer_;
};

struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routing RandomRouting(int m, int topk, int E, std::mt19937& rng) {
  Routing r;
  std::uniform_real_distribution<float> wd(0.05f, 1.0f);
  for (int row = 0; row < m; ++row) {
    std::vector<int> all(E);
    for (int e = 0; e < E; ++e) all[e] = e;
    std::shuffle(all.begin(), all.end(), rng);
    for (int k = 0; k < topk; ++k) {
      r.ids.push_back(all[k]);
      r.weights.push_back(wd(rng));
    }
  }
  return r;
}

// Runs the kernel (NaN-poisoned output) twice and checks parity and bitwise reproducibility.
void RunAndCheck(Experts& ex, Exl3MoeWorkspace& ws, int m, int topk, const std::vector<uint16_t>& x,
                 const Routing& r, const std::string& what) {
  const int d = ex.hidden();
  DeviceBuffer<uint16_t> dx(x);
  DeviceBuffer<int32_t> dids(r.ids);
  DeviceBuffer<float> dw(r.weights), dy(static_cast<size_t>(m) * d);
  dy.PoisonNaN();
  Exl3MoeForward(ex.layer(), dx.get(), dids.get(), dw.get(), m, dy.get(), ws, nullptr);
  CudaCheck(cudaDeviceSynchronize(), what);
  const auto y = dy.Download();
  ASSERT_TRUE(testing::AllFinite(y)) << what << ": NaN left in the output";
  for (int row = 0; row < m; ++row) {
    const auto ref = ex.Reference(x.data() + row * d, r.ids.data() + row * topk, r.weights.data() + row * topk, topk);
    EXPECT_LE(testing::RelL2(y.data() + row * d, ref.data(), d), 2e-3) << what << " m=" << m << " row " << row;
  }
  dy.PoisonNaN();
  Exl3MoeForward(ex.layer(), dx.get(), dids.get(), dw.get(), m, dy.get(), ws, nullptr);
  CudaCheck(cudaDeviceSynchronize(), what);
  const auto y2 = dy.Download();
  EXPECT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * sizeof(float))) << what << ": not bitwise reproducible";
}

constexpr int kTopK = 6;

// Slot 0 of rows 0 .. rows - 1 goes to `expert` (a hot expert with R_e = rows); other slots that picked it
// take `spare` instead, so that no row lists it twice.
void RouteEveryRowTo(Routing& r, int rows, int expert, int spare) {
  for (int row = 0; row < rows; ++row) {
    for (int k = 1; k < kTopK; ++k)
      if (r.ids[row * kTopK + k] == expert) r.ids[row * kTopK + k] = spare;
    r.ids[row * kTopK] = expert;
  }
}

// Slot 0 of rows 0 .. rows - 1 alternates between the edge ids 255 and 0 (two hot experts, R_e = rows / 2
// each); other slots that picked either take 9 instead.
void RouteSlot0ToEdgeIds(Routing& r, int rows) {
  for (int row = 0; row < rows; ++row) {
    for (int k = 1; k < kTopK; ++k)
      if (r.ids[row * kTopK + k] == 0 || r.ids[row * kTopK + k] == 255) r.ids[row * kTopK + k] = 9;
    r.ids[row * kTopK] = row % 2 ? 0 : 255;
  }
}

TEST(Exl3MoeTest, EveryRowCountFrom1To24WithUniqueExperts) {
  DSMESH_REQUIRE_GPU();
  Experts ex(256, 512, 256, 2, 10.0f, 1);
  Exl3MoeWorkspace ws(24, kTopK, 512, 256);
  std::mt19937 rng(2);
  for (int m = 1; m <= 24; ++m) {
    const auto r = RandomRouting(m, kTopK, 256, rng);
    RunAndCheck(ex, ws, m, kTopK, testing::RandomFp16(m * 512, rng, 0.1f), r, "unique");
  }
}

TEST(Exl3MoeTest, HotExpertDuplicatesAndEdgeIds) {
  DSMESH_REQUIRE_GPU();
  Experts ex(256, 512, 256, 3, 10.0f, 3);
  Exl3MoeWorkspace ws(24, kTopK, 512, 256);
  std::mt19937 rng(4);
  // One hot expert: every row of 24 routes slot 0 to expert 7 (R_e = 24, two 16-row passes).
  {
    auto r = RandomRouting(24, kTopK, 256, rng);
    RouteEveryRowTo(r, 24, 7, 8);
    RunAndCheck(ex, ws, 24, kTopK, testing::RandomFp16(24 * 512, rng, 0.1f), r, "hot expert");
  }
  // R_e = 16 exactly, ids 0 and 255, and duplicates within a row (same expert in two slots).
  {
    auto r = RandomRouting(20, kTopK, 256, rng);
    for (int row = 0; row < 20; ++row)
      for (int k = 0; k < kTopK; ++k)
        if (r.ids[row * kTopK + k] == 3 || r.ids[row * kTopK + k] == 0 || r.ids[row * kTopK + k] == 255)
          r.ids[row * kTopK + k] = 100 + k;
    for (int row = 0; row < 16; ++row) r.ids[row * kTopK + 1] = 3;
    r.ids[0 * kTopK + 2] = 0;
    r.ids[5 * kTopK + 3] = 255;
    r.ids[17 * kTopK + 4] = 0;
    r.ids[9 * kTopK + 4] = r.ids[9 * kTopK + 5] = 42;  // duplicate within row 9
    r.ids[19 * kTopK + 0] = r.ids[19 * kTopK + 1] = r.ids[19 * kTopK + 2] = 255;
    RunAndCheck(ex, ws, 20, kTopK, testing::RandomFp16(20 * 512, rng, 0.1f), r, "edges");
  }
  // All 24 rows on the same six experts (every expert R_e = 24).
  {
    Routing r;
    for (int row = 0; row < 24; ++row)
      for (int k = 0; k < kTopK; ++k) {
        r.ids.push_back(250 + k);
        r.weights.push_back(0.1f * (k + 1));
      }
    RunAndCheck(ex, ws, 24, kTopK, testing::RandomFp16(24 * 512, rng, 0.1f), r, "six hot experts");
  }
}

// Down items of 256 columns (taken by the kernel at m = 16, d = 4096, I <= 1024: Exl3MoeWideDownItems)
// forced on for every launch: every row count, a hot expert and edge ids.
TEST(Exl3MoeTest, WideDownItemsMatchReference) {
  DSMESH_REQUIRE_GPU();
  Experts ex(256, 512, 256, 2, 10.0f, 11);
  Exl3MoeTuning wide;
  wide.down_wide = 1;
  Exl3MoeWorkspace ws(24, kTopK, 512, 256, wide);
  std::mt19937 rng(12);
  for (int m = 1; m <= 24; ++m) {
    const auto r = RandomRouting(m, kTopK, 256, rng);
    RunAndCheck(ex, ws, m, kTopK, testing::RandomFp16(m * 512, rng, 0.1f), r, "wide down, unique");
  }
  auto r = RandomRouting(24, kTopK, 256, rng);
  RouteSlot0ToEdgeIds(r, 24);
  RunAndCheck(ex, ws, 24, kTopK, testing::RandomFp16(24 * 512, rng, 0.1f), r, "wide down, hot ids 0 and 255");
}

// Down items that finish the gate/up sums themselves (taken by the kernel when the experts are few:
// Exl3MoeFusedFinish) forced on for every launch: every row count, a hot expert over two 16-row passes,
// ids 0 and 255, a duplicate within a row, narrow and wide down items; then I = 2048 (the down input in
// two chunks at 16 rows, one warp per (row, block) task) with the clamp active.
TEST(Exl3MoeTest, FusedFinishMatchesReference) {
  DSMESH_REQUIRE_GPU();
  Exl3MoeTuning fused;
  fused.fused_finish = 1;
  {
    Experts ex(256, 512, 256, 2, 10.0f, 13);
    for (const int wide : {0, 1}) {
      Exl3MoeTuning tuning = fused;
      tuning.down_wide = wide;
      Exl3MoeWorkspace ws(24, kTopK, 512, 256, tuning);
      std::mt19937 rng(14);
      const std::string what = "fused finish, wide " + std::to_string(wide);
      for (int m = 1; m <= 24; ++m) {
        const auto r = RandomRouting(m, kTopK, 256, rng);
        RunAndCheck(ex, ws, m, kTopK, testing::RandomFp16(m * 512, rng, 0.1f), r, what + ", unique");
      }
      auto r = RandomRouting(24, kTopK, 256, rng);
      RouteSlot0ToEdgeIds(r, 24);
      r.ids[3 * kTopK + 4] = r.ids[3 * kTopK + 5] = 77;  // duplicate within a row
      RunAndCheck(ex, ws, 24, kTopK, testing::RandomFp16(24 * 512, rng, 0.1f), r, what + ", hot ids 0 and 255");
    }
  }
  {
    Experts ex(32, 256, 2048, 3, 1.0f, 15);
    Exl3MoeWorkspace ws(24, kTopK, 256, 2048, fused);
    std::mt19937 rng(16);
    for (int m : {1, 3}) {
      const auto r = RandomRouting(m, kTopK, 32, rng);
      RunAndCheck(ex, ws, m, kTopK, testing::RandomFp16(m * 256, rng, 0.2f), r, "fused finish, I=2048");
    }
    auto r = RandomRouting(16, kTopK, 32, rng);
    RouteEveryRowTo(r, 16, 31, 30);
    RunAndCheck(ex, ws, 16, kTopK, testing::RandomFp16(16 * 256, rng, 0.2f), r, "fused finish, I=2048 hot");
  }
  {
    // d = 2048, I = 1024, 8 experts: the k-split rule of fused launches on another shape.
    Experts ex(8, 2048, 1024, 2, 10.0f, 17);
    Exl3MoeWorkspace ws(24, kTopK, 2048, 1024, fused);
    std::mt19937 rng(18);
    for (int m : {1, 2, 5}) {
      const auto r = RandomRouting(m, kTopK, 8, rng);
      RunAndCheck(ex, ws, m, kTopK, testing::RandomFp16(m * 2048, rng, 0.1f), r, "fused finish, d=2048 I=1024");
    }
  }
}

// When the down items finish the gate/up sums: only while the experts' 128-column down items cannot fill
// the grid (d = 4096, top-6 of 256, 264 resident CTAs). Host code only: runs without a GPU.
TEST(Exl3MoeTest, FusedFinishChoice) {
  EXPECT_TRUE(Exl3MoeFusedFinish(1, 6, 256, 4096, 264));    // 6 x 32 = 192 < 264
  EXPECT_FALSE(Exl3MoeFusedFinish(2, 6, 256, 4096, 264));   // 12 x 32 = 384
  EXPECT_FALSE(Exl3MoeFusedFinish(16, 6, 256, 4096, 264));
  EXPECT_TRUE(Exl3MoeFusedFinish(16, 6, 4, 4096, 264));    // 4 experts: 4 x 32 = 128
  // Its k-split: the largest divisor of 32 with 6 experts x NB x S <= 264.
  EXPECT_EQ(16, Exl3MoeFusedSplits(1, 6, 256, 4096, 256, 132, 2));   // 12 x 16 = 192
  EXPECT_EQ(4, Exl3MoeFusedSplits(1, 6, 256, 4096, 1024, 132, 2));   // 48 x 4 = 192 (5 would not divide)
  EXPECT_EQ(2, Exl3MoeFusedSplits(1, 6, 256, 4096, 2048, 132, 2));   // 96 x 2 = 192
  EXPECT_EQ(1, Exl3MoeFusedSplits(1, 6, 256, 4096, 4096, 132, 2));   // 192 x 2 > 264
}

// The automatic choice on the DeepSeek-V4-Flash shapes (d = 4096, top-6, 264 resident CTAs on the H200).
// Host code only: runs without a GPU.
TEST(Exl3MoeTest, WideDownItemChoice) {
  for (const int inter : {256, 1024}) {
    EXPECT_TRUE(Exl3MoeWideDownItems(16, 6, 256, 4096, inter, 264)) << inter;   // 80 x 16 >= 2 x 264
    EXPECT_FALSE(Exl3MoeWideDownItems(4, 6, 256, 4096, inter, 264)) << inter;   // 24 x 16 < 2 x 264
    EXPECT_FALSE(Exl3MoeWideDownItems(1, 6, 256, 4096, inter, 264)) << inter;
  }
  EXPECT_FALSE(Exl3MoeWideDownItems(16, 6, 256, 4096, 2048, 264));  // long items: 128 columns measured faster
  EXPECT_FALSE(Exl3MoeWideDownItems(24, 6, 256, 384, 256, 6));      // hidden / 128 odd: no column pairs
  EXPECT_FALSE(Exl3MoeWideDownItems(16, 6, 8, 4096, 256, 264));     // 8 experts: only 8 x 16 items
}

// The gate/up k-split on the anchor shapes (d = 4096, top-6 of 256, 132 SMs x 2 items): enough items for
// the target, one split fewer where m = 1 would leave a short trailing round, and always 1..d / 128.
TEST(Exl3MoeTest, GateUpSplitChoice) {
  EXPECT_EQ(5, Exl3MoeSplits(1, 6, 256, 4096, 1024, 132, 2));   // 6 x 8 x 6 = 288 > 264 by 24: 240 items
  EXPECT_EQ(2, Exl3MoeSplits(1, 6, 256, 4096, 2048, 132, 2));   // 6 x 16 x 3 = 288: 192 items
  EXPECT_EQ(22, Exl3MoeSplits(1, 6, 256, 4096, 256, 132, 2));   // 6 x 2 x 22 = 264: exactly the target
  EXPECT_EQ(6, Exl3MoeSplits(4, 6, 256, 4096, 256, 132, 2));    // 24 experts: their down items fill the GPU
  EXPECT_EQ(2, Exl3MoeSplits(4, 6, 256, 4096, 1024, 132, 2));
  EXPECT_EQ(1, Exl3MoeSplits(16, 6, 256, 4096, 2048, 132, 2));
  EXPECT_EQ(2, Exl3MoeSplits(16, 6, 256, 4096, 256, 132, 2));
  for (int m = 1; m <= 24; ++m)
    for (const int inter : {128, 256, 1024, 4096})
      for (const int hidden : {256, 4096, 8192}) {
        const int s = Exl3MoeSplits(m, 6, 256, hidden, inter, 132, 2);
        EXPECT_GE(s, 1);
        EXPECT_LE(s, hidden / 128) << m << " " << inter << " " << hidden;
      }
}

TEST(Exl3MoeTest, LargerShapesK3AndActiveClamp) {
  DSMESH_REQUIRE_GPU();
  // I = 1024 (8 blocks), d = 1024; a small limit makes the SwiGLU clamp bite on many elements.
  Experts ex(256, 1024, 1024, 3, 1.0f, 5);
  Exl3MoeWorkspace ws(24, kTopK, 1024, 1024);
  std::mt19937 rng(6);
  for (int m : {1, 2, 4, 8, 16}) {
    const auto r = RandomRouting(m, kTopK, 256, rng);
    RunAndCheck(ex, ws, m, kTopK, testing::RandomFp16(m * 1024, rng, 0.2f), r, "I=1024 K=3");
  }
  // 16 rows on one expert: 16-row activations need several chunks in the gate/up items.
  auto r = RandomRouting(16, kTopK, 256, rng);
  RouteEveryRowTo(r, 16, 11, 12);
  RunAndCheck(ex, ws, 16, kTopK, testing::RandomFp16(16 * 1024, rng, 0.2f), r, "I=1024 hot");
}

TEST(Exl3MoeTest, GraphCaptureAndReplayWithFreshInputs) {
  DSMESH_REQUIRE_GPU();
  Experts ex(256, 512, 256, 2, 10.0f, 7);
  cudaStream_t stream;
  CudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  Exl3MoeWorkspace ws(24, kTopK, 512, 256);
  std::mt19937 rng(8);
  const int m = 16;
  DeviceBuffer<uint16_t> dx(m * 512);
  DeviceBuffer<int32_t> dids(m * kTopK);
  DeviceBuffer<float> dw(m * kTopK), dy(m * 512), dref(m * 512);
  cudaGraph_t graph;
  CudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  Exl3MoeForward(ex.layer(), dx.get(), dids.get(), dw.get(), m, dy.get(), ws, stream);
  CudaCheck(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec;
  CudaCheck(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int rep = 0; rep < 6; ++rep) {
    const auto x = testing::RandomFp16(m * 512, rng, 0.1f);
    const auto r = RandomRouting(m, kTopK, 256, rng);
    dx.Upload(x);
    dids.Upload(r.ids);
    dw.Upload(r.weights);
    dy.PoisonNaN();
    // Upload/poison use the legacy stream, unordered with the non-blocking `stream`: finish them first.
    CudaCheck(cudaDeviceSynchronize(), "sync");
    CudaCheck(cudaGraphLaunch(exec, stream), "graph launch");
    Exl3MoeForward(ex.layer(), dx.get(), dids.get(), dw.get(), m, dref.get(), ws, stream);
    CudaCheck(cudaStreamSynchronize(stream), "sync");
    const auto y = dy.Download();
    EXPECT_EQ(y, dref.Download()) << "replay " << rep;
    ASSERT_TRUE(testing::AllFinite(y));
    if (rep == 0) {
      for (int row = 0; row < m; ++row) {
        const auto ref = ex.Reference(x.data() + row * 512, r.ids.data() + row * kTopK, r.weights.data() + row * kTopK, kTopK);
        EXPECT_LE(testing::RelL2(y.data() + row * 512, ref.data(), 512), 2e-3) << "graph row " << row;
      }
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(Exl3MoeTest, TwoStreamsAtOnceWithOwnWorkspaces) {
  DSMESH_REQUIRE_GPU();
  Experts ex(256, 512, 256, 2, 10.0f, 9);
  std::mt19937 rng(10);
  const int m = 16;
  const auto xa = testing::RandomFp16(m * 512, rng, 0.1f), xb = testing::RandomFp16(m * 512, rng, 0.1f);
  const auto ra = RandomRouting(m, kTopK, 256, rng), rb = RandomRouting(m, kTopK, 256, rng);
  DeviceBuffer<uint16_t> dxa(xa), dxb(xb);
  DeviceBuffer<int32_t> ia(ra.ids), ib(rb.ids);
  DeviceBuffer<float> wa(ra.weights), wb(rb.weights), ya(m * 512), yb(m * 512), refa(m * 512), refb(m * 512);
  cudaStream_t sa, sb;
  CudaCheck(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking), "stream");
  CudaCheck(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking), "stream");
  Exl3MoeWorkspace wsa(24, kTopK, 512, 256), wsb(24, kTopK, 512, 256);
  Exl3MoeForward(ex.layer(), dxa.get(), ia.get(), wa.get(), m, refa.get(), wsa, sa);
  CudaCheck(cudaStreamSynchronize(sa), "sync");
  Exl3MoeForward(ex.layer(), dxb.get(), ib.get(), wb.get(), m, refb.get(), wsb, sb);
  CudaCheck(cudaStreamSynchronize(sb), "sync");
  for (int it = 0; it < 40; ++it) {
    Exl3MoeForward(ex.layer(), dxa.get(), ia.get(), wa.get(), m, ya.get(), wsa, sa);
    Exl3MoeForward(ex.layer(), dxb.get(), ib.get(), wb.get(), m, yb.get(), wsb, sb);
  }
  CudaCheck(cudaDeviceSynchronize(), "sync");
  EXPECT_EQ(ya.Download(), refa.Download());
  EXPECT_EQ(yb.Download(), refb.Download());
  try {
    Exl3MoeForward(ex.layer(), dxa.get(), ia.get(), wa.get(), m, ya.get(), wsa, sb);
    ADD_FAILURE() << "expected an error for one workspace on two streams";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("another stream"), std::string::npos) << e.what();
  }
  cudaStreamDestroy(sa);
  cudaStreamDestroy(sb);
}

TEST(Exl3MoeTest, LayerBuilderRejectsMixedKCodebookAndShapes) {
  DSMESH_REQUIRE_GPU();
  std::mt19937 rng(13);
  std::vector<Exl3Weight> w;
  w.push_back(testing::RandomExl3Weight(512, 256, 2, Exl3Codebook::kMcg, rng));
  w.push_back(testing::RandomExl3Weight(512, 256, 2, Exl3Codebook::kMcg, rng));
  w.push_back(testing::RandomExl3Weight(256, 512, 2, Exl3Codebook::kMcg, rng));
  w.push_back(testing::RandomExl3Weight(512, 256, 3, Exl3Codebook::kMcg, rng));   // wrong K
  w.push_back(testing::RandomExl3Weight(512, 256, 2, Exl3Codebook::kMul1, rng));  // wrong codebook
  w.push_back(testing::RandomExl3Weight(512, 384, 2, Exl3Codebook::kMcg, rng));   // wrong shape
  w[3].name = "experts.1.gate";
  w[4].name = "experts.1.up";
  w[5].name = "experts.1.down";
  auto expect = [&](const Exl3Weight* g, const Exl3Weight* u, const Exl3Weight* d, const std::string& name) {
    try {
      Exl3DeviceMoeLayer l("layer", {{&w[0], &w[1], &w[2]}, {g, u, d}}, 10.f);
      ADD_FAILURE() << "expected an error naming " << name;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  expect(&w[3], &w[1], &w[2], "experts.1.gate");
  expect(&w[0], &w[4], &w[2], "experts.1.up");
  expect(&w[0], &w[1], &w[5], "experts.1.down");
  Exl3DeviceMoeLayer ok("layer", {{&w[0], &w[1], &w[2]}, {&w[0], &w[1], &w[2]}}, 10.f);
  EXPECT_EQ(ok.layer().num_experts, 2);
  EXPECT_EQ(ok.layer().hidden, 512);
  EXPECT_EQ(ok.layer().inter, 256);
}

TEST(Exl3MoeTest, StrictModeCountersAndBadIds) {
  DSMESH_REQUIRE_GPU();
  Experts ex(256, 512, 256, 2, 10.0f, 11);
  Exl3MoeWorkspace ws(24, kTopK, 512, 256);
  std::mt19937 rng(12);
  DeviceBuffer<uint16_t> dx(testing::RandomFp16(25 * 512, rng, 0.1f));
  auto r = RandomRouting(25, kTopK, 256, rng);
  DeviceBuffer<int32_t> dids(r.ids);
  DeviceBuffer<float> dw(r.weights), dy(25 * 512);
  const Exl3MoeCounters before = ws.counts();
  EXPECT_THROW(Exl3MoeForward(ex.layer(), dx.get(), dids.get(), dw.get(), 25, dy.get(), ws, nullptr), std::runtime_error);
  Exl3MoeLayer l3 = ex.layer();
  l3.codebook = 0;
  EXPECT_FALSE(Exl3MoeSupports(l3, 4, kTopK));
  EXPECT_THROW(Exl3MoeForward(l3, dx.get(), dids.get(), dw.get(), 4, dy.get(), ws, nullptr), std::runtime_error);
  const Exl3MoeCounters mid = ws.counts();
  EXPECT_EQ(mid.rejected, before.rejected + 2);
  EXPECT_EQ(mid.launches, before.launches);
  Exl3MoeForward(ex.layer(), dx.get(), dids.get(), dw.get(), 4, dy.get(), ws, nullptr);
  const Exl3MoeCounters after = ws.counts();
  EXPECT_EQ(after.launches, mid.launches + 1);
  EXPECT_EQ(after.rows, mid.rows + 4);
  EXPECT_FALSE(ws.TakeBadIdFlag());
  // An id out of range is ignored and flagged (never a wild read).
  r.ids[3] = 300;
  dids.Upload(r.ids);
  Exl3MoeForward(ex.layer(), dx.get(), dids.get(), dw.get(), 4, dy.get(), ws, nullptr);
  EXPECT_TRUE(ws.TakeBadIdFlag());
  EXPECT_FALSE(ws.TakeBadIdFlag());
  EXPECT_TRUE(testing::AllFinite(dy.Download()));
  // No valid id at all: no expert work, and the NaN-poisoned outputs are overwritten with zeros.
  for (int i = 0; i < 2 * kTopK; ++i) r.ids[i] = i % 2 ? 300 : -1;
  dids.Upload(r.ids);
  DeviceBuffer<float> dy2(std::vector<float>(2 * 512, std::nanf("")));
  Exl3MoeForward(ex.layer(), dx.get(), dids.get(), dw.get(), 2, dy2.get(), ws, nullptr);
  EXPECT_TRUE(ws.TakeBadIdFlag());
  for (float v : dy2.Download()) ASSERT_EQ(v, 0.f);
}

}  // namespace
}  // namespace dsmesh
