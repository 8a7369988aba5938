// One entry of a device timeline as a tracer recorded it (kernels/cuda/cupti_timeline.h fills these from
// CUPTI's activity records): device work (a kernel, a copy, a memset) or a host call into the CUDA runtime.
// Plain data with no CUDA types, so the analysis (step_timeline.h) builds and is tested without CUDA.
#pragma once

#include <cstdint>
#include <string>

namespace dsmesh {

enum class TimelineKind { kKernel, kMemcpy, kMemset, kApi };

struct TimelineRecord {
  TimelineKind kind = TimelineKind::kKernel;
  // Nanoseconds on the tracer's clock (CUPTI's: cuptiGetTimestamp reads the same clock on the host).
  uint64_t start_ns = 0, end_ns = 0;
  // Device work: the id of the runtime call that launched it (every kernel of one graph launch carries the
  // graph launch's). A runtime call: its own id.
  uint32_t correlation_id = 0;
  // The graph whose launch ran this work; 0 for work launched on its own (and for runtime calls).
  uint32_t graph_id = 0;
  uint32_t stream_id = 0;
  uint64_t bytes = 0;  // copies and memsets
  // A kernel: its (mangled) function name; a copy: "memcpy HtoD (pinned)" and the like; a runtime call:
  // the function, e.g. "cudaGraphLaunch".
  std::string name;

  bool device() const { return kind != TimelineKind::kApi; }
};

// One step as the host saw it: the tracer's clock read just before the step's first call and just after it
// returned.
struct StepWindow {
  uint64_t begin_ns = 0, end_ns = 0;
};

}  // namespace dsmesh
