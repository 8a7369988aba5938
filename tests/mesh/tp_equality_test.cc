// Real processes (a coordinator and N CPU workers over gRPC + Gloo) at world 1, 2 and 4: the logits of a
// prompt (prefill, long enough to cross the sliding window, CSA and HCA compression boundaries) and of the
// greedy decode steps after it agree across world sizes within relative 1e-5, and world 1 agrees with the
// model run in this process.
#include "tests/mesh/mesh_fixture.h"

namespace dsmesh::mesh_test {
namespace {

struct MeshRun {
  std::vector<int32_t> tokens;
  std::vector<LogitsRow> logits;
};

MeshRun RunAtWorld(int world, const std::vector<int32_t>& prompt, int decode) {
  LocalMesh mesh(MeshOptions(world, {"--max-batched-tokens", "64"}));
  mesh.Start();
  MeshClient client(mesh.coordinator_address());
  client.WaitReady(std::chrono::seconds(60));
  GenerateRequest req = Greedy(prompt, decode);
  req.set_return_logits(true);
  GenerateResult r = client.Generate(req);
  EXPECT_EQ(r.finish, FINISH_LENGTH) << r.error;
  StatsResponse s = client.Stats();
  EXPECT_EQ(s.world(), world);
  EXPECT_GT(s.kv_cache_tokens(), 0);
  return {r.tokens, r.logits};
}

TEST(MeshTensorParallel, LogitsAgreeAtWorld1_2_4) {
  const std::vector<int32_t> prompt = Tokens(150, 3);
  const int decode = 4;
  MeshRun one = RunAtWorld(1, prompt, decode);
  // prompt positions + the decode steps (the last sampled token is never fed)
  ASSERT_EQ(one.logits.size(), prompt.size() + decode - 1);
  for (size_t i = 0; i < one.logits.size(); ++i) ASSERT_EQ(one.logits[i].position(), static_cast<int>(i));

  // World 1 through the mesh equals the model in-process.
  {
    auto model = LoadModel(TinyModelDir(), ShardSpec{0, 1}, MakeCpuBackend(1));
    auto state = model->NewState();
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), one.tokens.begin(), one.tokens.end() - 1);
    auto out = model->Forward({{state.get(), all, true}});
    const float* p = out[0].logits.as<float>();
    for (size_t i = 0; i < all.size(); ++i) {
      LogitsRow ref;
      ref.mutable_values()->Add(p + i * 512, p + (i + 1) * 512);
      ASSERT_LE(RelDiff(one.logits[i], ref), 1e-5) << "position " << i;
    }
  }
  for (int world : {2, 4}) {
    MeshRun other = RunAtWorld(world, prompt, decode);
    EXPECT_EQ(other.tokens, one.tokens) << "world " << world;
    ASSERT_EQ(other.logits.size(), one.logits.size());
    double worst = 0;
    for (size_t i = 0; i < one.logits.size(); ++i) worst = std::max(worst, RelDiff(other.logits[i], one.logits[i]));
    EXPECT_LE(worst, 1e-5) << "world " << world;
    std::printf("world %d vs world 1: max relative logits difference %.3g over %zu positions\n", world, worst,
                one.logits.size());
  }
}

}  // namespace
}  // namespace dsmesh::mesh_test
