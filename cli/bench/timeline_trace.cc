#include "cli/bench/timeline_trace.h"

#include <optional>
#include <stdexcept>
#include <vector>

#include "kernels/timeline/timeline_report.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cupti_timeline.h"
#include "kernels/timeline/step_timeline.h"

namespace dsmesh {

nlohmann::json TraceStepTimeline(Backend& backend, const std::function<void()>& step, int steps,
                                 double untraced_step_ms, std::FILE* out) {
  if (CudaBackendStream(backend).cuda_stream == nullptr) {
    std::fprintf(out, "  timeline: needs a CUDA device (--device cuda); the %s backend has no device timeline\n",
                 backend.name().c_str());
    return nlohmann::json::object();
  }
  std::optional<CuptiTimeline> timeline;
  try {
    timeline.emplace();
  } catch (const std::runtime_error& e) {
    std::fprintf(out, "  timeline: %s\n", e.what());
    return {{"error", e.what()}};
  }
  step();
  std::vector<StepWindow> windows;
  for (int i = 0; i < steps; ++i) {
    const uint64_t begin = timeline->Now();
    step();
    windows.push_back({begin, timeline->Now()});
  }
  TimelineTrace trace;
  try {
    trace = timeline->Finish();
  } catch (const std::runtime_error& e) {
    std::fprintf(out, "  timeline: %s\n", e.what());
    return {{"error", e.what()}};
  }
  return PrintStepTimeline(AnalyzeStepTimeline(trace.records, windows), untraced_step_ms, trace.dropped, out);
}

}  // namespace dsmesh
