#include "kernels/timeline/step_timeline.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <set>
#include <unordered_map>

namespace dsmesh {
namespace {

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// A copy launched on its own (not a graph's node): what kAroundCopy gaps lie next to.
bool EagerCopy(const TimelineRecord& r) { return r.kind == TimelineKind::kMemcpy && r.graph_id == 0; }

// One step's records: its device work and the runtime calls that began in its window.
struct StepRecords {
  std::vector<TimelineRecord> work;  // clipped to the window, by start
  std::vector<const TimelineRecord*> calls;
};

// One step's gaps and counts into `sum`; its gaps also into `gaps`.
void AnalyzeStep(int index, const StepWindow& w, StepRecords& s,
                 const std::unordered_map<uint32_t, const TimelineRecord*>& call_of, StepTimelineSummary& sum,
                 std::vector<TimelineGap>& gaps) {
  const uint64_t wall = w.end_ns - w.begin_ns;
  sum.wall_ns += wall;
  sum.step_wall_ns.push_back(wall);
  for (const TimelineRecord* c : s.calls) {
    ++sum.runtime_calls;
    if (StartsWith(c->name, "cudaGraphLaunch")) ++sum.graph_launches;
    if (c->name.find("Synchronize") != std::string::npos) {
      ++sum.sync_calls;
      sum.sync_ns += c->end_ns - c->start_ns;
    }
  }
  auto add_gap = [&](GapCause cause, uint64_t from, uint64_t to, uint64_t host_wait, std::string before,
                     std::string after) {
    GapTotals& t = sum.gaps[static_cast<int>(cause)];
    ++t.count;
    t.ns += to - from;
    t.host_wait_ns += host_wait;
    gaps.push_back({cause, index, from - w.begin_ns, to - from, host_wait, std::move(before), std::move(after)});
  };
  if (s.work.empty()) {
    ++sum.steps_without_work;
    sum.step_busy_ns.push_back(0);
    add_gap(GapCause::kStepStart, w.begin_ns, w.end_ns, 0, "step begin", "step end");
    return;
  }
  // How long before `gap_end` the device waited for the call that launched `next` (clipped to the gap).
  auto host_wait = [&](const TimelineRecord& next, uint64_t gap_begin, uint64_t gap_end) -> uint64_t {
    const auto c = call_of.find(next.correlation_id);
    if (c == call_of.end()) return 0;
    const uint64_t called = std::min(c->second->start_ns, gap_end);
    return called > gap_begin ? called - gap_begin : 0;
  };
  uint64_t busy = 0, issued = w.begin_ns;
  std::set<uint32_t> launches_begun;  // correlation ids of the graph launches whose work has begun
  const TimelineRecord* last = nullptr;  // of the current busy stretch, the work that ends last
  uint64_t stretch_begin = 0;
  for (const TimelineRecord& r : s.work) {
    switch (r.kind) {
      case TimelineKind::kKernel:
        ++sum.kernels;
        if (r.graph_id != 0) ++sum.graph_kernels;
        break;
      case TimelineKind::kMemcpy: ++sum.memcpys; break;
      case TimelineKind::kMemset: ++sum.memsets; break;
      case TimelineKind::kApi: break;
    }
    const auto c = call_of.find(r.correlation_id);
    if (c == call_of.end()) {
      ++sum.unmatched_work;
    } else {
      issued = std::max(issued, std::min(c->second->end_ns, w.end_ns));
      if (r.start_ns < c->second->start_ns) ++sum.work_before_call;
    }
    const std::string after = DescribeTimelineWork(r);
    if (last == nullptr) {
      if (r.start_ns > w.begin_ns)
        add_gap(GapCause::kStepStart, w.begin_ns, r.start_ns, host_wait(r, w.begin_ns, r.start_ns), "step begin",
                after);
      stretch_begin = r.start_ns;
      last = &r;
    } else if (r.start_ns > last->end_ns) {
      busy += last->end_ns - stretch_begin;
      GapCause cause = GapCause::kEagerOp;
      if (r.graph_id != 0 && launches_begun.count(r.correlation_id))
        cause = GapCause::kInsideGraph;
      else if (EagerCopy(r) || EagerCopy(*last))
        cause = GapCause::kAroundCopy;
      else if (r.graph_id != 0)
        cause = GapCause::kGraphStart;
      add_gap(cause, last->end_ns, r.start_ns, host_wait(r, last->end_ns, r.start_ns), DescribeTimelineWork(*last),
              after);
      stretch_begin = r.start_ns;
      last = &r;
    } else if (r.end_ns > last->end_ns) {
      last = &r;
    }
    if (r.graph_id != 0) launches_begun.insert(r.correlation_id);
  }
  busy += last->end_ns - stretch_begin;
  if (w.end_ns > last->end_ns) add_gap(GapCause::kStepEnd, last->end_ns, w.end_ns, 0, DescribeTimelineWork(*last), "step end");
  sum.busy_ns += busy;
  sum.step_busy_ns.push_back(busy);
  sum.host_issue_ns += issued - w.begin_ns;
}

}  // namespace

const char* GapCauseName(GapCause cause) {
  switch (cause) {
    case GapCause::kStepStart: return "step_start";
    case GapCause::kGraphStart: return "graph_start";
    case GapCause::kInsideGraph: return "inside_graph";
    case GapCause::kAroundCopy: return "around_copy";
    case GapCause::kEagerOp: return "eager_op";
    case GapCause::kStepEnd: return "step_end";
  }
  return "?";
}

const char* GapCauseDescription(GapCause cause) {
  switch (cause) {
    case GapCause::kStepStart: return "step start (host begin -> first work)";
    case GapCause::kGraphStart: return "before a graph launch's first work";
    case GapCause::kInsideGraph: return "inside a graph launch (node to node)";
    case GapCause::kAroundCopy: return "around an eager copy (uploads, ToHost)";
    case GapCause::kEagerOp: return "before an eager kernel or memset";
    case GapCause::kStepEnd: return "step end (last work -> host end)";
  }
  return "?";
}

uint64_t StepTimelineSummary::host_wait_ns() const {
  uint64_t n = 0;
  for (const GapTotals& g : gaps) n += g.host_wait_ns;
  return n;
}

StepTimelineSummary AnalyzeStepTimeline(const std::vector<TimelineRecord>& records,
                                        const std::vector<StepWindow>& steps, int top) {
  StepTimelineSummary sum;
  sum.steps = static_cast<int>(steps.size());
  std::vector<int> order(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return steps[a].begin_ns < steps[b].begin_ns; });
  // The step whose window holds time t (work is placed by its start, a call by its start), or -1.
  auto step_at = [&](uint64_t t) -> int {
    auto it = std::upper_bound(order.begin(), order.end(), t,
                               [&](uint64_t v, int i) { return v < steps[i].begin_ns; });
    if (it == order.begin()) return -1;
    const int i = *(it - 1);
    return t < steps[i].end_ns ? i : -1;
  };
  std::vector<StepRecords> per_step(steps.size());
  std::unordered_map<uint32_t, const TimelineRecord*> call_of;
  for (const TimelineRecord& r : records) {
    if (!r.device()) call_of[r.correlation_id] = &r;
    const int i = step_at(r.start_ns);
    if (i < 0) {
      ++sum.records_outside;
      continue;
    }
    if (!r.device()) {
      per_step[i].calls.push_back(&r);
      continue;
    }
    TimelineRecord clipped = r;
    clipped.end_ns = std::min(std::max(r.end_ns, r.start_ns), steps[i].end_ns);
    per_step[i].work.push_back(std::move(clipped));
  }
  std::vector<TimelineGap> gaps;
  for (size_t i = 0; i < steps.size(); ++i) {
    std::vector<TimelineRecord>& work = per_step[i].work;
    std::stable_sort(work.begin(), work.end(), [](const TimelineRecord& a, const TimelineRecord& b) {
      return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.end_ns < b.end_ns;
    });
    AnalyzeStep(static_cast<int>(i), steps[i], per_step[i], call_of, sum, gaps);
  }
  std::stable_sort(gaps.begin(), gaps.end(),
                   [](const TimelineGap& a, const TimelineGap& b) { return a.length_ns > b.length_ns; });
  if (static_cast<int>(gaps.size()) > top) gaps.resize(std::max(top, 0));
  sum.top_gaps = std::move(gaps);
  return sum;
}

