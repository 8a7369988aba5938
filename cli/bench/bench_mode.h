// Which benchmark `dsmesh bench` runs, read from which flags are given (their values are the mode's to
// check). The one place that names the modes; cli/bench/bench_command.cc runs the chosen one.
#pragma once

#include <string>
#include <vector>

namespace dsmesh {

enum class BenchMode {
  kHttp,       // --url: the reference deployment's serving benchmark against an OpenAI endpoint (url_bench.cc)
  kHttpLoad,   // --url --clients N: N concurrent streaming clients, latency percentiles (url_load_bench.cc)
  kScenario,   // --scenario NAME: scheduling scenarios on local meshes it starts (scenario_bench.cc)
  kInProcess,  // --device without --world/--coordinator: decode steps in this process (in_process_bench.cc)
  kMesh,       // otherwise (--world N or --coordinator HOST:PORT): the mesh's per-step split (mesh_bench.cc)
};

// The mode `args` (the flags after `bench`) ask for. Throws UsageError naming both flags when two flags
// ask for different modes (--url with --world, --scenario with --coordinator, ...) and naming the flag
// when a mode's own flag comes without it (--clients without --url).
BenchMode ChooseBenchMode(const std::vector<std::string>& args);

}  // namespace dsmesh
