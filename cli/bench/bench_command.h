// `dsmesh bench`: one command, its mode chosen from the flags (cli/bench/bench_mode.h) and run by the
// mode's own file in cli/bench/.
#pragma once

#include <string>
#include <vector>

namespace dsmesh {

// Runs the mode ChooseBenchMode(args) names; throws UsageError for conflicting or bad flags.
int RunBench(const std::vector<std::string>& args);

}  // namespace dsmesh
