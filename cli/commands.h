// The table of `dsmesh` commands: every command's name, usage line and function, listed in
// cli/commands.cc. Only cli/main.cc reads it; a command that needs another calls it through its header.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace dsmesh {

using CommandFn = std::function<int(const std::vector<std::string>& args)>;

struct CommandInfo {
  std::string usage;  // the flags after `dsmesh`, starting with the command's name
  CommandFn run;      // exit status; throws UsageError (common/flags.h) for bad flags
};

// Name -> command (`dsmesh help` lists them in this order, by name).
const std::map<std::string, CommandInfo>& CommandRegistry();

}  // namespace dsmesh
