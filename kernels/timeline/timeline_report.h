// What `dsmesh bench --timeline` prints for the traced steps of one shape (kernels/timeline/step_timeline.h):
// per step on average, the wall time split into device busy and idle, the idle gaps by cause with the part
// of each the device spent waiting for the host, the launches and work per step, and the largest gaps with
// the work on each side.
#pragma once

#include <cstdint>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "kernels/timeline/step_timeline.h"

namespace dsmesh {

// Prints `s` (the steps traced; `untraced_step_ms`, the same shape's timed steps, shows what tracing added;
// `dropped`, the records CUPTI dropped) and returns the same as JSON, per-step figures in ms. One line and
// {} when no step was traced.
nlohmann::json PrintStepTimeline(const StepTimelineSummary& s, double untraced_step_ms, uint64_t dropped = 0,
                                 std::FILE* out = stdout);

}  // namespace dsmesh
