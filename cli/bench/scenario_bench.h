// `dsmesh bench --scenario NAME`: scheduling scenarios, each on local meshes it starts itself.
#pragma once

#include <string>
#include <vector>

namespace dsmesh {

// long-prompt-plus-chat: a long prompt plus a chat every second, fair scheduling on vs off side by side.
int RunScenarioBench(const std::vector<std::string>& args);

}  // namespace dsmesh
