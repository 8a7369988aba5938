// The scheduler against the rules it must keep: FCFS admission under max-num-seqs, chunked prefill under
// the token budget, the fair order (decodes, first chunks, continuing prefills; long prefills capped while
// others run or wait), priorities, preemption of the worst-ranked instead of dropping, refusal of requests
// that could never fit, prefix-cache hits, cancellation freeing blocks. Steps are counted, not timed.
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

SchedulerConfig Config(int seqs, int budget, bool caching = true, int threshold = 0,
                       SchedulingPolicy policy = SchedulingPolicy::kFcfs) {
  SchedulerConfig c;
  c.long_prefill_token_threshold = threshold;
  c.policy = policy;
  c.max_num_seqs = seqs;
  c.max_batched_tokens = budget;
  c.max_model_len = 1000;
  c.prefix_caching = caching;
  c.vocab_size = 100;
  c.eos_token_id = 99;
  return c;
}

std::shared_ptr<Request> Req(std::vector<int32_t> prompt, int max_tokens, int priority = 0) {
  auto r = std::make_shared<Request>();
  r->request_id = "r" + std::to_string(prompt.size());
  r->priority = priority;
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

TEST(KvGeometry, WorkersStatePoolsDecideBlocksAndSlots) {
  RankKvCapacity a{1 << 20, 256, 4096, /*pool_blocks=*/40, /*block_tokens=*/256, /*state_slots=*/12, 65536};
  RankKvCapacity b = a;
  b.pool_blocks = 30;
  KvGeometry g = PlanKvGeometry({a, b}, 16);
  EXPECT_EQ(g.block_size, 256);  // the workers', not the flag's
  EXPECT_EQ(g.num_blocks, 30);
  EXPECT_EQ(g.num_slots, 12);
  EXPECT_EQ(g.fixed_blocks, 0);
  EXPECT_EQ(g.pool_tokens(), 30 * 256);
  b.block_tokens = 512;
  EXPECT_THROW(PlanKvGeometry({a, b}, 16), std::runtime_error);
}

TEST(Scheduler, SnapshotsAndRestoredSequencesShareBlocksAndTakeSlots) {
  // Blocks of 4 tokens, 3 state slots, no fixed blocks: the workers' state pool.
  KvGeometry g = Geometry(20, 4, 0);
  g.num_slots = 3;
  Scheduler s(Config(2, 64, true), g);
  std::vector<int32_t> prefix = {1, 2, 3, 4, 5, 6, 7, 8};
  auto with = [&](int32_t t) {
    auto p = prefix;
    p.push_back(t);
    return p;
  };
  auto a = Req(with(9), 1);
  s.Add(a);
  StepPlan p = s.Schedule();  // a's first 8 tokens, then a snapshot of them
  ASSERT_EQ(p.seqs_size(), 1);
  const SequencePlan first = p.seqs(0);  // a copy: p is reused below
  ASSERT_NE(first.snapshot_after(), 0u);
  ASSERT_EQ(first.block_table_size(), 2);
  ASSERT_EQ(first.snapshot_blocks_size(), 2);
  EXPECT_EQ(first.snapshot_blocks(0), first.block_table(0));  // shared, not copied
  EXPECT_EQ(first.snapshot_blocks(1), first.block_table(1));
  EXPECT_NE(first.snapshot_slot(), first.state_slot());
  s.Apply(p, Result(p));
  while (s.HasWork()) {
    p = s.Schedule();
    s.Apply(p, Result(p));
  }
  auto b = Req(with(10), 1);
  s.Add(b);
  p = s.Schedule();
  ASSERT_EQ(p.seqs_size(), 1);
  EXPECT_EQ(p.seqs(0).restore_snapshot(), first.snapshot_after());
  ASSERT_GE(p.seqs(0).block_table_size(), 3);
  EXPECT_EQ(p.seqs(0).block_table(0), first.block_table(0));  // the snapshot's blocks head b's table
  EXPECT_EQ(p.seqs(0).block_table(1), first.block_table(1));
  EXPECT_NE(p.seqs(0).state_slot(), first.snapshot_slot());
  s.Apply(p, Result(p));
  while (s.HasWork()) {
    p = s.Schedule();
    s.Apply(p, Result(p));
  }
  EXPECT_EQ(Drain(*b).back().finish_reason(), FINISH_LENGTH);
  EXPECT_EQ(s.kv_usage(), 0.0);  // only the snapshot holds blocks now
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

// An image block (docs/vision.md) is prefilled in one step: a chunk that would end inside it ends before
// it, the block's chunk covers it whole (past the budget when it must), its PromptImage rides with that
// chunk only.
TEST(Scheduler, ImageBlocksArePrefilledWholeInOneChunk) {
  Scheduler s(Config(4, 8, false), Geometry(100));
  auto r = Req(std::vector<int32_t>(30, 3), 2);
  PromptImage im;
  im.set_begin(5);
  im.set_length(8);  // positions 5 .. 12: the first chunk (8 tokens) would end inside it
  r->images.push_back(im);
  PromptImage late;
  late.set_begin(14);
  late.set_length(8);  // 14 .. 21
  r->images.push_back(late);
  s.Add(r);
  std::vector<std::pair<int, int>> chunks;  // (tokens, images)
  for (int step = 0; step < 12 && s.HasWork(); ++step) {
    StepPlan p = s.Schedule();
    if (p.seqs_size()) chunks.push_back({p.seqs(0).tokens_size(), p.seqs(0).images_size()});
    s.Apply(p, Result(p));
  }
  const std::vector<std::pair<int, int>> want = {{5, 0}, {8, 1}, {1, 0}, {8, 1}, {8, 0}, {1, 0}};
  EXPECT_EQ(chunks, want);

  GenerateRequest too_big;
  too_big.add_prompt_token_ids(1);
  for (int i = 0; i < 20; ++i) too_big.add_prompt_token_ids(3);
  too_big.mutable_sampling()->set_max_tokens(1);
  PromptImage wide;
  wide.set_begin(1);
  wide.set_length(12);  // more than the step's 8 tokens
  *too_big.add_images() = wide;
  EXPECT_THROW(s.Validate(too_big), std::invalid_argument);
}

// Prompts with pictures share a cached prefix only when the pictures are the same bytes: the cache key
// carries each picture's interned content, not just its block of sentinel ids (which two pictures of one
// size share).
TEST(Scheduler, ImagePrefixesHitOnlyForTheSamePicture) {
  Scheduler s(Config(4, 64, true), Geometry(200));
  auto make = [](const std::string& patches, const std::string& id) {
    auto r = Req(std::vector<int32_t>(30, 3), 1);
    r->request_id = id;
    PromptImage im;
    im.set_begin(5);
    im.set_length(8);
    im.set_vit_h(1);
    im.set_vit_w(1);
    im.set_patches(patches);
    r->images.push_back(im);
    return r;
  };
  auto run = [&](const std::shared_ptr<Request>& r) {
    const int64_t hits = s.prefix_cache().hits;
    s.Add(r);
    while (s.HasWork()) {
      StepPlan p = s.Schedule();
      s.Apply(p, Result(p));
    }
    EXPECT_EQ(Drain(*r).back().finish_reason(), FINISH_LENGTH) << r->request_id;
    return s.prefix_cache().hits - hits;
  };
  EXPECT_EQ(run(make("picture A", "a")), 0) << "nothing cached yet";
  EXPECT_EQ(run(make("picture A", "a2")), 28) << "the same picture: the snapshot at 28 tokens";
  EXPECT_EQ(run(make("picture B", "b")), 0) << "another picture of the same size must not reuse A's state";
  EXPECT_EQ(run(make("picture B", "b2")), 28) << "B's own snapshot";
}

TEST(Scheduler, ReturnLogitsChunksKeepTheirRowsWithinTheStepCap) {
  SchedulerConfig c = Config(4, 512, false);
  c.vocab_size = 129280;  // 8 MiB of f32 rows: 16 per step
  Scheduler s(c, Geometry(100));
  auto r = Req(std::vector<int32_t>(40, 3), 1);
  r->return_logits = true;
  r->params.set_temperature(0.7f);  // any sampling (prompt_logprobs)
  s.Add(r);
  std::vector<int> chunks;
  for (int step = 0; step < 10 && s.HasWork(); ++step) {
    StepPlan p = s.Schedule();
    if (p.seqs_size()) chunks.push_back(p.seqs(0).tokens_size());
    s.Apply(p, Result(p));
  }
  EXPECT_EQ(chunks, (std::vector<int>{16, 16, 8}));
  auto plain = Req(std::vector<int32_t>(40, 3), 1);
  Scheduler s2(c, Geometry(100));
  s2.Add(plain);
  EXPECT_EQ(s2.Schedule().seqs(0).tokens_size(), 40);  // only logits requests are capped
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

// Tokens each sequence of `plan` feeds, by request.
int64_t Fed(const StepPlan& plan, const Request& r) {
  for (const auto& sp : plan.seqs())
    if (sp.seq_id() == r.seq_id) return sp.tokens_size();
  return 0;
}

// Runs steps until `r` has its first token; returns how many steps that took (-1: not within `limit`).
int StepsToFirstToken(Scheduler& s, Request& r, int limit) {
  for (int step = 1; step <= limit; ++step) {
    StepPlan p = s.Schedule();
    s.Apply(p, Result(p));
    if (r.num_generated() > 0) return step;
  }
  return -1;
}

TEST(SchedulerFairness, ANewRequestsFirstTokenComesWithinThreeStepsOfALongPrefill) {
  Scheduler s(Config(4, 64, false, 16), Geometry(1000));
  auto long_req = Req(std::vector<int32_t>(2000, 3), 1);
  s.Add(long_req);
  StepPlan p = s.Schedule();
  EXPECT_EQ(Fed(p, *long_req), 64);  // alone: the whole budget
  s.Apply(p, Result(p));
  auto chat = Req({5, 6, 7, 8, 9}, 4);
  s.Add(chat);
  p = s.Schedule();
  EXPECT_EQ(Fed(p, *chat), 5);        // the first chunk comes before the continuing prefill
  EXPECT_EQ(Fed(p, *long_req), 16);   // capped while another request runs
  ASSERT_EQ(p.seqs_size(), 2);
  EXPECT_EQ(p.seqs(0).seq_id(), chat->seq_id);
  s.Apply(p, Result(p));
  auto out = Drain(*chat);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].first_token_steps(), 1);
  EXPECT_EQ(out[0].first_token_step(), s.steps());  // the step just applied, on the scheduler's count
  // The chat decodes (one row each step) beside the capped prefill, then the prefill has the budget again.
  for (int i = 0; i < 3; ++i) {
    p = s.Schedule();
    EXPECT_EQ(Fed(p, *chat), 1);
    EXPECT_EQ(Fed(p, *long_req), 16);
    s.Apply(p, Result(p));
  }
  EXPECT_EQ(Drain(*chat).back().finish_reason(), FINISH_LENGTH);
  p = s.Schedule();
  EXPECT_EQ(Fed(p, *long_req), 64);
}

// --max-decode-slowdown: beside a decoding sequence a long prefill's chunk shrinks to what keeps the step
// within the ratio of a decode-only step, by the measured costs (here played: a decode-only step 8 ms,
// 0.25 ms per prefill token); alone it takes the whole budget again; off, the token cap alone rules.
TEST(SchedulerFairness, MaxDecodeSlowdownBoundsThePrefillBesideDecodes) {
  for (const double slowdown : {0.0, 2.0}) {
    SchedulerConfig c = Config(4, 256, false, 128);
    c.max_decode_slowdown = slowdown;
    Scheduler s(c, Geometry(1000));
    auto chat = Req({5, 6, 7}, 100);
    s.Add(chat);
    StepPlan p = s.Schedule();
    s.Apply(p, Result(p));
    auto long_req = Req(std::vector<int32_t>(3000, 3), 1);
    s.Add(long_req);
    std::vector<int64_t> chunks;
    for (int i = 0; i < 30; ++i) {
      p = s.Schedule();
      ASSERT_EQ(Fed(p, *chat), 1) << "step " << i;
      const int64_t n = Fed(p, *long_req);
      chunks.push_back(n);
      s.ObserveStepCost(p, Result(p), 0.008 + 0.00025 * static_cast<double>(n));
      s.Apply(p, Result(p));
      if (i % 3 == 2) {  // now and then the cost of a decode-only step of the chat, as the engine observes one
        StepPlan d;
        auto* sp = d.add_seqs();
        sp->set_seq_id(chat->seq_id);
        sp->set_sample(true);
        sp->add_tokens(7);
        s.ObserveStepCost(d, Result(d), 0.008);
      }
    }
    if (slowdown == 0) {
      for (size_t i = 0; i < 20; ++i) EXPECT_EQ(chunks[i], 128);  // the token cap only (until the prompt's end)
      EXPECT_EQ(s.mixed_step_caps(), 0);
    } else {
      EXPECT_EQ(chunks[0], 128) << "no cap before both costs are measured";
      // 8 ms of room at 0.25 ms per token: 32 tokens beside the decode (a little fewer while the first,
      // overestimated sample, taken before a decode-only step was measured, still weighs).
      for (size_t i = chunks.size() - 5; i < chunks.size(); ++i) {
        EXPECT_LE(0.008 + 0.00025 * static_cast<double>(chunks[i]), 2 * 0.008 + 1e-12) << "step " << i;
        EXPECT_GE(chunks[i], 28) << "step " << i;
      }
      EXPECT_GT(s.mixed_step_caps(), 0);
      EXPECT_NEAR(s.mixed_step_budget().decode_step_seconds(), 0.008, 1e-9);
    }
  }
}

TEST(SchedulerFairness, WithTheThresholdOffTheLongPrefillTakesEveryStep) {
  // vLLM's default order: a new request waits for the whole prefill (2000 / 64 steps).
  Scheduler s(Config(4, 64, false, 0), Geometry(1000));
  auto long_req = Req(std::vector<int32_t>(2000, 3), 1);
  s.Add(long_req);
  StepPlan p = s.Schedule();
  s.Apply(p, Result(p));
  auto chat = Req({5, 6, 7, 8, 9}, 4);
  s.Add(chat);
  const int steps = StepsToFirstToken(s, *chat, 100);
  EXPECT_GE(steps, 2000 / 64);
  EXPECT_EQ(Drain(*chat)[0].first_token_steps(), steps);
}

TEST(SchedulerFairness, FourNewRequestsAllStartBesideTwoLongPrefills) {
  // Budget order: decodes, then first chunks (up to max-num-seqs), then continuing prefills.
  Scheduler s(Config(6, 64, false, 16), Geometry(2000));
  auto a = Req(std::vector<int32_t>(500, 3), 1), b = Req(std::vector<int32_t>(500, 4), 1);
  s.Add(a);
  s.Add(b);
  StepPlan p = s.Schedule();
  EXPECT_EQ(Fed(p, *a), 16);
  EXPECT_EQ(Fed(p, *b), 16);
  s.Apply(p, Result(p));
  std::vector<std::shared_ptr<Request>> chats;
  for (int i = 0; i < 4; ++i) {
    chats.push_back(Req(std::vector<int32_t>(10, 10 + i), 3));
    s.Add(chats.back());
  }
  p = s.Schedule();
  for (auto& c : chats) EXPECT_EQ(Fed(p, *c), 10);
  EXPECT_EQ(Fed(p, *a), 16);  // 64 - 40 = 24 left: a (better ranked) takes its capped 16 first
  EXPECT_EQ(Fed(p, *b), 8);
  s.Apply(p, Result(p));
  for (auto& c : chats) EXPECT_EQ(c->num_generated(), 1);
  p = s.Schedule();
  for (auto& c : chats) EXPECT_EQ(Fed(p, *c), 1);  // four decode rows first
  EXPECT_EQ(Fed(p, *a), 16);
  EXPECT_EQ(Fed(p, *b), 16);
}

TEST(SchedulerPriority, TheHigherPriorityWaitingRequestIsAdmittedFirst) {
  Scheduler s(Config(1, 64, false, 16, SchedulingPolicy::kPriority), Geometry(1000));
  auto running = Req({1, 2, 3}, 2);
  s.Add(running);
  StepPlan p = s.Schedule();
  s.Apply(p, Result(p));
  auto low = Req({4, 5}, 1, /*priority=*/5), high = Req({6, 7, 8}, 1, /*priority=*/-1);
  s.Add(low);
  s.Add(high);
  p = s.Schedule();
  s.Apply(p, Result(p));  // `running` finishes here
  p = s.Schedule();
  ASSERT_EQ(p.seqs_size(), 1);
  EXPECT_EQ(p.seqs(0).tokens_size(), 3);  // high, though low arrived first
  s.Apply(p, Result(p));
  EXPECT_EQ(high->num_generated(), 1);
  EXPECT_EQ(low->num_generated(), 0);
}

TEST(SchedulerPriority, FcfsKeepsArrivalOrderWhateverThePriorityField) {
  Scheduler s(Config(1, 64, false, 16, SchedulingPolicy::kFcfs), Geometry(1000));
  auto first = Req({4, 5}, 1, 5), second = Req({6, 7, 8}, 1, -1);
  s.Add(first);
  s.Add(second);
  StepPlan p = s.Schedule();
  ASSERT_EQ(p.seqs_size(), 1);
  EXPECT_EQ(p.seqs(0).tokens_size(), 2);
}

TEST(SchedulerPriority, TheBudgetGoesToTheBetterPriorityFirst) {
  Scheduler s(Config(4, 20, false, 16, SchedulingPolicy::kPriority), Geometry(1000));
  auto low = Req(std::vector<int32_t>(100, 3), 1, 2), high = Req(std::vector<int32_t>(100, 4), 1, 1);
  s.Add(low);
  s.Add(high);
  StepPlan p = s.Schedule();
  EXPECT_EQ(Fed(p, *high), 16);
  EXPECT_EQ(Fed(p, *low), 4);
}

TEST(SchedulerPreemption, TheLowestPriorityThenNewestIsPreempted) {
  // 1 fixed block + 4 tokens per block; 10 blocks: three sequences of 4 prompt tokens (2 blocks each)
  // fit, and growing to 11 tokens (4 blocks each) does not.
  Scheduler s(Config(3, 64, false, 16, SchedulingPolicy::kPriority), Geometry(10));
  auto a = Req({1, 2, 3, 4}, 8, 0), b = Req({5, 6, 7, 8}, 8, 3), c = Req({9, 10, 11, 12}, 8, 1);
  s.Add(a);
  s.Add(b);
  s.Add(c);
  std::vector<std::string> order;
  int64_t seen = 0;
  for (int step = 0; step < 200 && s.HasWork(); ++step) {
    StepPlan p = s.Schedule();
    if (s.num_preemptions() > seen) {
      seen = s.num_preemptions();
      for (auto* r : {a.get(), b.get(), c.get()})
        if (r->phase == Request::Phase::kWaiting && r->num_generated() > 0 && order.empty())
          order.push_back(r == a.get() ? "a" : r == b.get() ? "b" : "c");
    }
    s.Apply(p, Result(p));
  }
  ASSERT_FALSE(order.empty());
  EXPECT_EQ(order[0], "b");  // priority 3: the worst
  for (auto* r : {a.get(), b.get(), c.get()}) EXPECT_EQ(Drain(*r).back().completion_tokens(), 8);
  EXPECT_EQ(s.kv_usage(), 0.0);
}

TEST(SchedulerPreemption, FcfsPreemptsTheNewest) {
  Scheduler s(Config(3, 64, false, 16), Geometry(10));
  auto a = Req({1, 2, 3, 4}, 8), b = Req({5, 6, 7, 8}, 8), c = Req({9, 10, 11, 12}, 8);
  s.Add(a);
  s.Add(b);
  s.Add(c);
  while (s.num_preemptions() == 0 && s.HasWork()) {
    StepPlan p = s.Schedule();
    s.Apply(p, Result(p));
  }
  EXPECT_EQ(c->phase, Request::Phase::kWaiting);
  EXPECT_EQ(a->phase, Request::Phase::kRunning);
  EXPECT_EQ(b->phase, Request::Phase::kRunning);
}

TEST(SchedulerRefusal, ARequestThatCouldNeverFitNamesBothNumbers) {
  // 100 blocks of 4 tokens, 1 fixed block each: one sequence holds at most 396 tokens.
  Scheduler s(Config(4, 64, false), Geometry(100));
  EXPECT_EQ(s.max_seq_tokens(), 396);
  GenerateRequest g;
  for (int i = 0; i < 300; ++i) g.add_prompt_token_ids(1);
  g.mutable_sampling()->set_max_tokens(97);
  try {
    s.Validate(g);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("at most 396 tokens"), std::string::npos) << m;
    EXPECT_NE(m.find("you requested 397 tokens"), std::string::npos) << m;
  }
  g.mutable_sampling()->set_max_tokens(96);
  EXPECT_NO_THROW(s.Validate(g));
}

TEST(SchedulerRefusal, PriorityNeedsThePriorityPolicy) {
  Scheduler fcfs(Config(4, 64, false), Geometry(100));
  GenerateRequest g;
  g.add_prompt_token_ids(1);
  g.set_priority(2);
  EXPECT_THROW(fcfs.Validate(g), std::invalid_argument);
  g.set_priority(0);
  EXPECT_NO_THROW(fcfs.Validate(g));
  Scheduler prio(Config(4, 64, false, 16, SchedulingPolicy::kPriority), Geometry(100));
  g.set_priority(-7);
  EXPECT_NO_THROW(prio.Validate(g));
  EXPECT_THROW(ParseSchedulingPolicy("lifo"), std::invalid_argument);
}

}  // namespace
}  // namespace dsmesh
