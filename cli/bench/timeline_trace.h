// `dsmesh bench --timeline`: a few decode steps run under a CUPTI timeline (kernels/cuda/cupti_timeline.h),
// each step marked on CUPTI's clock as the host begins and ends it, then analyzed and printed
// (kernels/timeline/timeline_report.h).
#pragma once

#include <cstdio>
#include <functional>

#include <nlohmann/json.hpp>

#include "kernels/backend.h"

namespace dsmesh {

// Runs `step` (one decode step) once traced but outside every window (the first traced step pays CUPTI's
// own set-up), then `steps` times marked, and prints the analysis beside `untraced_step_ms`; returns it
// as JSON. On a backend without a CUDA device it runs nothing, says the timeline needs one and returns {};
// when CUPTI cannot trace it says why and returns {"error": why}. Errors of the steps themselves propagate.
nlohmann::json TraceStepTimeline(Backend& backend, const std::function<void()>& step, int steps,
                                 double untraced_step_ms, std::FILE* out = stdout);

}  // namespace dsmesh
