// `dsmesh bench`'s mode from its flags, and the usage errors that name two flags asking for different modes.
#include "cli/bench/bench_mode.h"

#include <gtest/gtest.h>

#include "common/flags.h"

namespace dsmesh {
namespace {

std::string UsageMessage(const std::vector<std::string>& args) {
  try {
    ChooseBenchMode(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no usage error";
  return "";
}

TEST(BenchMode, EachModeFromItsFlags) {
  EXPECT_EQ(ChooseBenchMode({"--url", "http://h:1"}), BenchMode::kHttp);
  EXPECT_EQ(ChooseBenchMode({"--url=http://h:1", "--streams", "1"}), BenchMode::kHttp);
  EXPECT_EQ(ChooseBenchMode({"--url", "http://h:1", "--clients", "64"}), BenchMode::kHttpLoad);
  EXPECT_EQ(ChooseBenchMode({"--scenario", "long-prompt-plus-chat"}), BenchMode::kScenario);
  EXPECT_EQ(ChooseBenchMode({"--scenario", "x", "--world", "2", "--device", "cpu"}), BenchMode::kScenario);
  EXPECT_EQ(ChooseBenchMode({"--device", "cpu", "--model", "m"}), BenchMode::kInProcess);
  EXPECT_EQ(ChooseBenchMode({"--device=cuda:1", "--model", "m"}), BenchMode::kInProcess);
  EXPECT_EQ(ChooseBenchMode({"--device", "cpu", "--world", "2"}), BenchMode::kMesh);
  EXPECT_EQ(ChooseBenchMode({"--coordinator", "h:1", "--device", "cpu"}), BenchMode::kMesh);
  EXPECT_EQ(ChooseBenchMode({"--world", "1"}), BenchMode::kMesh);
  // No mode flag: the mesh's bench, which then asks for --world or --coordinator.
  EXPECT_EQ(ChooseBenchMode({}), BenchMode::kMesh);
  // A flag whose name starts like a mode's is not that flag.
  EXPECT_EQ(ChooseBenchMode({"--world", "1", "--urlish", "x"}), BenchMode::kMesh);
}

TEST(BenchMode, ConflictingFlagsAreNamed) {
  for (const char* other : {"--scenario", "--world", "--coordinator", "--device"}) {
    const std::string m = UsageMessage({"--url", "http://h:1", other, "x"});
    EXPECT_NE(m.find("give --url or " + std::string(other) + ", not both"), std::string::npos) << m;
  }
  EXPECT_NE(UsageMessage({"--scenario", "s", "--coordinator", "h:1"}).find("give --scenario or --coordinator"),
            std::string::npos);
  EXPECT_NE(UsageMessage({"--world", "1", "--coordinator", "h:1"}).find("give --world or --coordinator"),
            std::string::npos);
  EXPECT_NE(UsageMessage({"--world", "1", "--clients", "8"}).find("--clients is the HTTP load run's"),
            std::string::npos);
}

}  // namespace
}  // namespace dsmesh
