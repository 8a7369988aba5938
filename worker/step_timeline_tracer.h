// DSMESH_WORKER_TIMELINE=AFTER,STEPS: a worker's steps AFTER+1 .. AFTER+STEPS (each a whole
// StepExecutor::Run: the forward, sampling and verification, the MTP drafts) traced on the device with
// CUPTI (kernels/cuda/cupti_timeline.h) and their accounting printed to stderr once
// (kernels/timeline/timeline_report.h): where a mesh step's time goes on the GPU, the twin of the in-process
// `dsmesh bench --timeline`. Steps are counted from the worker's start; empty plans are not steps. On a
// backend without a CUDA device, or when CUPTI cannot be loaded, it says so once and traces nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/timeline/step_timeline.h"

namespace dsmesh {

class CuptiTimeline;

class StepTimelineTracer {
 public:
  // The tracer the environment asks for, or null when DSMESH_WORKER_TIMELINE is unset. Throws
  // std::runtime_error naming the variable on a malformed value.
  static std::unique_ptr<StepTimelineTracer> FromEnvironment(Backend& backend);
  StepTimelineTracer(Backend& backend, int64_t after, int steps);
  ~StepTimelineTracer();
  StepTimelineTracer(const StepTimelineTracer&) = delete;
  StepTimelineTracer& operator=(const StepTimelineTracer&) = delete;

  void BeginStep();
  void EndStep();

 private:
  Backend& backend_;
  const int64_t after_;
  const int steps_;
  int64_t seen_ = 0;
  bool done_ = false;
  std::unique_ptr<CuptiTimeline> timeline_;
  uint64_t begin_ = 0;
  std::vector<StepWindow> windows_;
};

}  // namespace dsmesh
