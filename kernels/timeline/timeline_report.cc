#include "kernels/timeline/timeline_report.h"

#include <string>

namespace dsmesh {
namespace {

constexpr double kNsPerMs = 1e6;

}  // namespace

nlohmann::json PrintStepTimeline(const StepTimelineSummary& s, double untraced_step_ms, uint64_t dropped,
                                 std::FILE* out) {
  if (s.steps == 0) {
    std::fprintf(out, "  timeline: no step was traced\n");
    return nlohmann::json::object();
  }
  const double n = s.steps;
  // Per step, in ms.
  auto ms = [&](uint64_t ns) { return ns / kNsPerMs / n; };
  const double wall = ms(s.wall_ns), busy = ms(s.busy_ns), idle = ms(s.idle_ns());
  // (untraced_step_ms <= 0: no untraced figure of the same steps, as in a worker's trace)
  char untraced[48] = "";
  if (untraced_step_ms > 0) std::snprintf(untraced, sizeof untraced, " (untraced: %.3f)", untraced_step_ms);
  std::fprintf(out,
               "  timeline (CUPTI, %d steps traced%s): %.3f ms/step wall%s, device busy %.3f ms (%.1f %%), idle %.3f ms "
               "(%.1f %%)\n",
               s.steps, untraced_step_ms > 0 ? " after the timed ones" : "", wall, untraced, busy,
               100 * busy / wall, idle, 100 * idle / wall);
  nlohmann::json j = {{"traced_steps", s.steps}, {"wall_ms", wall},       {"untraced_step_ms", untraced_step_ms},
                      {"busy_ms", busy},         {"idle_ms", idle},       {"host_bound_ms", ms(s.host_wait_ns())}};
  std::fprintf(out, "  %-46s %9s %7s %9s %14s\n", "idle gaps per step, between", "ms", "% wall", "gaps",
               "host-bound ms");
  for (int c = 0; c < kGapCauses; ++c) {
    const GapTotals& g = s.gaps[c];
    const auto cause = static_cast<GapCause>(c);
    std::fprintf(out, "    %-44s %9.3f %7.1f %9.1f %14.3f\n", GapCauseDescription(cause), ms(g.ns),
                 100 * ms(g.ns) / wall, g.count / n, ms(g.host_wait_ns));
    j["gaps"][GapCauseName(cause)] = {{"ms", ms(g.ns)}, {"count", g.count / n}, {"host_bound_ms", ms(g.host_wait_ns)}};
  }
  int64_t gaps = 0;
  for (const GapTotals& g : s.gaps) gaps += g.count;
  std::fprintf(out, "    %-44s %9.3f %7.1f %9.1f %14.3f\n", "all idle time", idle, 100 * idle / wall, gaps / n,
               ms(s.host_wait_ns()));
  std::fprintf(out, "  (host-bound: the part of a gap before the runtime call that launched the work after it began)\n");
  std::fprintf(out,
               "  per step: %.1f graph launches, %.1f kernels (%.1f in graphs), %.1f copies, %.1f memsets; %.1f runtime "
               "calls, %.1f of them synchronizing (%.3f ms in them); the host had issued the step's work %.3f ms into "
               "the step\n",
               s.graph_launches / n, s.kernels / n, s.graph_kernels / n, s.memcpys / n, s.memsets / n,
               s.runtime_calls / n, s.sync_calls / n, ms(s.sync_ns), ms(s.host_issue_ns));
  j["per_step"] = {{"graph_launches", s.graph_launches / n}, {"kernels", s.kernels / n},
                   {"graph_kernels", s.graph_kernels / n},   {"memcpys", s.memcpys / n},
                   {"memsets", s.memsets / n},               {"runtime_calls", s.runtime_calls / n},
                   {"sync_calls", s.sync_calls / n},         {"sync_ms", ms(s.sync_ns)},
                   {"host_issued_ms", ms(s.host_issue_ns)}};
  if (!s.top_gaps.empty())
    std::fprintf(out, "  largest gaps (step, start into it, length, host-bound part: the work before -> after):\n");
  for (const TimelineGap& g : s.top_gaps) {
    std::fprintf(out, "    step %d at %8.3f ms: %8.1f us (host-bound %6.1f) %s: %s -> %s\n", g.step,
                 g.offset_ns / kNsPerMs, g.length_ns / 1e3, g.host_wait_ns / 1e3, GapCauseName(g.cause),
                 g.before.c_str(), g.after.c_str());
    j["top_gaps"].push_back({{"step", g.step}, {"at_ms", g.offset_ns / kNsPerMs}, {"us", g.length_ns / 1e3},
                             {"host_bound_us", g.host_wait_ns / 1e3}, {"cause", GapCauseName(g.cause)},
                             {"before", g.before}, {"after", g.after}});
  }
  for (size_t i = 0; i < s.step_wall_ns.size(); ++i) {
    j["step_wall_ms"].push_back(s.step_wall_ns[i] / kNsPerMs);
    j["step_busy_ms"].push_back(s.step_busy_ns[i] / kNsPerMs);
  }
  j["dropped_records"] = dropped;
  j["unmatched_work"] = s.unmatched_work;
  j["work_before_call"] = s.work_before_call;
  j["steps_without_work"] = s.steps_without_work;
  // What makes the figures above doubtful, said where they are printed.
  if (dropped > 0) std::fprintf(out, "  WARNING: CUPTI dropped %llu records\n", static_cast<unsigned long long>(dropped));
  if (s.steps_without_work > 0)
    std::fprintf(out, "  WARNING: %d traced steps have no device work recorded (is CUPTI tracing kernels?)\n",
                 s.steps_without_work);
  if (s.work_before_call > 0)
    std::fprintf(out, "  WARNING: %lld records of device work start before their launching call (timestamps off)\n",
                 static_cast<long long>(s.work_before_call));
  if (s.unmatched_work > 0)
    std::fprintf(out, "  note: %lld records of device work have no runtime call among the records (host-bound counted 0)\n",
                 static_cast<long long>(s.unmatched_work));
  return j;
}

}  // namespace dsmesh
