// Speculative decoding through the real coordinator and workers: with
// --speculative-config '{"method":"mtp","num_speculative_tokens":3}' greedy output is token-identical to
// speculation off (the in-process oracle), at world 1 and 2, for 4 concurrent streams of different prompt
// lengths over 200+ tokens, with every draft proposed and with the adaptive draft policy, over the whole
// vocabulary and over a draft vocabulary (draft_vocab_size: the drafts' head keeps ids < 256 of 512);
// stop ids and max_tokens end the output at the right token; the spec counters move.
#include <thread>

#include "tests/mesh/mesh_fixture.h"

namespace dsmesh::mesh_test {
namespace {

// `policy` fixed: every step verifies 3 drafts (the rollback path all the way); adaptive: the draft policy
// (coordinator/draft_policy.h) proposes fewer, on this CPU mostly none, and the output must not change.
constexpr char kWholeVocabulary[] = "{\"method\":\"mtp\",\"num_speculative_tokens\":3}";
constexpr char kDraftVocabulary[] = "{\"method\":\"mtp\",\"num_speculative_tokens\":3,\"draft_vocab_size\":256}";

void RunStreams(int world, const std::string& policy = "fixed", const std::string& spec = kWholeVocabulary) {
  LocalMesh mesh(MeshOptions(world, {"--max-num-seqs", "4", "--speculative-config", spec, "--draft-policy", policy}));
  mesh.Start();
  MeshClient client(mesh.coordinator_address());
  client.WaitReady(std::chrono::seconds(60));
  Reference reference;
  const int n = 4, max_tokens = 210;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(Tokens(3 + 29 * i, 500 + i));  // 3, 32, 61, 90 tokens
  std::vector<GenerateResult> results(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      try {
        MeshClient c(mesh.coordinator_address());
        results[i] = c.Generate(Greedy(prompts[i], max_tokens, "spec" + std::to_string(i)));
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(errors[i], "") << "request " << i;
    EXPECT_EQ(results[i].finish, FINISH_LENGTH) << results[i].error;
    EXPECT_EQ(results[i].tokens, reference.Greedy(prompts[i], max_tokens)) << "world " << world << " request " << i;
  }
  // A stop id inside the output: the output ends at its first occurrence, whatever rode after it.
  const auto want = reference.Greedy(prompts[1], 40);
  GenerateRequest g = Greedy(prompts[1], 40, "stop");
  g.mutable_sampling()->add_stop_token_ids(want[17]);
  GenerateResult stopped = client.Generate(g);
  const size_t first = std::find(want.begin(), want.end(), want[17]) - want.begin();
  EXPECT_EQ(stopped.finish, FINISH_STOP);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(want.begin(), want.begin() + first + 1));
  GenerateResult shortreq = client.Generate(Greedy(prompts[2], 5, "short"));
  EXPECT_EQ(shortreq.tokens, reference.Greedy(prompts[2], 5));

  StatsResponse s = client.Stats();
  int64_t decisions = 0;
  for (const auto& [kind, n] : s.spec_decode_draft_decisions()) decisions += n;
  EXPECT_GT(decisions, 200);  // one per sampled step of every speculating sequence
  if (policy == "adaptive") {
    EXPECT_GT(s.spec_decode_draft_decisions().at("off"), 0);
    EXPECT_EQ(s.num_requests_running(), 0);
    return;
  }
  EXPECT_EQ(s.spec_decode_draft_decisions().at("full"), decisions);
  EXPECT_GT(s.spec_decode_num_drafts(), 100);
  EXPECT_LE(s.spec_decode_num_draft_tokens(), 3 * s.spec_decode_num_drafts());  // fewer where max_tokens clips
  EXPECT_GT(s.spec_decode_num_draft_tokens(), 3 * s.spec_decode_num_drafts() - 3 * 6);
  EXPECT_EQ(s.spec_decode_num_accepted_tokens_per_pos_size(), 3);
  int64_t per_pos = 0;
  for (int64_t v : s.spec_decode_num_accepted_tokens_per_pos()) per_pos += v;
  EXPECT_EQ(per_pos, s.spec_decode_num_accepted_tokens());
  // Every verified draft came from a step that ran draft passes (at most 4 sequences share one).
  EXPECT_GE(s.spec_decode_draft_passes(), s.spec_decode_num_drafts() / 4);
  EXPECT_GT(s.spec_decode_draft_seconds_sum(), 0.0);
  EXPECT_EQ(s.num_requests_running(), 0);
  EXPECT_EQ(s.kv_cache_usage_perc(), 0.0);
}

TEST(MeshSpeculation, GreedyOnEqualsOffAtWorld1) { RunStreams(1); }
TEST(MeshSpeculation, GreedyOnEqualsOffAtWorld2) { RunStreams(2); }
TEST(MeshSpeculation, GreedyOnEqualsOffWithTheAdaptiveDraftPolicy) { RunStreams(1, "adaptive"); }
TEST(MeshSpeculation, GreedyOnEqualsOffWithADraftVocabularyAtWorld1) { RunStreams(1, "fixed", kDraftVocabulary); }
TEST(MeshSpeculation, GreedyOnEqualsOffWithADraftVocabularyAtWorld2) { RunStreams(2, "fixed", kDraftVocabulary); }

}  // namespace
}  // namespace dsmesh::mesh_test