std::string DescribeTimelineWork(const TimelineRecord& r) {
  std::string s = r.kind == TimelineKind::kKernel ? ShortKernelName(r.name) : r.name;
  if (r.kind == TimelineKind::kMemcpy || r.kind == TimelineKind::kMemset) s += " " + std::to_string(r.bytes) + " B";
  if (r.graph_id != 0) s += " [graph]";
  return s;
}

std::string ShortKernelName(const std::string& mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status),
                                                   std::free);
  // A name that does not demangle is taken as it is (a C kernel's, or one a tracer demangled already).
  std::string s = status == 0 && demangled ? demangled.get() : mangled;
  for (size_t at; (at = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(at, 23);
  // Cut the parameter list, then a template function's return type, then the namespaces: each at template
  // depth 0 (template arguments keep their spaces, colons and parentheses).
  int depth = 0;
  size_t name_begin = 0, end = s.size();
  for (size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    if (ch == '<') ++depth;
    if (ch == '>') --depth;
    if (depth != 0) continue;
    if (ch == '(') {
      end = i;
      break;
    }
    if (ch == ' ') name_begin = i + 1;
    if (ch == ':' && i + 1 < s.size() && s[i + 1] == ':') name_begin = i + 2;
  }
  return end > name_begin ? s.substr(name_begin, end - name_begin) : s;
}

}  // namespace dsmesh
