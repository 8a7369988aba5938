// The scheduler against the rules it must keep: FCFS admission under max-num-seqs, chunked prefill under
// the token budget, preemption instead of dropping, prefix-cache hits, cancellation freeing blocks.
// Worker results are played by the test (the token rank 0 would have sampled).
#include "coordinator/scheduler.h"

#include <gtest/gtest.h>

namespace dsmesh {
namespace {

KvGeometry Geometry(int64_t blocks, int block_size = 4, int64_t fixed_blocks = 1) {
  KvGeometry g;
  g.block_size = block_size;
  g.num_blocks = blocks;
  g.fixed_blocks = fixed_blocks;
  g.bytes_per_block = 64;
  return g;
}

SchedulerConfig Config(int seqs, int budget, bool caching = true) {
  SchedulerConfig c;
  c.max_num_seqs = seqs;
  c.max_batched_tokens = budget;
  c.max_model_len = 1000;
  c.prefix_caching = caching;
  c.vocab_size = 100;
  c.eos_token_id = 99;
  return c;
}

std::shared_ptr<Request> Req(std::vector<int32_t> prompt, int max_tokens) {
  auto r = std::make_shared<Request>();
  r->request_id = "r" + std::to_string(prompt.size());
  r->tokens = prompt;
  r->prompt_len = static_cast<int32_t>(prompt.size());
  r->max_tokens = max_tokens;
  return r;
}

// Plays rank 0: every sampled sequence gets token 7.
StepResult Result(const StepPlan& plan, int32_t token = 7) {
  StepResult res;
  for (const auto& sp : plan.seqs()) {
    auto* s = res.add_seqs();
    s->set_seq_id(sp.seq_id());
    s->set_token_id(sp.sample() ? token : -1);
  }
  return res;
}

std::vector<GenerateResponse> Drain(Request& r) {
  std::vector<GenerateResponse> out;
  GenerateResponse g;
  while (r.out->Pop(&g, std::chrono::milliseconds(0))) out.push_back(g);
  return out;
}

TEST(KvGeometry, CapacityFromTheTightestRank) {
  KvGeometry g = PlanKvGeometry({{1 << 20, 256, 4096}, {1 << 19, 256, 4096}}, 16);
  EXPECT_EQ(g.num_blocks, (1 << 19) / (256 * 16));
  EXPECT_EQ(g.fixed_blocks, 1);
  EXPECT_EQ(g.pool_tokens(), g.num_blocks * 16);
  EXPECT_THROW(PlanKvGeometry({{100, 256, 4096}}, 16), std::runtime_error);
}

TEST(Scheduler, ChunkedPrefillUnderBudgetThenDecode) {
  Scheduler s(Config(4, 8, false), Geometry(100));
  auto r = Req(std::vector<int32_t>(20, 3), 2);
  s.Add(r);
  std::vector<int> chunks;
  for (int step = 0; step < 10 && s.HasWork(); ++step) {
    StepPlan p = s.Schedule();
    if (p.seqs_size()) chunks.push_back(p.seqs(0).tokens_size());
    s.Apply(p, Result(p));
  }
  EXPECT_EQ(chunks, (std::vector<int>{8, 8, 4, 1}));  // 20 prompt tokens, then one decode step
  auto out = Drain(*r);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out.back().finish_reason(), FINISH_LENGTH);
  EXPECT_EQ(out.back().completion_tokens(), 2);
}

TEST(Scheduler, FcfsUpToMaxNumSeqsAndDecodeMixedWithPrefill) {
  Scheduler s(Config(2, 16, false), Geometry(100));
  auto a = Req({1, 2, 3}, 5), b = Req({4, 5, 6, 7}, 5), c = Req({8}, 5);
  s.Add(a);
  s.Add(b);
  s.Add(c);
  StepPlan p = s.Schedule();
  ASSERT_EQ(p.seqs_size(), 2);  // c waits for a slot
  EXPECT_EQ(s.num_waiting(), 1u);
  s.Apply(p, Result(p));
  p = s.Schedule();
  ASSERT_EQ(p.seqs_size(), 2);
  EXPECT_EQ(p.seqs(0).tokens_size(), 1);  // decode
  EXPECT_EQ(p.seqs(1).tokens_size(), 1);
}

TEST(Scheduler, PreemptsNewestWhenBlocksRunOutAndRecomputesIt) {
  // 6 blocks of 4 tokens, 1 fixed block per sequence: two sequences of 8 tokens fill the pool.
  Scheduler s(Config(2, 64, false), Geometry(6));
  auto a = Req(std::vector<int32_t>(8, 1), 6), b = Req(std::vector<int32_t>(8, 2), 6);
  s.Add(a);
  s.Add(b);
  int64_t preempted_at = -1;
  for (int step = 0; step < 40 && s.HasWork(); ++step) {
    StepPlan p = s.Schedule();
    if (s.num_preemptions() > 0 && preempted_at < 0) preempted_at = step;
    s.Apply(p, Result(p));
  }
  EXPECT_GT(s.num_preemptions(), 0);
  auto out_a = Drain(*a), out_b = Drain(*b);
  ASSERT_FALSE(out_a.empty());
  ASSERT_FALSE(out_b.empty());
  EXPECT_EQ(out_a.back().finish_reason(), FINISH_LENGTH);
  EXPECT_EQ(out_b.back().finish_reason(), FINISH_LENGTH);  // finished after recompute, not dropped
  EXPECT_EQ(out_b.back().completion_tokens(), 6);
  EXPECT_EQ(s.kv_usage(), 0.0);
}

TEST(Scheduler, PrefixCacheRestoresASnapshotAtABlockBoundary) {
  Scheduler s(Config(4, 64, true), Geometry(100));
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  auto a = Req(prompt, 1);
  s.Add(a);
  StepPlan p = s.Schedule();
  ASSERT_EQ(p.seqs_size(), 1);
  EXPECT_EQ(p.seqs(0).tokens_size(), 8);  // cut at the snapshot boundary floor(9/4)*4
  EXPECT_NE(p.seqs(0).snapshot_after(), 0u);
  const uint64_t snap = p.seqs(0).snapshot_after();
  s.Apply(p, Result(p));
  while (s.HasWork()) {
    p = s.Schedule();
    s.Apply(p, Result(p));
  }
  auto b = Req(prompt, 1);
  s.Add(b);
  p = s.Schedule();
  ASSERT_EQ(p.seqs_size(), 1);
  EXPECT_EQ(p.seqs(0).restore_snapshot(), snap);
  EXPECT_EQ(p.seqs(0).start_pos(), 8);
  EXPECT_EQ(p.seqs(0).tokens_size(), 2);
  EXPECT_EQ(s.prefix_cache().hits, 8);
  EXPECT_EQ(s.prefix_cache().queries, 20);
}

TEST(Scheduler, CancelledRequestIsFreedInTheNextPlan) {
  Scheduler s(Config(4, 64, false), Geometry(100));
  auto a = Req({1, 2, 3}, 100);
  s.Add(a);
  StepPlan p = s.Schedule();
  const uint64_t id = p.seqs(0).seq_id();
  s.Apply(p, Result(p));
  a->cancelled = true;
  p = s.Schedule();
  EXPECT_EQ(p.seqs_size(), 0);
  ASSERT_EQ(p.free_seqs_size(), 1);
  EXPECT_EQ(p.free_seqs(0), id);
  EXPECT_EQ(s.kv_usage(), 0.0);
  EXPECT_EQ(Drain(*a).back().finish_reason(), FINISH_ABORT);
}

TEST(Scheduler, ValidateRejectsOverflowAndBadTokens) {
  Scheduler s(Config(4, 64, false), Geometry(100));
  GenerateRequest g;
  for (int i = 0; i < 999; ++i) g.add_prompt_token_ids(1);
  g.mutable_sampling()->set_max_tokens(10);
  EXPECT_THROW(s.Validate(g), std::invalid_argument);
  GenerateRequest bad;
  bad.add_prompt_token_ids(100);
  EXPECT_THROW(s.Validate(bad), std::invalid_argument);
  GenerateRequest empty;
  EXPECT_THROW(s.Validate(empty), std::invalid_argument);
}

TEST(Scheduler, StopsOnEosAndFailAllAbortsEveryone) {
  Scheduler s(Config(1, 64, false), Geometry(100));
  auto a = Req({1, 2}, 10), b = Req({3}, 10);
  s.Add(a);
  s.Add(b);
  StepPlan p = s.Schedule();
  s.Apply(p, Result(p, 99));
  EXPECT_EQ(Drain(*a).back().finish_reason(), FINISH_STOP);
  p = s.Schedule();
  s.Apply(p, Result(p));
  s.FailAll("worker rank 1 lost");
  auto out = Drain(*b);
  EXPECT_EQ(out.back().finish_reason(), FINISH_ABORT);
  EXPECT_EQ(out.back().error(), "worker rank 1 lost");
  EXPECT_FALSE(s.HasWork());
}

}  // namespace
}  // namespace dsmesh
