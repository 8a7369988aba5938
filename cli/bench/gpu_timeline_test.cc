// `dsmesh bench --timeline` on the CUDA backend, on the small synthetic EXL3 model of gpu_profile_test: the
// decode steps' CUPTI timeline as the bench prints it, checked against the backend's own count of graph
// launches and against itself (busy + idle = wall, the gaps add up to the idle time, every piece of work
// linked to its launching call, nothing dropped). Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "cli/bench/timeline_trace.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gpu_test_util.h"
#include "model/model.h"
#include "model/sequence_state.h"
#include "model/testing/test_util.h"
#include "model/testing/tiny_model.h"

namespace dsmesh {
namespace {

using namespace testing_util;

TEST(GpuTimeline, DecodeStepsAccountForTheirWallTime) {
  DSMESH_REQUIRE_GPU();
  const std::string dir = TempDir("gpu_timeline_model");
  WriteTinyModel(dir, 7, SmallExl3Spec());
  std::unique_ptr<Model> model = LoadModel("synthetic:" + dir + ":seed=1", ShardSpec{}, MakeCudaBackend(0));
  std::unique_ptr<SequenceState> st = model->NewState();
  const int vocab = static_cast<int>(model->config().vocab_size);
  model->Forward({{st.get(), Tokens(64, vocab, 3), false}});
  int i = 0;
  auto step = [&] { model->Forward({{st.get(), {Tokens(1, vocab, 1000 + i++)[0]}, false}}); };
  for (int k = 0; k < 3; ++k) step();  // first sight eager, then captured, then replayed

  const int64_t launches0 = CudaBackendStats(model->backend()).host.graph_launches;
  const nlohmann::json j = TraceStepTimeline(model->backend(), step, 3, 1.0);
  const int64_t launches = CudaBackendStats(model->backend()).host.graph_launches - launches0;
  ASSERT_FALSE(j.empty());
  ASSERT_FALSE(j.contains("error")) << j["error"];
  EXPECT_EQ(j["traced_steps"], 3);
  EXPECT_EQ(j["dropped_records"], 0);
  EXPECT_EQ(j["unmatched_work"], 0);
  EXPECT_EQ(j["work_before_call"], 0);
  EXPECT_EQ(j["steps_without_work"], 0);
  const double wall = j["wall_ms"], busy = j["busy_ms"], idle = j["idle_ms"];
  EXPECT_GT(busy, 0);
  EXPECT_GT(idle, 0);
  EXPECT_NEAR(busy + idle, wall, 1e-9);
  double gaps = 0;
  for (const auto& [cause, g] : j["gaps"].items()) gaps += g["ms"].get<double>();
  EXPECT_NEAR(gaps, idle, 1e-6);
  // The trace ran one untimed step and 3 traced ones, all replaying the same graphs.
  const double per_step = j["per_step"]["graph_launches"];
  EXPECT_GT(per_step, 0);
  EXPECT_NEAR(per_step, launches / 4.0, 1.0);
  EXPECT_GT(j["per_step"]["graph_kernels"].get<double>(), per_step);
  EXPECT_LE(j["per_step"]["graph_kernels"].get<double>(), j["per_step"]["kernels"].get<double>());
  EXPECT_GE(j["per_step"]["memcpys"].get<double>(), 1);  // at least the ToHost
  EXPECT_GE(j["gaps"]["step_end"]["count"].get<double>(), 1);
  EXPECT_LE(j["per_step"]["host_issued_ms"].get<double>(), wall);
  EXPECT_FALSE(j["top_gaps"].empty());
  step();  // the model steps on after the trace
}

}  // namespace
}  // namespace dsmesh
