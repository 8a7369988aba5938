// Comparison of secrets (API keys, the mesh token) in time that does not depend on where they differ.
#pragma once

#include <string_view>

namespace dsmesh {

// True when a == b. The time taken depends only on the lengths, never on the contents.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace dsmesh
