// `dsmesh bench --timeline` without a GPU: the printed accounting and its JSON for two made-up steps (the
// numbers worked out by hand), nothing traced, and the CPU backend told that a timeline needs a CUDA device.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "kernels/timeline/timeline_report.h"
#include "cli/bench/printed.h"
#include "cli/bench/timeline_trace.h"
#include "kernels/timeline/test_records.h"
#include "kernels/cpu/cpu_backend.h"

namespace dsmesh {
namespace {

// Two steps of 1 ms each. Step 0: a graph launch called at 0.1 ms whose kernels run 0.3-0.5 and 0.6-0.9 ms.
// Step 1: an eager kernel called at 1.1 ms, run 1.2-1.8 ms. Per step: busy (0.5 + 0.6) / 2 = 0.55 ms;
// step start (0.3 + 0.2) / 2 = 0.25 ms, of it host-bound (0.1 + 0.1) / 2 = 0.1; inside a graph 0.05;
// step end (0.1 + 0.2) / 2 = 0.15.
StepTimelineSummary TwoSteps() {
  const auto K = TimelineKind::kKernel;
  const std::vector<TimelineRecord> r = {
      Call(1, "cudaGraphLaunch", 100000, 110000),
      Work(K, 1, 5, "_Z4attnv", 300000, 500000),
      Work(K, 1, 5, "_Z3ffnv", 600000, 900000),
      Call(2, "cudaLaunchKernel", 1100000, 1105000),
      Work(K, 2, 0, "_Z4headv", 1200000, 1800000),
  };
  return AnalyzeStepTimeline(r, {{0, 1000000}, {1000000, 2000000}});
}

TEST(TimelineReport, PrintsTheAccountingPerStep) {
  nlohmann::json j;
  const std::string out = Printed([&](std::FILE* f) { j = PrintStepTimeline(TwoSteps(), 0.9, 0, f); });
  EXPECT_EQ(j["traced_steps"], 2);
  EXPECT_DOUBLE_EQ(j["wall_ms"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["untraced_step_ms"].get<double>(), 0.9);
  EXPECT_DOUBLE_EQ(j["busy_ms"].get<double>(), 0.55);
  EXPECT_DOUBLE_EQ(j["idle_ms"].get<double>(), 0.45);
  EXPECT_DOUBLE_EQ(j["gaps"]["step_start"]["ms"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(j["gaps"]["step_start"]["host_bound_ms"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(j["gaps"]["inside_graph"]["ms"].get<double>(), 0.05);
  EXPECT_DOUBLE_EQ(j["gaps"]["inside_graph"]["count"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["gaps"]["step_end"]["ms"].get<double>(), 0.15);
  EXPECT_DOUBLE_EQ(j["gaps"]["graph_start"]["ms"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(j["host_bound_ms"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(j["per_step"]["graph_launches"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["per_step"]["kernels"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(j["per_step"]["graph_kernels"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["per_step"]["host_issued_ms"].get<double>(), (0.11 + 0.105) / 2);
  ASSERT_EQ(j["top_gaps"].size(), 5u);
  EXPECT_EQ(j["top_gaps"][0]["cause"], "step_start");
  EXPECT_EQ(j["top_gaps"][0]["step"], 0);
  EXPECT_DOUBLE_EQ(j["top_gaps"][0]["us"].get<double>(), 300.0);
  EXPECT_EQ(j["top_gaps"][0]["after"], "attn [graph]");
  EXPECT_EQ(j["step_wall_ms"], nlohmann::json({1.0, 1.0}));
  EXPECT_EQ(j["step_busy_ms"], nlohmann::json({0.5, 0.6}));
  EXPECT_NE(out.find("2 steps traced after the timed ones): 1.000 ms/step wall (untraced: 0.900), device busy 0.550 ms "
                     "(55.0 %), idle 0.450 ms (45.0 %)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("step start (host begin -> first work)"), std::string::npos) << out;
  EXPECT_NE(out.find("step 0 at    0.000 ms:    300.0 us (host-bound  100.0) step_start: step begin -> attn [graph]"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("WARNING"), std::string::npos) << out;
}

TEST(TimelineReport, WarnsOfWhatMakesTheFiguresDoubtful) {
  StepTimelineSummary s = AnalyzeStepTimeline({}, {{0, 1000}});
  s.work_before_call = 2;
  nlohmann::json j;
  const std::string out = Printed([&](std::FILE* f) { j = PrintStepTimeline(s, 0.001, 7, f); });
  EXPECT_EQ(j["dropped_records"], 7);
  EXPECT_EQ(j["steps_without_work"], 1);
  EXPECT_NE(out.find("WARNING: CUPTI dropped 7 records"), std::string::npos) << out;
  EXPECT_NE(out.find("WARNING: 1 traced steps have no device work"), std::string::npos) << out;
  EXPECT_NE(out.find("WARNING: 2 records of device work start before their launching call"), std::string::npos)
      << out;
}

TEST(TimelineReport, NothingTraced) {
  nlohmann::json j;
  const std::string out = Printed([&](std::FILE* f) { j = PrintStepTimeline(StepTimelineSummary{}, 1.0, 0, f); });
  EXPECT_TRUE(j.empty());
  EXPECT_EQ(out, "  timeline: no step was traced\n");
}

TEST(TimelineTrace, TheCpuBackendIsToldItNeedsACudaDevice) {
  auto cpu = MakeCpuBackend();
  int steps_run = 0;
  nlohmann::json j;
  const std::string out =
      Printed([&](std::FILE* f) { j = TraceStepTimeline(*cpu, [&] { ++steps_run; }, 4, 1.0, f); });
  EXPECT_EQ(steps_run, 0);
  EXPECT_TRUE(j.empty());
  EXPECT_NE(out.find("timeline: needs a CUDA device (--device cuda)"), std::string::npos) << out;
}

}  // namespace
}  // namespace dsmesh
