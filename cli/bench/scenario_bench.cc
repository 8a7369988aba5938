// `dsmesh bench --scenario long-prompt-plus-chat`: one long prompt plus a short chat every second, and the
// same long prompt beside a stream that is already decoding, on a local mesh started once per column: with
// the coordinator's fair order (--long-prefill-token-threshold as given, else its default); with the fair
// order and --max-decode-slowdown R, when the bench is given that flag; and with the fair order off
// (--long-prefill-token-threshold 0, vLLM's default order).
//   chat TTFT, steps = the coordinator's count of engine steps from the chat's arrival to its first token
//   chat TTFT, s     = Generate call -> first token, as the client sees it
//   long prefill     = long prompt tokens / its TTFT (max_tokens 1), beside the chats and alone (the mean
//                      of one run before and one after the mixed phase)
//   step time        = mean step wall time (the coordinator's Stats) over the mixed phase, and over each
//                      chat's own life (steps grow longer as the long prompt's context grows, so a chat's
//                      TTFT is compared with the steps around it)
//   decoding stream  = a chat-sized prompt generating with ignore_eos (cli/bench/decode_stream_phase.h): its
//                      time per token as the client receives its streamed tokens, while it decodes alone
//                      (32 gaps) and while the long prompt is prefilled beside it (p50 and p90); the
//                      slowdown is beside / alone (issue 41's target: <= 2); then the long prompt's TTFT
//                      beside it and the coordinator's count of steps whose prefill the slowdown cap cut
// A long prompt of the same length runs first, unmeasured. Prompts are random token ids, a different one per
// phase, so no phase hits another's prefix cache. --json F writes every figure, per column.
#include "cli/bench/scenario_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench/bench_clock.h"
#include "cli/bench/decode_stream_phase.h"
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
  int stream_alone_gaps = 32;  // the decoding stream's inter-token times measured before the long prompt
};

struct Column {
  std::string label;
  int threshold = 0;
  double slowdown = 0;  // --max-decode-slowdown (0: off)
  double alone_tok_s = 0, mixed_tok_s = 0;
  std::vector<double> ttft_steps, ttft_s, ttft_in_local_steps;
  double step_s = 0;
  int64_t preemptions = 0;
  DecodeStreamPhase stream;
  int64_t stream_prefill_caps = 0, stream_preemptions = 0;  // the coordinator's counts over the stream phase
};

// Removes every `--name value` pair from `args`.
void DropFlag(std::vector<std::string>& args, const std::string& name) {
  for (size_t i = 0; i < args.size();)
    if (args[i] == name && i + 1 < args.size()) args.erase(args.begin() + i, args.begin() + i + 2);
    else ++i;
}

