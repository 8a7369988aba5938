// Programmatic dependent launch on the decode chain (CudaBackendOptions::pdl, kernels/cuda/pdl_launch.cuh)
// changes when kernels start, never what they compute: on a small synthetic EXL3 model (GEMV, the
// single-launch MoE kernel, every small op of the forward) the logits with PDL equal those without, bit
// for bit, eagerly and from CUDA graphs, for decode steps of 1 and 4 sequences and verify-shaped steps;
// the backend counts its launches with the attribute (none when off), and the graphs it captures hold
// programmatic edges (none when off). Skips without a GPU (fails with DSMESH_REQUIRE_GPU_TESTS=1).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gpu_test_util.h"
#include "model/model.h"
#include "model/sequence_state.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace {

using namespace testing_util;

std::string SyntheticSource() {
  static std::string source;
  if (!source.empty()) return source;
  const std::string dir = TempDir("gpu_pdl_model");
  WriteTinyModel(dir, 7, SmallExl3Spec());
  source = "synthetic:" + dir + ":seed=1";
  return source;
}

std::unique_ptr<Model> Load(bool pdl, bool graphs) {
  CudaBackendOptions o;
  o.pdl = pdl;
  o.cuda_graphs = graphs;
  return LoadModel(SyntheticSource(), ShardSpec{}, MakeCudaBackend(0, o));
}

bool Bitwise(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && a.nbytes() > 0 && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

// PDL needs sm_90 (the H200); the backend keeps it off below and the counters would say nothing.
void RequirePdlDevice() {
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_GE(major, 9) << "programmatic dependent launch needs sm_90 or later";
}

TEST(GpuPdl, LogitsEqualWithoutPdlBitwiseEagerAndInGraphs) {
  DSMESH_REQUIRE_GPU();
  RequirePdlDevice();
  for (const bool graphs : {false, true}) {
    const char* mode = graphs ? "graphs" : "eager";
    auto on = Load(true, graphs), off = Load(false, graphs);
    const int V = static_cast<int>(on->config().vocab_size);
    std::vector<std::unique_ptr<SequenceState>> so, sf;
    for (int s = 0; s < 4; ++s) {
      so.push_back(on->NewState());
      sf.push_back(off->NewState());
      const std::vector<int32_t> prompt = Tokens(20 + 9 * s, V, 10 + s);
      ASSERT_TRUE(Bitwise(on->Forward({{so.back().get(), prompt, false}})[0].logits,
                          off->Forward({{sf.back().get(), prompt, false}})[0].logits))
          << mode << " prefill of sequence " << s;
    }
    for (int step = 0; step < 10; ++step) {
      // 1 sequence and 4 sequences in turn (each shape is seen, captured, then replayed); every 4th step
      // 3 rows per sequence, all with logits (verification).
      const int n = step % 2 == 0 ? 1 : 4, rows = step % 4 == 3 ? 3 : 1;
      std::vector<SequenceStep> bo, bf;
      for (int s = 0; s < n; ++s) {
        const std::vector<int32_t> t = Tokens(rows, V, 200 + step * 8 + s);
        bo.push_back({so[s].get(), t, rows > 1});
        bf.push_back({sf[s].get(), t, rows > 1});
      }
      const auto oo = on->Forward(bo), of = off->Forward(bf);
      for (int s = 0; s < n; ++s)
        ASSERT_TRUE(Bitwise(oo[s].logits, of[s].logits)) << mode << " step " << step << " sequence " << s;
    }
    const CudaBackendStatistics a = CudaBackendStats(on->backend()), b = CudaBackendStats(off->backend());
    std::printf("%s: %lld launches with PDL (off: %lld); graph captures %lld / %lld, replays %lld / %lld, failed %lld / %lld\n",
                mode, static_cast<long long>(a.pdl_launches), static_cast<long long>(b.pdl_launches),
                static_cast<long long>(a.graphs.captures), static_cast<long long>(b.graphs.captures),
                static_cast<long long>(a.graphs.replays), static_cast<long long>(b.graphs.replays),
                static_cast<long long>(a.graphs.failures + a.graphs.stateful_failures),
                static_cast<long long>(b.graphs.failures + b.graphs.stateful_failures));
    EXPECT_GT(a.pdl_launches, 0) << mode;
    EXPECT_EQ(b.pdl_launches, 0) << mode;
    EXPECT_GT(a.moe.fused_launches, 0) << mode << ": the routed experts did not take the single-launch kernel";
    if (graphs) {
      // PDL launches capture like plain ones: the same segments recorded and replayed, none refused.
      EXPECT_GT(a.graphs.replays, 0);
      EXPECT_GT(a.graphs.stateful_replays, 0);
      EXPECT_EQ(a.graphs.failures, 0);
      EXPECT_EQ(a.graphs.stateful_failures, 0);
      EXPECT_EQ(a.graphs.captures, b.graphs.captures);
      EXPECT_EQ(a.graphs.replays, b.graphs.replays);
      EXPECT_EQ(a.graphs.stateful_replays, b.graphs.stateful_replays);
    }
  }
}

// The graphs of a replayed decode step (Backend::TraceStepGraphs) hold programmatic edges with PDL on
// and none with it off; the node counts are the same.
TEST(GpuPdl, CapturedGraphsHoldProgrammaticEdges) {
  DSMESH_REQUIRE_GPU();
  RequirePdlDevice();
  int64_t nodes[2] = {0, 0};
  for (const bool pdl : {false, true}) {
    auto model = Load(pdl, true);
    const int V = static_cast<int>(model->config().vocab_size);
    auto st = model->NewState();
    model->Forward({{st.get(), Tokens(64, V, 3), false}});
    for (int i = 0; i < 3; ++i) model->Forward({{st.get(), {Tokens(1, V, 100 + i)[0]}, false}});  // seen, captured
    model->backend().TraceStepGraphs(true);
    model->Forward({{st.get(), {Tokens(1, V, 200)[0]}, false}});
    const StepGraphProfile g = model->backend().TakeStepGraphs(0);
    model->backend().TraceStepGraphs(false);
    ASSERT_FALSE(g.graphs.empty());
    EXPECT_EQ(g.captures, 0);
    int64_t programmatic = 0, kernels = 0;
    for (const StepGraph& s : g.graphs) {
      programmatic += s.shape.programmatic_edges;
      kernels += s.shape.kernels;
    }
    nodes[pdl] = g.nodes();
    std::printf("PDL %s: %lld graphs, %lld kernel nodes, %lld programmatic edges, dependent chain %lld\n",
                pdl ? "on" : "off", static_cast<long long>(g.graphs.size()), static_cast<long long>(kernels),
                static_cast<long long>(programmatic), static_cast<long long>(g.chain()));
    if (pdl) {
      EXPECT_GT(programmatic, 0) << "no programmatic edge survived the capture";
      EXPECT_LT(programmatic, kernels);
    } else {
      EXPECT_EQ(programmatic, 0);
    }
  }
  EXPECT_EQ(nodes[0], nodes[1]);
}

}  // namespace
}  // namespace dsmesh
