// Scheduling on a real mesh (coordinator + CPU workers), counted in engine steps, not seconds:
//   admission  - with a long prefill running, a new request's first token comes within 3 steps (and, with
//                --long-prefill-token-threshold 0, only after the prefill);
//   priority   - of two waiting requests the higher priority (lower value) is admitted first; fcfs refuses
//                a non-zero priority;
// Order between requests is judged by the step numbers the coordinator reports with each first token
// (GenerateResponse.first_token_step), never by the client threads' clocks: on a loaded machine a client
// thread can be descheduled for longer than the steps that separate two requests.
//   preemption - a pool too small for 4 growing sequences under the priority policy: all 4 equal their
//                solo greedy outputs and the preemption counter moved;
//   refusal    - a request the pool can never hold is refused at once, naming both numbers, and the
//                request in flight is not disturbed.
#include <atomic>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "tests/mesh/mesh_fixture.h"

namespace dsmesh::mesh_test {
namespace {

using Clock = std::chrono::steady_clock;

// One Generate call on its own thread; records the coordinator's step numbers for its first token.
struct Call {
  GenerateResult result;
  std::string error;
  int64_t first_token_step = 0;   // the step that produced the first token (0: none came)
  int32_t first_token_steps = 0;  // steps from the request's arrival to that one
  std::atomic<bool> done{false};
  grpc::ClientContext ctx;
  std::thread thread;
  Call(const std::string& address, const GenerateRequest& req) {
    thread = std::thread([this, address, req] {
      try {
        MeshClient c(address);
        auto reader = c.stub().Generate(&ctx, req);
        GenerateResponse r;
        while (reader->Read(&r)) {
          if (r.first_token_step()) first_token_step = r.first_token_step();
          if (r.first_token_steps()) first_token_steps = r.first_token_steps();
          for (int32_t t : r.token_ids()) result.tokens.push_back(t);
          result.finish = r.finish_reason();
          if (!r.error().empty()) result.error = r.error();
        }
        grpc::Status st = reader->Finish();
        if (!st.ok()) error = st.error_message();
      } catch (const std::exception& e) {
        error = e.what();
      }
      done = true;
    });
  }
  void Cancel() { ctx.TryCancel(); }  // the client goes away: the coordinator frees the request's slot
  void Join() { thread.join(); }
};

// Waits until the coordinator has run `steps` more steps than `from` (at most 60 s).
void WaitSteps(MeshClient& client, int64_t from, int64_t steps) {
  const auto t0 = Clock::now();
  while (client.Stats().steps() < from + steps && Clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

GenerateRequest WithPriority(GenerateRequest g, int priority) {
  g.set_priority(priority);
  return g;
}

// A short request sent beside a long prefill, in the coordinator's step numbers.
struct ShortBesideLongSteps {
  int32_t short_steps = 0;   // the short request's steps from its arrival to its first token
  int64_t short_first = 0;   // the step that produced the short request's first token
  int64_t short_arrival = 0; // steps run before the short request arrived
  int64_t long_first = 0;    // the step that produced the long request's (only) token
};

// Runs a 1000-token prefill (max-batched-tokens 32, so ~32 steps) and, once it has run 3 steps, a short
// request. The client thread that sends it can be late on a loaded machine; the run counts only if the
// short request reached the scheduler while the prefill was still running (judged by step numbers), and
// is repeated on a fresh mesh otherwise (at most 3 times).
ShortBesideLongSteps ShortBesideLong(const std::string& threshold, Reference& reference) {
  const auto long_prompt = Tokens(1000, 31), chat = Tokens(6, 32);
  ShortBesideLongSteps r;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    LocalMesh mesh(MeshOptions(1, {"--max-batched-tokens", "32", "--long-prefill-token-threshold", threshold}));
    mesh.Start();
    MeshClient client(mesh.coordinator_address());
    client.WaitReady(std::chrono::seconds(60));
    const int64_t s0 = client.Stats().steps();
    Call long_call(mesh.coordinator_address(), Greedy(long_prompt, 1, "long"));
    WaitSteps(client, s0, 3);
    Call chat_call(mesh.coordinator_address(), Greedy(chat, 3, "chat"));
    chat_call.Join();
    long_call.Join();
    EXPECT_EQ(chat_call.error, "");
    EXPECT_EQ(long_call.error, "");
    EXPECT_EQ(chat_call.result.tokens, reference.Greedy(chat, 3));
    EXPECT_EQ(long_call.result.tokens, reference.Greedy(long_prompt, 1));
    EXPECT_GT(chat_call.first_token_step, 0);
    EXPECT_GT(long_call.first_token_step, 0);
    r.short_steps = chat_call.first_token_steps;
    r.short_first = chat_call.first_token_step;
    r.short_arrival = chat_call.first_token_step - chat_call.first_token_steps;
    r.long_first = long_call.first_token_step;
    if (r.short_arrival < r.long_first) return r;
    std::printf("attempt %d: the short request arrived after step %lld, when the prefill had ended (step %lld); "
                "running again\n", attempt, (long long)r.short_arrival, (long long)r.long_first);
  }
  ADD_FAILURE() << "in 3 attempts the short request never reached the scheduler during the long prefill";
  return r;
}

TEST(MeshScheduling, ANewRequestsFirstTokenComesWithin3StepsOfALongPrefill) {
  Reference reference;
  const auto fair = ShortBesideLong("8", reference);
  std::printf("threshold 8: arrived after step %lld, first token after %d steps (step %lld; prefill's token at %lld)\n",
              (long long)fair.short_arrival, fair.short_steps, (long long)fair.short_first, (long long)fair.long_first);
  EXPECT_GE(fair.short_steps, 1);
  EXPECT_LE(fair.short_steps, 3);
  EXPECT_LT(fair.short_first, fair.long_first);
  // The same with the fair order off: the short request waits for the rest of the prefill; it may share the
  // prefill's last step.
  const auto off = ShortBesideLong("0", reference);
  std::printf("threshold 0: arrived after step %lld, first token after %d steps (step %lld; prefill's token at %lld)\n",
              (long long)off.short_arrival, off.short_steps, (long long)off.short_first, (long long)off.long_first);
  EXPECT_GE(off.short_first, off.long_first);
}

TEST(MeshScheduling, TheHigherPriorityWaitingRequestIsAdmittedFirst) {
  LocalMesh mesh(MeshOptions(1, {"--max-num-seqs", "1", "--max-batched-tokens", "32", "--scheduling-policy",
                                 "priority"}));
  mesh.Start();
  MeshClient client(mesh.coordinator_address());
  client.WaitReady(std::chrono::seconds(60));
  EXPECT_EQ(client.Stats().scheduling_policy(), "priority");
  Reference reference;
  // The one slot is held by a request that would decode for ~1000 steps; it is cancelled once both others
  // wait, so the slot frees at a moment the test chooses, however slowly the client threads run.
  const int64_t s0 = client.Stats().steps();
  Call running(mesh.coordinator_address(), Greedy(Tokens(8, 40), 1000, "running"));
  WaitSteps(client, s0, 2);
  const auto low_prompt = Tokens(8, 41), high_prompt = Tokens(9, 42);
  Call low(mesh.coordinator_address(), WithPriority(Greedy(low_prompt, 2, "low"), 5));
  const auto t0 = Clock::now();
  while (client.Stats().num_requests_waiting() < 1 && Clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  Call high(mesh.coordinator_address(), WithPriority(Greedy(high_prompt, 2, "high"), -1));
  while (client.Stats().num_requests_waiting() < 2 && Clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_FALSE(running.done.load()) << "the slot freed before both requests waited";
  EXPECT_EQ(client.Stats().num_requests_waiting(), 2);
  running.Cancel();
  running.Join();
  low.Join();
  high.Join();
  ASSERT_GT(high.first_token_step, 0) << high.error;
  ASSERT_GT(low.first_token_step, 0) << low.error;
  // max-num-seqs 1: the request admitted first runs to its end before the other is admitted.
  EXPECT_LT(high.first_token_step, low.first_token_step) << "priority -1 must be admitted before priority 5";
  EXPECT_EQ(low.result.tokens, reference.Greedy(low_prompt, 2));
  EXPECT_EQ(high.result.tokens, reference.Greedy(high_prompt, 2));
}

TEST(MeshScheduling, FcfsRefusesANonZeroPriority) {
  LocalMesh mesh(MeshOptions(1));
  mesh.Start();
  MeshClient client(mesh.coordinator_address());
  client.WaitReady(std::chrono::seconds(60));
  EXPECT_EQ(client.Stats().scheduling_policy(), "fcfs");
  try {
    client.Generate(WithPriority(Greedy(Tokens(4, 1), 2), 3));
    ADD_FAILURE() << "fcfs accepted priority 3";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("Got priority 3 but Priority scheduling is not enabled"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(client.Generate(WithPriority(Greedy(Tokens(4, 1), 2), 0)).finish, FINISH_LENGTH);
}

TEST(MeshScheduling, PreemptionUnderThePriorityPolicyKeepsOutputsAndCounts) {
  // As faults_test's tight pool: 5 blocks of 256 tokens admit four sequences, which outgrow the pool.
  LocalMeshOptions o = MeshOptions(1, {"--max-num-seqs", "4", "--enable-prefix-caching", "false",
                                       "--scheduling-policy", "priority"});
  o.kv_memory = KvMemoryForBlocks(5);
  LocalMesh mesh(o);
  mesh.Start();
  MeshClient client(mesh.coordinator_address());
  client.WaitReady(std::chrono::seconds(60));
  Reference reference;
  // Long enough that the four calls run together however their starts are spread on a loaded machine
  // (with 80 tokens a call could end before the last one arrived, and nothing outgrew the pool).
  const int n = 4, max_tokens = 240;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(Tokens(200 + 7 * i, 70 + i));
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < n; ++i)
    calls.push_back(std::make_unique<Call>(mesh.coordinator_address(),
                                           WithPriority(Greedy(prompts[i], max_tokens), n - i)));
  for (auto& c : calls) c->Join();
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(calls[i]->error, "");
    EXPECT_EQ(calls[i]->result.finish, FINISH_LENGTH) << calls[i]->result.error;
    EXPECT_EQ(calls[i]->result.tokens, reference.Greedy(prompts[i], max_tokens)) << "request " << i;
  }
  const int64_t preemptions = client.Stats().num_preemptions();
  std::printf("preemptions: %lld\n", (long long)preemptions);
  EXPECT_GT(preemptions, 0);
  EXPECT_EQ(client.Stats().kv_cache_usage_perc(), 0.0);
}

TEST(MeshScheduling, ARequestThatCanNeverFitIsRefusedAtOnceNamingBothNumbers) {
  LocalMeshOptions o = MeshOptions(1);
  o.kv_memory = KvMemoryForBlocks(3);  // 768 tokens
  LocalMesh mesh(o);
  mesh.Start();
  MeshClient client(mesh.coordinator_address());
  client.WaitReady(std::chrono::seconds(60));
  Reference reference;
  const int64_t room = client.Stats().max_seq_tokens();
  ASSERT_GT(room, 100);
  ASSERT_LT(room, 1024);  // the pool, not --max-model-len, is the limit here
  const auto prompt = Tokens(20, 90);
  Call in_flight(mesh.coordinator_address(), Greedy(prompt, 40, "in-flight"));
  const int64_t steps_before = client.Stats().steps();
  const int prompt_len = static_cast<int>(room) - 50, max_tokens = 60;
  const auto t0 = Clock::now();
  try {
    client.Generate(Greedy(Tokens(prompt_len, 91), max_tokens, "too-big"));
    ADD_FAILURE() << "a request of " << prompt_len + max_tokens << " tokens was accepted with room for " << room;
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("at most " + std::to_string(room) + " tokens"), std::string::npos) << m;
    EXPECT_NE(m.find("you requested " + std::to_string(prompt_len + max_tokens) + " tokens"), std::string::npos) << m;
    EXPECT_NE(m.find(" 3 "), std::string::npos) << "gRPC INVALID_ARGUMENT (3): " << m;
  }
  // The exact check is the step count (the in-flight request needs 40 decode steps, a refusal none); the wall
  // bound only catches a refusal that waits on something (a step timeout, the in-flight request's end) and
  // leaves a 2-core machine running the whole suite beside it many seconds of margin.
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  EXPECT_LE(client.Stats().steps() - steps_before, 40) << "the refusal ran no compute of its own";
  in_flight.Join();
  EXPECT_EQ(in_flight.error, "");
  EXPECT_EQ(in_flight.result.tokens, reference.Greedy(prompt, 40));
}

}  // namespace
}  // namespace dsmesh::mesh_test
