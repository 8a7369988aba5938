// `dsmesh bench --scenario long-prompt-plus-chat`: one long prompt plus a short chat every second, on a
// local mesh started twice: with the coordinator's fair order (--long-prefill-token-threshold as given,
// else its default) and with it off (--long-prefill-token-threshold 0, vLLM's default order).
//   chat TTFT, steps = the coordinator's count of engine steps from the chat's arrival to its first token
//   chat TTFT, s     = Generate call -> first token, as the client sees it
//   long prefill     = long prompt tokens / its TTFT (max_tokens 1), beside the chats and alone (the mean
//                      of one run before and one after the mixed phase)
//   step time        = mean step wall time (the coordinator's Stats) over the mixed phase, and over each
//                      chat's own life (steps grow longer as the long prompt's context grows, so a chat's
//                      TTFT is compared with the steps around it)
// A long prompt of the same length runs first, unmeasured. Prompts are random token ids, a different one per
// phase, so no phase hits another's prefix cache.
#include "cli/bench/scenario_bench.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli/bench/bench_clock.h"
#include "cli/bench/percentile.h"
#include "cli/bench/synthetic_prompts.h"
#include "cli/mesh_commands.h"
#include "common/mesh/mesh_client.h"

namespace dsmesh {
namespace {

// A greedy request of `tokens` random token ids (distinct per seed) that generates exactly `max_tokens`.
GenerateRequest RandomPrompt(const std::string& id, int tokens, uint32_t seed, int max_tokens) {
  GenerateRequest req;
  req.set_request_id(id);
  for (int32_t t : RandomTokenIds(tokens, seed)) req.add_prompt_token_ids(t);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(max_tokens);
  req.mutable_sampling()->set_ignore_eos(true);
  return req;
}

struct ScenarioOptions {
  int long_tokens = 16384;
  int chat_tokens = 16;
  int chat_max_tokens = 8;
  double chat_every_s = 1.0;
};

struct Column {
  std::string label;
  int threshold = 0;
  double alone_tok_s = 0, mixed_tok_s = 0;
  std::vector<double> ttft_steps, ttft_s, ttft_in_local_steps;
  double step_s = 0;
  int64_t preemptions = 0;
};

Column RunOne(LocalMeshOptions options, int threshold, const ScenarioOptions& so, int ready_timeout_s,
              uint32_t seed) {
  Column c;
  c.threshold = threshold;
  auto& args = options.coordinator_args;
  for (size_t i = 0; i + 1 < args.size();)
    if (args[i] == "--long-prefill-token-threshold") args.erase(args.begin() + i, args.begin() + i + 2);
    else i += 2;
  if (threshold >= 0) args.insert(args.end(), {"--long-prefill-token-threshold", std::to_string(threshold)});
  LocalMesh mesh(options);
  mesh.Start();
  MeshClient client(mesh.coordinator_address());
  client.WaitReady(std::chrono::seconds(ready_timeout_s));
  c.threshold = client.Stats().long_prefill_token_threshold();
  c.label = c.threshold > 0 ? "fair (threshold " + std::to_string(c.threshold) + ")" : "off (threshold 0)";
  const std::string address = mesh.coordinator_address();

  auto check = [](const GenerateResult& r, const char* what) {
    if (r.finish == FINISH_ABORT || r.tokens.empty()) throw std::runtime_error(std::string(what) + " failed: " + r.error);
  };
  // The long prompt alone, before and after the mixed phase (the mean of both: a shared machine drifts).
  auto run_alone = [&](const char* id, uint32_t s) {
    GenerateResult alone = client.Generate(RandomPrompt(id, so.long_tokens, s, 1));
    check(alone, "the long prompt (alone)");
    return so.long_tokens / alone.token_times.front();
  };
  run_alone("warmup", seed);  // first-use costs (state allocation, page faults) stay out of the figures
  const double alone_before = run_alone("long-alone-1", seed + 1);

  // The long prompt with a chat every chat_every_s while it prefills.
  // Channels connect before the clock starts: TTFT is the mesh's, not a TCP handshake's.
  MeshClient long_client(address);
  long_client.Stats();
  StatsResponse before = client.Stats();
  GenerateResult mixed;
  std::string long_error;
  std::atomic<bool> long_done{false};
  std::thread long_thread([&] {
    try {
      mixed = long_client.Generate(RandomPrompt("long-mixed", so.long_tokens, seed + 2, 1));
    } catch (const std::exception& e) {
      long_error = e.what();
    }
    long_done = true;
  });
  std::vector<std::thread> chats;
  std::vector<GenerateResult> chat_results(4096);
  std::vector<std::string> chat_errors(4096);
  std::vector<double> chat_local_step_s(4096, 0);
  const auto t0 = BenchClock::now();
  for (int i = 0; i < 4096; ++i) {
    const double at = so.chat_every_s * (i + 0.5);
    while (!long_done && SecondsSince(t0) < at) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (long_done) break;
    chats.emplace_back([&, i] {
      try {
        const StatsResponse s0 = client.Stats();
        chat_results[i] = client.Generate(RandomPrompt("chat-" + std::to_string(i), so.chat_tokens, seed + 100 + i,
                                                   so.chat_max_tokens));
        const StatsResponse s1 = client.Stats();
        if (s1.steps() > s0.steps())
          chat_local_step_s[i] = (s1.step_wall_seconds_sum() - s0.step_wall_seconds_sum()) / (s1.steps() - s0.steps());
      } catch (const std::exception& e) {
        chat_errors[i] = e.what();
      }
    });
  }
  long_thread.join();
  for (auto& t : chats) t.join();
  StatsResponse after = client.Stats();
  if (!long_error.empty()) throw std::runtime_error("the long prompt failed: " + long_error);
  check(mixed, "the long prompt (with chats)");
  c.mixed_tok_s = so.long_tokens / mixed.token_times.front();
  for (size_t i = 0; i < chats.size(); ++i) {
    if (!chat_errors[i].empty()) throw std::runtime_error("chat " + std::to_string(i) + ": " + chat_errors[i]);
    check(chat_results[i], "a chat");
    c.ttft_steps.push_back(chat_results[i].first_token_steps);
    c.ttft_s.push_back(chat_results[i].token_times.front());
    if (chat_local_step_s[i] > 0) c.ttft_in_local_steps.push_back(chat_results[i].token_times.front() / chat_local_step_s[i]);
  }
  const double steps = double(after.steps() - before.steps());
  c.step_s = steps > 0 ? (after.step_wall_seconds_sum() - before.step_wall_seconds_sum()) / steps : 0;
  c.preemptions = after.num_preemptions() - before.num_preemptions();
  c.alone_tok_s = (alone_before + run_alone("long-alone-2", seed + 3)) / 2;
  mesh.Stop();
  return c;
}

int RunLongPromptPlusChat(const Flags& f) {
  ScenarioOptions so;
  so.long_tokens = static_cast<int>(f.GetInt("long-prompt-tokens", so.long_tokens));
  so.chat_tokens = static_cast<int>(f.GetInt("chat-prompt-tokens", so.chat_tokens));
  so.chat_max_tokens = static_cast<int>(f.GetInt("chat-max-tokens", so.chat_max_tokens));
  so.chat_every_s = f.GetDouble("chat-every-s", so.chat_every_s);
  if (so.long_tokens < 1 || so.chat_tokens < 1 || so.chat_max_tokens < 1 || !(so.chat_every_s > 0))
    throw UsageError("--long-prompt-tokens, --chat-prompt-tokens, --chat-max-tokens must be >= 1 and "
                     "--chat-every-s > 0");
  const int world = static_cast<int>(f.GetInt("world", 2));
  if (world < 1) throw UsageError("--world must be >= 1");
  const std::string model = f.Has("model") ? f.Get("model") : DefaultModel();
  const DeviceChoice device = ChooseDevice(f);
  std::fprintf(stderr, "bench: %s\n", device.Line().c_str());
  LocalMeshOptions options = OptionsFromFlags(f, model, world, device);
  const int ready_timeout_s = static_cast<int>(f.GetInt("ready-timeout-s", 300));
  const int fair_threshold = f.Has("long-prefill-token-threshold")
                                 ? static_cast<int>(f.GetInt("long-prefill-token-threshold", 0)) : -1;
  if (fair_threshold == 0)
    throw UsageError("--long-prefill-token-threshold sets the fair column and must be > 0 (the other column runs 0)");

  std::printf("long-prompt-plus-chat: model %s, world %d; a %d-token prompt (max_tokens 1) and, while it prefills, "
              "a %d-token chat (max_tokens %d) every %.2f s\n",
              model.c_str(), world, so.long_tokens, so.chat_tokens, so.chat_max_tokens, so.chat_every_s);
  std::fflush(stdout);
  std::vector<Column> cols;
  cols.push_back(RunOne(options, fair_threshold, so, ready_timeout_s, 1000));
  cols.push_back(RunOne(options, 0, so, ready_timeout_s, 1000));

  auto row = [&](const char* name, auto cell) {
    std::printf("%-34s", name);
    for (const auto& c : cols) std::printf(" %24s", cell(c).c_str());
    std::printf("\n");
  };
  auto fmt = [](const char* spec, double a, double b = 0) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), spec, a, b);
    return std::string(buf);
  };
  row("", [](const Column& c) { return c.label; });
  row("chats during the long prefill", [&](const Column& c) { return fmt("%.0f", double(c.ttft_s.size())); });
  row("chat TTFT p50 / p99, steps", [&](const Column& c) {
    return c.ttft_steps.empty() ? std::string("-")
                                : fmt("%.0f / %.0f", Percentile(c.ttft_steps, 50), Percentile(c.ttft_steps, 99));
  });
  row("chat TTFT p50 / p99, s", [&](const Column& c) {
    return c.ttft_s.empty() ? std::string("-") : fmt("%.3f / %.3f", Percentile(c.ttft_s, 50), Percentile(c.ttft_s, 99));
  });
  row("mean step time (mixed), ms", [&](const Column& c) { return fmt("%.1f", c.step_s * 1e3); });
  row("chat TTFT p50 / p99, step times", [&](const Column& c) {
    return c.ttft_in_local_steps.empty() ? std::string("-")
                                         : fmt("%.1f / %.1f", Percentile(c.ttft_in_local_steps, 50),
                                               Percentile(c.ttft_in_local_steps, 99));
  });
  row("long prefill alone, tok/s", [&](const Column& c) { return fmt("%.0f", c.alone_tok_s); });
  row("long prefill with chats, tok/s", [&](const Column& c) {
    return fmt("%.0f (%.0f%% of alone)", c.mixed_tok_s, 100.0 * c.mixed_tok_s / c.alone_tok_s);
  });
  row("preemptions", [&](const Column& c) { return fmt("%.0f", double(c.preemptions)); });
  std::printf("step times: a chat's TTFT in seconds over the mean step time during that chat's life\n");
  std::printf("goal: chat TTFT <= 3 step times while the long prefill runs; the long prefill within 25%% of alone\n");
  return 0;
}

}  // namespace

int RunScenarioBench(const std::vector<std::string>& args) {
  auto known = kMeshFlags;
  known.insert({"scenario", "long-prompt-tokens", "chat-prompt-tokens", "chat-max-tokens", "chat-every-s"});
  known.insert(kCoordinatorFlags.begin(), kCoordinatorFlags.end());
  Flags f(args, known);
  const std::string scenario = f.Require("scenario");  // (--coordinator is refused by ChooseBenchMode)
  if (scenario == "long-prompt-plus-chat") return RunLongPromptPlusChat(f);
  throw UsageError("--scenario: unknown scenario '" + scenario + "' (known: long-prompt-plus-chat)");
}

}  // namespace dsmesh
