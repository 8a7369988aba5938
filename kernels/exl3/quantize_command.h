// `dsmesh quantize` (the table of commands is cli/commands.cc).
#pragma once

#include <string>
#include <vector>

namespace dsmesh {

// Quantizes a checkpoint to an EXL3 pack (or, with --size-only, prints the pack's size).
int RunQuantize(const std::vector<std::string>& args);

}  // namespace dsmesh
