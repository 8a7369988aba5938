// `dsmesh exl3-check --vectors FILE.safetensors` (the table of commands is cli/commands.cc).
#pragma once

#include <string>
#include <vector>

namespace dsmesh {

// Checks this library against exllamav3's test vectors; 1 when any group mismatches.
int RunExl3Check(const std::vector<std::string>& args);

}  // namespace dsmesh
