// Subcommands of the `dsmesh` CLI register themselves here, so each lives beside the code it drives
// (e.g. kernels/exl3/exl3_check_command.cc) and cli/main.cc stays a dispatcher.
//
//   static int RunTokenize(const std::vector<std::string>& args);
//   DSMESH_REGISTER_COMMAND(tokenize, "tokenize --tokenizer DIR --text-file F", RunTokenize);
//
// The library holding a registration needs `alwayslink = 1` and must be a dep of //cli:dsmesh.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace dsmesh {

using CommandFn = std::function<int(const std::vector<std::string>& args)>;

struct CommandInfo {
  std::string usage;
  CommandFn run;
};

std::map<std::string, CommandInfo>& CommandRegistry();

struct CommandRegistration {
  CommandRegistration(const std::string& name, const std::string& usage, CommandFn fn) {
    CommandRegistry()[name] = CommandInfo{usage, std::move(fn)};
  }
};

}  // namespace dsmesh

#define DSMESH_REGISTER_COMMAND(name, usage, fn) \
  static ::dsmesh::CommandRegistration dsmesh_command_##name(#name, usage, fn)
