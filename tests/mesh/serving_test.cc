// Serving behaviour of a real world-2 mesh: continuous batching of concurrent requests of different
// lengths (each must equal its solo greedy output from the in-process model), prefix caching (hits counted,
// output unchanged), cancellation (KV freed within a step), admission errors, seeded sampling.
#include <thread>

#include <grpcpp/grpcpp.h>

#include "tests/mesh/mesh_fixture.h"

namespace dsmesh::mesh_test {
namespace {

class ServingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    mesh_ = new LocalMesh(MeshOptions(2, {"--max-num-seqs", "4", "--max-num-batched-tokens", "32"}));
    mesh_->Start();
    client_ = new MeshClient(mesh_->coordinator_address());
    client_->WaitReady(std::chrono::seconds(60));
    reference_ = new Reference();
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete client_;
    delete mesh_;
  }
  static LocalMesh* mesh_;
  static MeshClient* client_;
  static Reference* reference_;
};
LocalMesh* ServingTest::mesh_ = nullptr;
MeshClient* ServingTest::client_ = nullptr;
Reference* ServingTest::reference_ = nullptr;

TEST_F(ServingTest, EightConcurrentRequestsEachEqualTheirSoloGreedyOutput) {
  const int n = 8, max_tokens = 6;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(Tokens(5 + 13 * i, 100 + i));  // 5..96 tokens: chunked prefill
  std::vector<GenerateResult> results(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      try {
        MeshClient c(mesh_->coordinator_address());
        results[i] = c.Generate(Greedy(prompts[i], max_tokens, "req" + std::to_string(i)));
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(errors[i], "") << "request " << i;
    EXPECT_EQ(results[i].finish, FINISH_LENGTH) << results[i].error;
    EXPECT_EQ(results[i].tokens, reference_->Greedy(prompts[i], max_tokens)) << "request " << i;
  }
  StatsResponse s = client_->Stats();
  EXPECT_EQ(s.num_requests_running(), 0);
  EXPECT_EQ(s.kv_cache_usage_perc(), 0.0);  // prefix-cache snapshots stay resident but are evictable
}

TEST_F(ServingTest, PrefixCacheHitsAndLeavesOutputUnchanged) {
  const std::vector<int32_t> first = Tokens(300, 7);
  std::vector<int32_t> second = first;  // a follow-up turn: the first prompt plus more tokens
  for (int32_t t : Tokens(9, 8)) second.push_back(t);
  const int64_t hits_before = client_->Stats().prefix_cache_hits();
  GenerateResult a = client_->Generate(Greedy(first, 4));
  GenerateResult b = client_->Generate(Greedy(second, 4));
  GenerateResult a2 = client_->Generate(Greedy(first, 4));
  EXPECT_EQ(a.tokens, reference_->Greedy(first, 4));
  EXPECT_EQ(b.tokens, reference_->Greedy(second, 4));
  EXPECT_EQ(a2.tokens, a.tokens);
  // The snapshot at floor(299/256)*256: the workers' state pool has blocks of 256 tokens.
  EXPECT_EQ(b.cached_prompt_tokens, 256);
  EXPECT_EQ(a2.cached_prompt_tokens, 256);
  EXPECT_GE(client_->Stats().prefix_cache_hits() - hits_before, 512);
}

TEST_F(ServingTest, SeededSamplingIsReproducibleAndLogprobsComeBack) {
  GenerateRequest g = Greedy(Tokens(12, 5), 8);
  g.mutable_sampling()->set_temperature(0.9f);
  g.mutable_sampling()->set_top_p(0.95f);
  g.mutable_sampling()->set_seed(1234);
  g.mutable_sampling()->set_want_logprobs(true);
  g.mutable_sampling()->set_logprobs(3);
  GenerateResult a = client_->Generate(g);
  GenerateResult b = client_->Generate(g);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.logprobs.size(), a.tokens.size());
  EXPECT_EQ(a.logprobs[0].top_size(), 3);
  EXPECT_LE(a.logprobs[0].logprob(), 0.0f);
  g.mutable_sampling()->set_seed(99);
  GenerateResult c = client_->Generate(g);
  EXPECT_NE(c.tokens, a.tokens);  // 8 draws from a random model's flat distribution
}

TEST_F(ServingTest, CancellingTheStreamFreesTheSequenceWithinAStep) {
  grpc::ClientContext ctx;
  GenerateRequest g = Greedy(Tokens(20, 9), 900);
  auto reader = client_->stub().Generate(&ctx, g);
  GenerateResponse resp;
  int tokens = 0;
  while (tokens < 3 && reader->Read(&resp)) tokens += resp.token_ids_size();
  ASSERT_GE(tokens, 3);
  EXPECT_EQ(client_->Stats().num_requests_running(), 1);
  const int64_t cancelled_before = client_->Stats().num_cancelled_requests();
  ctx.TryCancel();
  reader->Finish();
  // "Within a step" is the coordinator's own count: the plans built with the request after its cancel was
  // seen (0: the first plan after the cancel freed it). The client-side wait is only a deadline.
  const auto t0 = std::chrono::steady_clock::now();
  while (client_->Stats().num_requests_running() != 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const StatsResponse s = client_->Stats();
  EXPECT_EQ(s.num_requests_running(), 0);
  EXPECT_EQ(s.num_cancelled_requests(), cancelled_before + 1);
  EXPECT_EQ(s.cancel_free_steps_max(), 0);
}

TEST_F(ServingTest, AdmissionRejectsOverflowAndBadParametersWithClearStatus) {
  grpc::ClientContext ctx;
  auto reader = client_->stub().Generate(&ctx, Greedy(Tokens(1000, 1), 100));
  GenerateResponse resp;
  EXPECT_FALSE(reader->Read(&resp));
  grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("maximum context length is 1024"), std::string::npos) << st.error_message();

  GenerateRequest bad = Greedy(Tokens(4, 1), 4);
  bad.mutable_sampling()->set_top_p(1.5f);
  try {
    client_->Generate(bad);
    FAIL() << "accepted top_p 1.5";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos) << e.what();
  }
  GenerateRequest oov = Greedy({3, 600}, 4);
  EXPECT_THROW(client_->Generate(oov), std::runtime_error);
}

}  // namespace
}  // namespace dsmesh::mesh_test