// threshold -1: the coordinator's default. slowdown "": no --max-decode-slowdown (off).
Column RunOne(LocalMeshOptions options, int threshold, const std::string& slowdown, const ScenarioOptions& so,
              int ready_timeout_s, uint32_t seed) {
  Column c;
  c.threshold = threshold;
  auto& args = options.coordinator_args;
  DropFlag(args, "--long-prefill-token-threshold");
  DropFlag(args, "--max-decode-slowdown");
  if (threshold >= 0) args.insert(args.end(), {"--long-prefill-token-threshold", std::to_string(threshold)});
  if (!slowdown.empty()) args.insert(args.end(), {"--max-decode-slowdown", slowdown});
  LocalMesh mesh(options);
  mesh.Start();
  MeshClient client(mesh.coordinator_address());
  client.WaitReady(std::chrono::seconds(ready_timeout_s));
  const StatsResponse config = client.Stats();
  c.threshold = config.long_prefill_token_threshold();
  c.slowdown = config.max_decode_slowdown();
  char slowdown_text[32];
  std::snprintf(slowdown_text, sizeof(slowdown_text), "%g", c.slowdown);
  c.label = c.threshold == 0 ? "off (threshold 0)"
            : c.slowdown > 0 ? "slowdown " + std::string(slowdown_text) + " (threshold " + std::to_string(c.threshold) + ")"
                             : "fair (threshold " + std::to_string(c.threshold) + ")";
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

  // The long prompt beside a stream that is already decoding. Its max_tokens outlasts the phase (it is
  // cancelled at the long prompt's first token) and stays within what one sequence can reach.
  MeshClient stream_client(address);
  stream_client.Stats();
  const int64_t reach = after.max_seq_tokens() > 0 ? after.max_seq_tokens() - so.chat_tokens : 0;
  if (reach < so.stream_alone_gaps + 2)
    throw std::runtime_error("the decoding stream cannot reach " + std::to_string(so.stream_alone_gaps + 2) +
                             " tokens (max_seq_tokens " + std::to_string(after.max_seq_tokens()) + ")");
  const int stream_max_tokens = static_cast<int>(std::min<int64_t>(reach, 1 << 20));
  c.stream = RunDecodeStreamPhase(stream_client, long_client,
                                  RandomPrompt("stream", so.chat_tokens, seed + 4, stream_max_tokens),
                                  RandomPrompt("long-beside-stream", so.long_tokens, seed + 5, 1),
                                  so.stream_alone_gaps, std::chrono::seconds(ready_timeout_s));
  const StatsResponse after_stream = client.Stats();
  c.stream_prefill_caps = after_stream.mixed_step_prefill_caps() - after.mixed_step_prefill_caps();
  c.stream_preemptions = after_stream.num_preemptions() - after.num_preemptions();
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
    throw UsageError("--long-prefill-token-threshold sets the fair column and must be > 0 (the off column runs 0)");

  // --max-decode-slowdown R adds a column: the fair order with that cap (the coordinator's flag, kept off the
  // other two columns).
  std::string slowdown;
  if (f.Has("max-decode-slowdown")) {
    slowdown = f.Get("max-decode-slowdown");
    if (!(f.GetDouble("max-decode-slowdown", 0) > 1))
      throw UsageError("--max-decode-slowdown sets a column of the fair order with that cap and must be > 1");
  }

  // A --json path that cannot be written fails now, not after the runs.
  if (f.Has("json") && !std::ofstream(f.Get("json"), std::ios::app))
    throw UsageError("--json " + f.Get("json") + ": cannot write");

  std::printf("long-prompt-plus-chat: model %s, world %d; a %d-token prompt (max_tokens 1) and, while it prefills, "
              "a %d-token chat (max_tokens %d) every %.2f s; then the prompt again beside a decoding stream "
              "(a %d-token prompt, ignore_eos)\n",
              model.c_str(), world, so.long_tokens, so.chat_tokens, so.chat_max_tokens, so.chat_every_s,
              so.chat_tokens);
  std::fflush(stdout);
  std::vector<Column> cols;
  cols.push_back(RunOne(options, fair_threshold, "", so, ready_timeout_s, 1000));
  if (!slowdown.empty()) cols.push_back(RunOne(options, fair_threshold, slowdown, so, ready_timeout_s, 1000));
  cols.push_back(RunOne(options, 0, "", so, ready_timeout_s, 1000));

  auto row = [&](const char* name, auto cell) {
    std::printf("%-46s", name);
    for (const auto& c : cols) std::printf(" %27s", cell(c).c_str());
    std::printf("\n");
  };
  auto fmt = [](const char* spec, double a, double b = 0) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), spec, a, b);
    return std::string(buf);
  };
  // "a / b" of two percentiles (scaled), or "-" without values.
  auto pair = [&](const char* spec, const std::vector<double>& v, double p1, double p2, double scale) {
    return v.empty() ? std::string("-") : fmt(spec, scale * Percentile(v, p1), scale * Percentile(v, p2));
  };
  // The stream's slowdown at percentile p: its time per token beside the long prefill over alone.
  auto slowdown_at = [](const Column& c, double p) {
    const auto& s = c.stream;
    return s.alone_gaps_s.empty() || s.beside_gaps_s.empty()
               ? std::nan("")
               : Percentile(s.beside_gaps_s, p) / Percentile(s.alone_gaps_s, p);
  };
  row("", [](const Column& c) { return c.label; });
  row("chats during the long prefill", [&](const Column& c) { return fmt("%.0f", double(c.ttft_s.size())); });
  row("chat TTFT p50 / p99, steps", [&](const Column& c) { return pair("%.0f / %.0f", c.ttft_steps, 50, 99, 1); });
  row("chat TTFT p50 / p99, s", [&](const Column& c) { return pair("%.3f / %.3f", c.ttft_s, 50, 99, 1); });
  row("mean step time (mixed), ms", [&](const Column& c) { return fmt("%.1f", c.step_s * 1e3); });
  row("chat TTFT p50 / p99, step times",
      [&](const Column& c) { return pair("%.1f / %.1f", c.ttft_in_local_steps, 50, 99, 1); });
  row("long prefill alone, tok/s", [&](const Column& c) { return fmt("%.0f", c.alone_tok_s); });
  row("long prefill with chats, tok/s", [&](const Column& c) {
    return fmt("%.0f (%.0f%% of alone)", c.mixed_tok_s, 100.0 * c.mixed_tok_s / c.alone_tok_s);
  });
  row("preemptions", [&](const Column& c) { return fmt("%.0f", double(c.preemptions)); });
  row("stream alone, ms/token p50 / p90",
      [&](const Column& c) { return pair("%.2f / %.2f", c.stream.alone_gaps_s, 50, 90, 1e3); });
  row("stream beside the prefill, ms/token p50 / p90",
      [&](const Column& c) { return pair("%.2f / %.2f", c.stream.beside_gaps_s, 50, 90, 1e3); });
  row("stream slowdown p50 / p90 (beside / alone)", [&](const Column& c) {
    return c.stream.beside_gaps_s.empty() ? std::string("-") : fmt("%.2f / %.2f", slowdown_at(c, 50), slowdown_at(c, 90));
  });
  row("stream tokens alone / beside", [&](const Column& c) {
    return fmt("%.0f / %.0f", double(c.stream.alone_gaps_s.size()), double(c.stream.beside_gaps_s.size())) +
           (c.stream.stream_ended_early ? " (ended)" : "");
  });
  row("long prompt TTFT beside the stream, s", [&](const Column& c) {
    return fmt("%.3f (%.0f tok/s)", c.stream.long_ttft_s, so.long_tokens / c.stream.long_ttft_s);
  });
  row("capped prefill steps / preemptions (stream)", [&](const Column& c) {
    return fmt("%.0f / %.0f", double(c.stream_prefill_caps), double(c.stream_preemptions));
  });
  std::printf("step times: a chat's TTFT in seconds over the mean step time during that chat's life\n");
  std::printf("stream: a request decoding before the long prompt arrives; its client-side time per token alone "
              "(%d gaps) and while the long prompt is prefilled beside it\n", so.stream_alone_gaps);
  std::printf("goal: chat TTFT <= 3 step times while the long prefill runs; the long prefill within 25%% of alone; "
              "the stream's slowdown p50 <= 2 (issue 41)\n");

  if (f.Has("json")) {
    auto number = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
    auto pct = [&](const std::vector<double>& v, double p) { return number(v.empty() ? std::nan("") : Percentile(v, p)); };
    nlohmann::json out = {{"scenario", "long-prompt-plus-chat"}, {"model", model}, {"world", world},
                          {"long_prompt_tokens", so.long_tokens}, {"chat_prompt_tokens", so.chat_tokens},
                          {"chat_max_tokens", so.chat_max_tokens}, {"chat_every_s", so.chat_every_s},
                          {"stream_alone_gaps", so.stream_alone_gaps}, {"columns", nlohmann::json::array()}};
    for (const auto& c : cols) {
      const auto& s = c.stream;
      out["columns"].push_back({
          {"label", c.label},
          {"long_prefill_token_threshold", c.threshold},
          {"max_decode_slowdown", c.slowdown},
          {"chats", c.ttft_s.size()},
          {"chat_ttft_steps_p50", pct(c.ttft_steps, 50)},
          {"chat_ttft_steps_p99", pct(c.ttft_steps, 99)},
          {"chat_ttft_s_p50", pct(c.ttft_s, 50)},
          {"chat_ttft_s_p99", pct(c.ttft_s, 99)},
          {"mean_step_s", c.step_s},
          {"chat_ttft_step_times_p50", pct(c.ttft_in_local_steps, 50)},
          {"chat_ttft_step_times_p99", pct(c.ttft_in_local_steps, 99)},
          {"long_prefill_alone_tok_s", number(c.alone_tok_s)},
          {"long_prefill_with_chats_tok_s", number(c.mixed_tok_s)},
          {"preemptions", c.preemptions},
          {"decode_stream",
           {{"alone_s_per_token_p50", pct(s.alone_gaps_s, 50)},
            {"alone_s_per_token_p90", pct(s.alone_gaps_s, 90)},
            {"beside_s_per_token_p50", pct(s.beside_gaps_s, 50)},
            {"beside_s_per_token_p90", pct(s.beside_gaps_s, 90)},
            {"slowdown_p50", number(slowdown_at(c, 50))},
            {"slowdown_p90", number(slowdown_at(c, 90))},
            {"tokens_alone", s.alone_gaps_s.size()},
            {"tokens_beside", s.beside_gaps_s.size()},
            {"ended_early", s.stream_ended_early},
            {"long_prompt_ttft_s", s.long_ttft_s},
            {"prefill_caps", c.stream_prefill_caps},
            {"preemptions", c.stream_preemptions}}},
      });
    }
    std::ofstream file(f.Get("json"));
    if (!(file << out.dump(2) << "\n")) throw std::runtime_error("--json " + f.Get("json") + ": cannot write");
    std::fprintf(stderr, "bench: wrote %s\n", f.Get("json").c_str());
  }
  return 0;
}

}  // namespace

int RunScenarioBench(const std::vector<std::string>& args) {
  auto known = kMeshFlags;
  known.insert({"scenario", "long-prompt-tokens", "chat-prompt-tokens", "chat-max-tokens", "chat-every-s", "json"});
  known.insert(kCoordinatorFlags.begin(), kCoordinatorFlags.end());
  Flags f(args, known);
  const std::string scenario = f.Require("scenario");  // (--coordinator is refused by ChooseBenchMode)
  if (scenario == "long-prompt-plus-chat") return RunLongPromptPlusChat(f);
  throw UsageError("--scenario: unknown scenario '" + scenario + "' (known: long-prompt-plus-chat)");
}

}  // namespace dsmesh
