// AnalyzeStepTimeline on hand-made timelines whose gaps were worked out by hand: one step holding a gap of
// every cause (host-bound and not), a step with no device work, work outside the steps, overlapping work,
// and the kernel names as the summary shows them.
#include "kernels/timeline/step_timeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "kernels/timeline/test_records.h"

namespace dsmesh {
namespace {

const GapTotals& Gaps(const StepTimelineSummary& s, GapCause c) { return s.gaps[static_cast<int>(c)]; }

// Step [1000, 2000): a parameter upload, a graph launch (two kernels), a host-bound graph launch whose two
// kernels overlap (two streams), an eager kernel, an eager kernel whose call is missing, an eager memset
// whose call came late, the ToHost copy and its sync. Times in ns.
std::vector<TimelineRecord> OneStepOfEveryGap() {
  const auto K = TimelineKind::kKernel;
  return {
      Call(1, "cudaMemcpyAsync", 1010, 1020),
      Work(TimelineKind::kMemcpy, 1, 0, "memcpy HtoD (pinned)", 1050, 1060, 1216),  // step start 50, host 10
      Call(2, "cudaGraphLaunch", 1030, 1040),
      Work(K, 2, 7, "_Z5attnPfi", 1070, 1100),         // around copy 10 (after the upload)
      Work(K, 2, 7, "_Z5indexPfi", 1110, 1150),        // inside graph 10
      Call(3, "cudaGraphLaunch", 1200, 1210),
      Work(K, 3, 8, "_Z3ffnPfi", 1220, 1300),          // graph start 70, host 50 (the call began at 1200)
      Work(K, 3, 8, "_Z6expertPfi", 1250, 1320),       // overlaps: no gap, busy to 1320
      Call(4, "cudaLaunchKernel", 1310, 1315),
      Work(K, 4, 0, "_Z6hcpostPfi", 1330, 1400),       // eager op 10
      Work(K, 5, 0, "_Z7orphanedPfi", 1420, 1430),     // eager op 20, no call recorded
      Call(6, "cudaMemsetAsync", 1435, 1440),
      Work(TimelineKind::kMemset, 6, 0, "memset", 1450, 1460, 64),  // eager op 20, host 5
      Call(7, "cudaMemcpyAsync", 1440, 1445),
      Work(TimelineKind::kMemcpy, 7, 0, "memcpy DtoH (pinned)", 1470, 1480, 8),  // around copy 10
      Call(8, "cudaStreamSynchronize", 1446, 1490),
      // step end 520
  };
}

TEST(StepTimeline, EveryGapCauseOfOneStep) {
  const StepTimelineSummary s = AnalyzeStepTimeline(OneStepOfEveryGap(), {{1000, 2000}});
  EXPECT_EQ(s.steps, 1);
  EXPECT_EQ(s.wall_ns, 1000u);
  EXPECT_EQ(s.busy_ns, 10u + 30 + 40 + 100 + 70 + 10 + 10 + 10);
  EXPECT_EQ(s.idle_ns(), 720u);
  EXPECT_EQ(Gaps(s, GapCause::kStepStart).ns, 50u);
  EXPECT_EQ(Gaps(s, GapCause::kStepStart).host_wait_ns, 10u);
  EXPECT_EQ(Gaps(s, GapCause::kAroundCopy).ns, 20u);
  EXPECT_EQ(Gaps(s, GapCause::kAroundCopy).count, 2);
  EXPECT_EQ(Gaps(s, GapCause::kAroundCopy).host_wait_ns, 0u);
  EXPECT_EQ(Gaps(s, GapCause::kInsideGraph).ns, 10u);
  EXPECT_EQ(Gaps(s, GapCause::kInsideGraph).count, 1);
  EXPECT_EQ(Gaps(s, GapCause::kGraphStart).ns, 70u);
  EXPECT_EQ(Gaps(s, GapCause::kGraphStart).host_wait_ns, 50u);
  EXPECT_EQ(Gaps(s, GapCause::kEagerOp).ns, 50u);
  EXPECT_EQ(Gaps(s, GapCause::kEagerOp).count, 3);
  EXPECT_EQ(Gaps(s, GapCause::kEagerOp).host_wait_ns, 5u);
  EXPECT_EQ(Gaps(s, GapCause::kStepEnd).ns, 520u);
  EXPECT_EQ(s.host_wait_ns(), 65u);
  uint64_t gap_sum = 0;
  for (const GapTotals& g : s.gaps) gap_sum += g.ns;
  EXPECT_EQ(gap_sum, s.idle_ns());
  EXPECT_EQ(s.graph_launches, 2);
  EXPECT_EQ(s.kernels, 6);
  EXPECT_EQ(s.graph_kernels, 4);
  EXPECT_EQ(s.memcpys, 2);
  EXPECT_EQ(s.memsets, 1);
  EXPECT_EQ(s.runtime_calls, 7);
  EXPECT_EQ(s.sync_calls, 1);
  EXPECT_EQ(s.sync_ns, 44u);
  EXPECT_EQ(s.host_issue_ns, 445u);  // the ToHost copy's call ended at 1445
  EXPECT_EQ(s.unmatched_work, 1);
  EXPECT_EQ(s.work_before_call, 0);
  EXPECT_EQ(s.records_outside, 0);
  ASSERT_EQ(s.top_gaps.size(), 9u);
  EXPECT_EQ(s.top_gaps[0].cause, GapCause::kStepEnd);
  EXPECT_EQ(s.top_gaps[0].before, "memcpy DtoH (pinned) 8 B");
  EXPECT_EQ(s.top_gaps[0].after, "step end");
  const TimelineGap& g = s.top_gaps[1];
  EXPECT_EQ(g.cause, GapCause::kGraphStart);
  EXPECT_EQ(g.offset_ns, 150u);
  EXPECT_EQ(g.length_ns, 70u);
  EXPECT_EQ(g.host_wait_ns, 50u);
  EXPECT_EQ(g.before, "index [graph]");
  EXPECT_EQ(g.after, "ffn [graph]");
  EXPECT_EQ(s.top_gaps[2].cause, GapCause::kStepStart);
  EXPECT_EQ(s.top_gaps[2].before, "step begin");
  EXPECT_EQ(s.top_gaps[2].after, "memcpy HtoD (pinned) 1216 B");
}

// The same records shuffled, a second step with no device work given first, and work and calls outside
// both steps: the first step's figures do not change.
TEST(StepTimeline, StepsInAnyOrderAndRecordsOutside) {
  std::vector<TimelineRecord> r = OneStepOfEveryGap();
  r.push_back(Work(TimelineKind::kKernel, 20, 0, "_Z4warmv", 500, 900));  // before the steps
  r.push_back(Call(21, "cudaLaunchKernel", 2100, 2110));                   // between them
  std::mt19937 rng(3);
  std::shuffle(r.begin(), r.end(), rng);
  const StepTimelineSummary s = AnalyzeStepTimeline(r, {{3000, 3400}, {1000, 2000}}, 3);
  EXPECT_EQ(s.steps, 2);
  EXPECT_EQ(s.wall_ns, 1400u);
  EXPECT_EQ(s.busy_ns, 280u);
  EXPECT_EQ(s.steps_without_work, 1);
  EXPECT_EQ(Gaps(s, GapCause::kStepStart).ns, 50u + 400);
  EXPECT_EQ(s.records_outside, 2);
  EXPECT_EQ(s.kernels, 6);
  ASSERT_EQ(s.step_wall_ns.size(), 2u);
  EXPECT_EQ(s.step_wall_ns[0], 400u);  // in the order given
  EXPECT_EQ(s.step_busy_ns[1], 280u);
  ASSERT_EQ(s.top_gaps.size(), 3u);
  EXPECT_EQ(s.top_gaps[0].length_ns, 520u);
  EXPECT_EQ(s.top_gaps[1].step, 0);
  EXPECT_EQ(s.top_gaps[1].length_ns, 400u);
  EXPECT_EQ(s.top_gaps[2].length_ns, 70u);
}

// Work that runs past the step's end is clipped to it; back-to-back and overlapping work (programmatic
// dependent launch) leaves no gap; a graph launch whose work is interleaved with another stream's is
// still "inside" once its first node ran.
TEST(StepTimeline, OverlapsAndClipping) {
  const auto K = TimelineKind::kKernel;
  const std::vector<TimelineRecord> r = {
      Call(1, "cudaGraphLaunch", 0, 5),
      Work(K, 1, 3, "_Z1av", 10, 20),
      Work(K, 1, 3, "_Z1bv", 18, 30),  // starts before a ends
      Work(K, 1, 3, "_Z1cv", 30, 40),  // starts as b ends
      Call(2, "cudaLaunchKernel", 6, 8),
      Work(K, 2, 0, "_Z1dv", 45, 50),  // eager op 5
      Work(K, 1, 3, "_Z1ev", 60, 150),  // inside graph 10 (launch 1 already began), clipped to 100
  };
  const StepTimelineSummary s = AnalyzeStepTimeline(r, {{0, 100}});
  EXPECT_EQ(s.busy_ns, 30u + 5 + 40);
  EXPECT_EQ(Gaps(s, GapCause::kStepStart).ns, 10u);
  EXPECT_EQ(Gaps(s, GapCause::kStepStart).host_wait_ns, 0u);
  EXPECT_EQ(Gaps(s, GapCause::kEagerOp).ns, 5u);
  EXPECT_EQ(Gaps(s, GapCause::kInsideGraph).ns, 10u);
  EXPECT_EQ(Gaps(s, GapCause::kInsideGraph).count, 1);
  EXPECT_EQ(Gaps(s, GapCause::kGraphStart).count, 0);
  EXPECT_EQ(Gaps(s, GapCause::kStepEnd).count, 0);
  EXPECT_EQ(s.graph_launches, 1);
  EXPECT_EQ(s.host_issue_ns, 8u);
}

// A kernel timed before its own launch call began is counted (its timestamps are on another clock).
TEST(StepTimeline, WorkBeforeItsCallIsCounted) {
  const std::vector<TimelineRecord> r = {Call(1, "cudaLaunchKernel", 50, 60),
                                         Work(TimelineKind::kKernel, 1, 0, "_Z1av", 20, 30)};
  const StepTimelineSummary s = AnalyzeStepTimeline(r, {{0, 100}});
  EXPECT_EQ(s.work_before_call, 1);
  EXPECT_EQ(s.unmatched_work, 0);
}

TEST(StepTimeline, NoStepsNoRecords) {
  const StepTimelineSummary s = AnalyzeStepTimeline({}, {});
  EXPECT_EQ(s.steps, 0);
  EXPECT_EQ(s.wall_ns, 0u);
  EXPECT_TRUE(s.top_gaps.empty());
}

TEST(StepTimeline, KernelNamesAsShown) {
  EXPECT_EQ(ShortKernelName("_Z5plainPfi"), "plain");
  EXPECT_EQ(ShortKernelName("_ZN6dsmesh8cuda_ops13RmsNormKernelEPfi"), "RmsNormKernel");
  EXPECT_EQ(ShortKernelName("_ZN6dsmesh8cuda_ops12_GLOBAL__N_17HcPostKILi4ELb1EEEvPKfPf"), "HcPostK<4, true>");
  EXPECT_EQ(ShortKernelName("plain_kernel"), "plain_kernel");
  EXPECT_EQ(ShortKernelName("dsmesh::cuda_ops::(anonymous namespace)::EmptyKernel()"), "EmptyKernel");
  EXPECT_EQ(ShortKernelName("void dsmesh::Gemv<2, (Codebook)1>(float const*, float*)"), "Gemv<2, (Codebook)1>");
  EXPECT_EQ(ShortKernelName(""), "");
  TimelineRecord copy = Work(TimelineKind::kMemcpy, 1, 9, "memcpy DtoD", 0, 1, 4096);
  EXPECT_EQ(DescribeTimelineWork(copy), "memcpy DtoD 4096 B [graph]");
}

}  // namespace
}  // namespace dsmesh
