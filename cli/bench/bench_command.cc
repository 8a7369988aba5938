#include "cli/bench/bench_command.h"

#include "cli/bench/bench_mode.h"
#include "cli/bench/in_process_bench.h"
#include "cli/bench/mesh_bench.h"
#include "cli/bench/scenario_bench.h"
#include "cli/bench/url_bench.h"

namespace dsmesh {

int RunBench(const std::vector<std::string>& args) {
  switch (ChooseBenchMode(args)) {
    case BenchMode::kHttp: return RunUrlBench(args);
    case BenchMode::kHttpLoad: return RunUrlLoadBench(args);
    case BenchMode::kScenario: return RunScenarioBench(args);
    case BenchMode::kInProcess: return RunInProcessBench(args);
    case BenchMode::kMesh: return RunMeshBench(args);
  }
  return 2;  // not reached: every mode is a case above
}

}  // namespace dsmesh
