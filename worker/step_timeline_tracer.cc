#include "worker/step_timeline_tracer.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cupti_timeline.h"
#include "kernels/timeline/timeline_report.h"

namespace dsmesh {

std::unique_ptr<StepTimelineTracer> StepTimelineTracer::FromEnvironment(Backend& backend) {
  const char* v = std::getenv("DSMESH_WORKER_TIMELINE");
  if (!v || !*v) return nullptr;
  const std::string s = v;
  const size_t comma = s.find(',');
  long long after = -1, steps = -1;
  try {
    size_t used = 0;
    if (comma != std::string::npos) {
      after = std::stoll(s.substr(0, comma), &used);
      if (used != comma) after = -1;
      const std::string rest = s.substr(comma + 1);
      steps = std::stoll(rest, &used);
      if (used != rest.size()) steps = -1;
    }
  } catch (const std::exception&) {
    after = steps = -1;
  }
  if (after < 0 || steps < 1 || steps > 1000)
    throw std::runtime_error("DSMESH_WORKER_TIMELINE=" + s + ": expected AFTER,STEPS (steps AFTER+1 .. AFTER+STEPS "
                             "traced; AFTER >= 0, 1 <= STEPS <= 1000), e.g. 50,8");
  return std::make_unique<StepTimelineTracer>(backend, after, static_cast<int>(steps));
}

StepTimelineTracer::StepTimelineTracer(Backend& backend, int64_t after, int steps)
    : backend_(backend), after_(after), steps_(steps) {}

StepTimelineTracer::~StepTimelineTracer() = default;

void StepTimelineTracer::BeginStep() {
  if (done_) return;
  ++seen_;
  if (seen_ <= after_) return;
  if (!timeline_) {
    if (CudaBackendStream(backend_).cuda_stream == nullptr) {
      std::fprintf(stderr, "[worker] DSMESH_WORKER_TIMELINE: needs a CUDA device; the %s backend has no device "
                           "timeline\n", backend_.name().c_str());
      done_ = true;
      return;
    }
    try {
      timeline_ = std::make_unique<CuptiTimeline>();
    } catch (const std::runtime_error& e) {
      std::fprintf(stderr, "[worker] DSMESH_WORKER_TIMELINE: %s\n", e.what());
      done_ = true;
      return;
    }
  }
  begin_ = timeline_->Now();
}

void StepTimelineTracer::EndStep() {
  if (done_ || !timeline_ || seen_ <= after_) return;
  windows_.push_back({begin_, timeline_->Now()});
  if (static_cast<int>(windows_.size()) < steps_) return;
  done_ = true;
  try {
    const TimelineTrace trace = timeline_->Finish();
    std::fprintf(stderr, "[worker] DSMESH_WORKER_TIMELINE: steps %lld..%lld of this worker traced on the device:\n",
                 static_cast<long long>(after_ + 1), static_cast<long long>(after_ + steps_));
    PrintStepTimeline(AnalyzeStepTimeline(trace.records, windows_), 0, trace.dropped, stderr);
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "[worker] DSMESH_WORKER_TIMELINE: %s\n", e.what());
  }
  timeline_.reset();
}

}  // namespace dsmesh
