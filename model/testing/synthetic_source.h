// The `synthetic:NAME[:seed=S,experts=K,dense=K,layer.N=K,mtp=K]` model source (model/testing/synthetic.h builds
// its weights): parsing only, so that processes that never build weights (the coordinator, the mesh
// commands) can recognise and check it without the model library.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/exl3/quant_plan.h"

namespace dsmesh {

struct SyntheticSpec {
  std::string base;     // "v4-flash" or a directory with config.json
  uint64_t seed = 0;
  Exl3BitsSpec bits;    // experts / dense / per-layer bits
};

constexpr const char* kSyntheticPrefix = "synthetic:";
inline bool IsSyntheticSource(const std::string& source) { return source.rfind(kSyntheticPrefix, 0) == 0; }

// Throws std::invalid_argument naming the bad item.
SyntheticSpec ParseSyntheticSource(const std::string& source);

}  // namespace dsmesh
