// Steps on both of their paths in one mesh: rank 0 gets its plans and returns its results over its local
// step channel (common/mesh/step_channel.h), rank 1, restarted with DSMESH_STEP_CHANNEL=off, over its
// session stream. The mesh generates the single-rank reference's tokens either way, and the coordinator
// says which path each formation uses.
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <thread>

#include "tests/mesh/mesh_fixture.h"

namespace dsmesh::mesh_test {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

TEST(StepPath, ChannelAndStreamRanksInOneMesh) {
  LocalMeshOptions o = MeshOptions(2);
  o.log_dir = TempDir("step_path_logs");
  LocalMesh mesh(o);
  mesh.Start();
  MeshClient client(mesh.coordinator_address());
  client.WaitReady(std::chrono::seconds(60));
  Reference reference;
  const auto prompt = Tokens(20, 3);
  EXPECT_EQ(client.Generate(Greedy(prompt, 6)).tokens, reference.Greedy(prompt, 6));

  mesh.KillWorker(1, SIGKILL);
  setenv("DSMESH_STEP_CHANNEL", "off", 1);  // inherited by the restarted worker only
  mesh.StartWorker(1);
  unsetenv("DSMESH_STEP_CHANNEL");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    const StatsResponse s = client.Stats();
    if (s.ready() && s.mesh_epoch() >= 2) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the mesh did not re-form: " << s.not_ready_reason();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto prompt2 = Tokens(25, 4);
  EXPECT_EQ(client.Generate(Greedy(prompt2, 8)).tokens, reference.Greedy(prompt2, 8));

  const std::string log = ReadFile(mesh.log_path("coordinator"));
  EXPECT_NE(log.find("2 of 2 ranks run their steps over a local step channel"), std::string::npos) << log;
  EXPECT_NE(log.find("1 of 2 ranks run their steps over a local step channel"), std::string::npos) << log;
}

}  // namespace
}  // namespace dsmesh::mesh_test
