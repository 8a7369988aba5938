// `dsmesh`: one CLI; the commands are the table in cli/commands.cc.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/flags.h"

namespace {

void PrintUsage() {
  std::fprintf(stderr, "usage: dsmesh COMMAND [FLAGS]\n\ncommands:\n");
  size_t width = 0;  // the longest name: usages start in one column
  for (const auto& entry : dsmesh::CommandRegistry()) width = std::max(width, entry.first.size());
  for (const auto& [name, info] : dsmesh::CommandRegistry()) {
    // A usage of several lines (bench's modes) continues under its first line.
    std::string usage = info.usage;
    for (size_t at = usage.find('\n'); at != std::string::npos; at = usage.find('\n', at + 1))
      usage.insert(at + 1, std::string(width + 3, ' '));
    std::fprintf(stderr, "  %-*s %s\n", static_cast<int>(width), name.c_str(), usage.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "help" || std::string(argv[1]) == "--help") {
    PrintUsage();
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const auto& registry = dsmesh::CommandRegistry();
  auto it = registry.find(command);
  if (it == registry.end()) {
    std::fprintf(stderr, "dsmesh: unknown command '%s'\n", command.c_str());
    PrintUsage();
    return 2;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    return it->second.run(args);
  } catch (const dsmesh::UsageError& e) {
    std::fprintf(stderr, "dsmesh %s: %s\nusage: dsmesh %s\n", command.c_str(), e.what(), it->second.usage.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsmesh %s: error: %s\n", command.c_str(), e.what());
    return 1;
  }
}
