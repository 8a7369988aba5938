// The command table: every usage line names its command, and the dispatches across layers reach the
// layer the flags ask for. Each case gives flags that only the intended layer's command accepts far enough
// to refuse with its own usage error, so no model is loaded and no mesh or connection is started.
#include "cli/commands.h"

#include <gtest/gtest.h>

#include "common/flags.h"

namespace dsmesh {
namespace {

// The UsageError message of running `command args`; fails the test if it does not throw one.
std::string UsageMessage(const std::string& command, const std::vector<std::string>& args) {
  const auto& table = CommandRegistry();
  const auto it = table.find(command);
  if (it == table.end()) {
    ADD_FAILURE() << "no command " << command;
    return "";
  }
  try {
    it->second.run(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << command << ": no usage error";
  return "";
}

TEST(CommandTable, EveryUsageLineStartsWithItsCommand) {
  ASSERT_FALSE(CommandRegistry().empty());
  for (const auto& [name, info] : CommandRegistry()) {
    EXPECT_EQ(info.usage.rfind(name + " ", 0), 0u) << name << ": " << info.usage;
    EXPECT_TRUE(info.run) << name;
  }
}

TEST(CommandTable, ReadmeCommandsAreListed) {
  for (const char* name : {"up", "bench", "logits", "generate", "make-tiny", "ppl", "project-reference",
                           "project-seat", "tokenize", "detokenize", "chat-prompt", "quantize", "exl3-check"})
    EXPECT_EQ(CommandRegistry().count(name), 1u) << name;
}

TEST(CommandTable, LogitsAndGenerateRunInProcessWithoutMeshFlags) {
  // The in-process commands know no --world flag; the mesh variants check its value.
  EXPECT_NE(UsageMessage("logits", {"--tokens", "1", "--out", "/dev/null", "--bogus", "1"}).find("bogus"),
            std::string::npos);
  EXPECT_NE(UsageMessage("logits", {"--world", "0", "--tokens", "1", "--out", "/dev/null"})
                .find("--world must be >= 1"),
            std::string::npos);
  EXPECT_NE(UsageMessage("generate", {"--world", "0", "--tokens", "1"}).find("--world must be >= 1"),
            std::string::npos);
  EXPECT_NE(UsageMessage("generate", {"--tokens", "1", "--max-new-tokens", "-1"}).find("--max-new-tokens"),
            std::string::npos);
}

TEST(CommandTable, ProjectSeatIsProjectReference) {
  for (const char* name : {"project-reference", "project-seat"})
    EXPECT_NE(UsageMessage(name, {"--profile", "/nonexistent/bench.json"}).find("cannot open the file"),
              std::string::npos)
        << name;
}

TEST(CommandTable, BenchPicksItsModeByFlag) {
  // --url: the HTTP benchmark (cli/bench/url_bench.cc) parses it.
  EXPECT_NE(UsageMessage("bench", {"--url"}).find("--url"), std::string::npos);
  EXPECT_NE(UsageMessage("bench", {"--url", "ftp://x"}).find("--url must start with http://"), std::string::npos);
  // --url --clients N: the load run (cli/bench/url_load_bench.cc) checks its counts.
  EXPECT_NE(UsageMessage("bench", {"--url", "http://127.0.0.1:1", "--clients", "0"}).find("--clients must be in"),
            std::string::npos);
  // --scenario: the scenarios (cli/bench/scenario_bench.cc) name the ones they know.
  EXPECT_NE(UsageMessage("bench", {"--scenario", "no-such", "--world", "1"}).find("unknown scenario 'no-such'"),
            std::string::npos);
  // --device without a mesh: the in-process bench (cli/bench/in_process_bench.cc) needs --model.
  EXPECT_NE(UsageMessage("bench", {"--device", "cpu"}).find("--model"), std::string::npos);
  // Flags of two modes: the usage error names both (cli/bench/bench_mode.cc).
  EXPECT_NE(UsageMessage("bench", {"--url", "http://h:1", "--world", "2"}).find("give --url or --world, not both"),
            std::string::npos);
  // Otherwise the mesh's bench, which needs a mesh to measure.
  EXPECT_NE(UsageMessage("bench", {"--device", "cpu", "--world", "0", "--model", "x"}).find("--world must be >= 1"),
            std::string::npos);
  EXPECT_NE(UsageMessage("bench", {}).find("--coordinator HOST:PORT or --world N"), std::string::npos);
}

}  // namespace
}  // namespace dsmesh
