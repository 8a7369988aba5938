// The parts of `dsmesh bench --profile` that say where a decode step's time goes by bytes and by chain:
// each op's bytes beside its device time (achieved GB/s, % of the device's peak), and the step's CUDA
// graphs (nodes, dependent nodes, per layer) replayed as recorded and with empty kernels, so that the
// bytes a step moves and its chain of dependent launches are two measured numbers.
#pragma once

#include <cstdio>
#include <functional>

#include <nlohmann/json.hpp>

#include "kernels/backend.h"

namespace dsmesh {

// Per op of `device_only` (the profile whose ops ran isolated, OpProfiling::kDeviceOnly): calls and bytes
// per step, bytes per call, device us per call, achieved GB/s and % of the profile's peak, largest time
// first (at most `rows` rows, then the rest summed); then all ops together. Returns the same as JSON
// (every op). Prints nothing and returns {} when the profile has no ops.
nlohmann::json PrintOpBytes(const OpProfile& device_only, std::FILE* out = stdout, int rows = 40);

// Runs `step` (one decode step) with graph tracing on until a step replays only recorded graphs (no
// capture, no eager segment; at most `attempts` steps: a key seen for the first time runs eagerly, then
// is captured), then takes that step's graphs, timed over `replays` replays.
StepGraphProfile TraceDecodeGraphs(Backend& backend, const std::function<void()>& step, int replays, int attempts = 4);

// The step's graphs: nodes by kind, dependent nodes (the graphs' longest chains summed), per layer, and
// the replay times beside `step_ms` (the step as the bench timed it). Returns the same as JSON; {} (and
// one line saying so) when the step replayed no graph.
nlohmann::json PrintStepGraphs(const StepGraphProfile& graphs, double step_ms, std::FILE* out = stdout);

}  // namespace dsmesh
