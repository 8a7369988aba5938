#include "common/cli_registry.h"

namespace dsmesh {

std::map<std::string, CommandInfo>& CommandRegistry() {
  static auto* registry = new std::map<std::string, CommandInfo>();
  return *registry;
}

}  // namespace dsmesh
