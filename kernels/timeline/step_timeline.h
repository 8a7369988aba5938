// Where a step's wall time goes on the device timeline (`dsmesh bench --timeline`): from the records of
// traced steps (timeline_record.h) and the host's step windows, the time the device was busy (the union of
// kernel, copy and memset intervals: overlapping work counts once) and the idle gaps between, each gap
// named by what ends and what starts it, and the part of it the device spent waiting for the host (the
// runtime call that launched the next work began after the gap began). The gaps of a step add up to its
// idle time exactly.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/timeline/timeline_record.h"

namespace dsmesh {

// What an idle gap lies between. Checked in this order for a gap between device work A and B:
// kInsideGraph when B belongs to a graph launch whose work already began (kernel to kernel in one launch);
// kAroundCopy when A or B is a copy launched on its own (the stateful segments' parameter uploads, the
// step's ToHost); kGraphStart when B is the first work of a graph launch; else kEagerOp (B a kernel or
// memset launched on its own). kStepStart / kStepEnd: from the host's step begin to the first work, and
// from the last work to the host's step end (the final sync's return and what the host does after it).
enum class GapCause { kStepStart, kGraphStart, kInsideGraph, kAroundCopy, kEagerOp, kStepEnd };
inline constexpr int kGapCauses = 6;
const char* GapCauseName(GapCause cause);  // "step start", "graph start", ... (JSON keys)
const char* GapCauseDescription(GapCause cause);  // the printed label

struct TimelineGap {
  GapCause cause = GapCause::kStepStart;
  int step = 0;               // index into the step windows
  uint64_t offset_ns = 0;     // gap start after the step's begin
  uint64_t length_ns = 0;
  // The part of the gap before the runtime call that launched the work after it began: the device waited
  // for the host. 0 when the call came first (the gap is launch latency or a dependency), at the step's end,
  // or when the call is not among the records.
  uint64_t host_wait_ns = 0;
  std::string before, after;  // the work on each side (DescribeTimelineWork), "step begin" / "step end"
};

// Per cause, summed over the traced steps.
struct GapTotals {
  int64_t count = 0;
  uint64_t ns = 0, host_wait_ns = 0;
};

struct StepTimelineSummary {
  int steps = 0;
  // Summed over the steps (divide by steps for per-step figures; the printer and JSON do).
  uint64_t wall_ns = 0, busy_ns = 0;
  std::array<GapTotals, kGapCauses> gaps{};
  int64_t graph_launches = 0;    // cudaGraphLaunch calls within the steps
  int64_t kernels = 0, graph_kernels = 0, memcpys = 0, memsets = 0;
  int64_t runtime_calls = 0;
  // Runtime calls that block the host until the device is done with something (names holding
  // "Synchronize": the step's ToHost, a wait for the last parameter upload), their count and time inside.
  int64_t sync_calls = 0;
  uint64_t sync_ns = 0;
  // From each step's begin to the end of the last runtime call that launched device work of the step:
  // when the host had issued the whole step.
  uint64_t host_issue_ns = 0;
  // Device work whose launching call is not among the records (its host wait is unknown, counted 0).
  int64_t unmatched_work = 0;
  // Device work that starts before its launching call began: impossible, so a record whose timestamps are
  // not on the calls' clock (the figures above are then doubtful).
  int64_t work_before_call = 0;
  // Steps in which no device work was recorded (all of their time is idle, as step start).
  int steps_without_work = 0;
  // Device work and runtime calls outside every step window (not counted above).
  int64_t records_outside = 0;
  // Each step's wall and busy time, in order.
  std::vector<uint64_t> step_wall_ns, step_busy_ns;
  // The largest gaps of all steps, largest first.
  std::vector<TimelineGap> top_gaps;

  uint64_t idle_ns() const { return wall_ns - busy_ns; }
  uint64_t host_wait_ns() const;  // all causes
};

// Analyzes the records (in any order) against the host's step windows (in any order, not overlapping).
// Work is clipped to its step's window; the `top` largest gaps are kept.
StepTimelineSummary AnalyzeStepTimeline(const std::vector<TimelineRecord>& records,
                                        const std::vector<StepWindow>& steps, int top = 12);

// A record as the summary names it: a kernel's demangled function name without namespaces and
// parameters (ShortKernelName), a copy's or memset's name and bytes ("memcpy HtoD (pinned) 1216 B"), and
// " [graph]" after work a graph launch ran.
std::string DescribeTimelineWork(const TimelineRecord& r);

// "_ZN6dsmesh8cuda_ops12_GLOBAL__N_17HcPostKILi4EEEvPKfPf" -> "HcPostK<4>": demangled, then without the
// return type, namespaces and parameters; a name that does not demangle is trimmed the same way
// ("void ns::K<2>(float*)" -> "K<2>", "plain_kernel" stays).
std::string ShortKernelName(const std::string& mangled);

}  // namespace dsmesh
