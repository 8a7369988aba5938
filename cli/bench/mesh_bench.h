// `dsmesh bench --coordinator HOST:PORT | --world N`: the mesh's per-step time split.
#pragma once

#include <string>
#include <vector>

namespace dsmesh {

// Per-step time split at each --streams count; with --speculative-config speculation on and off side by side.
int RunMeshBench(const std::vector<std::string>& args);

}  // namespace dsmesh
