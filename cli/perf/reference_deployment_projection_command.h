// `dsmesh project-reference --profile BENCH.json [--bits experts=2,dense=6]` (also named `project-seat`:
// the project calls the reference deployment "the seat"): every profiled single-row shape of a
// `dsmesh bench --profile --json` file of the full-size V4-Flash, projected onto the reference deployment
// (vLLM + exllamav3 on 8 x RTX PRO 2000 at TP8; cli/perf/reference_deployment_projection.h).
#pragma once

#include <string>
#include <vector>

namespace dsmesh {

// Prints one projection per profiled row. Throws UsageError for a file that cannot be read, is not the
// array `dsmesh bench --json` writes, or has no row with a profile.
int RunProjectReference(const std::vector<std::string>& args);

}  // namespace dsmesh
