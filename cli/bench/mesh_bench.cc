// `dsmesh bench --coordinator HOST:PORT | --world N [...]`: the mesh's per-step time split at each stream
// count (default 1 and 4): `streams` concurrent greedy requests of random token ids, timed by the client,
// with the coordinator's Stats counters read around the window (rank 0's step split, collectives,
// speculation). With --speculative-config (and --world) speculation on and off in one run, with
// --draft-acceptance at simulated acceptance (coordinator/simulated_acceptance.h).
#include "cli/bench/mesh_bench.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench/bench_clock.h"
#include "cli/bench/percentile.h"
#include "cli/bench/synthetic_prompts.h"
#include "cli/mesh_commands.h"
#include "common/flags.h"
#include "common/mesh/mesh_client.h"
#include "coordinator/simulated_acceptance.h"
#include "coordinator/speculative_config.h"
#include "kernels/cuda/device_choice.h"

namespace dsmesh {
namespace {

// One measurement: `streams` concurrent greedy requests; the coordinator's step split and speculation
// counters over the window.
struct BenchFigures {
  int streams = 0, world = 0;
  size_t tokens = 0;
  double wall_s = 0, steps = 0, step_us = 0;
  // The step split (rank 0, us per step) and collectives per step.
  double send_us = 0, forward_us = 0, collectives_us = 0, sample_us = 0, return_us = 0, schedule_us = 0, calls = 0;
  // Speculation (vLLM's meanings): verification steps with drafts, accepted drafts, per position.
  int64_t drafts = 0, accepted = 0;
  std::vector<int64_t> accepted_per_pos;
  std::map<std::string, int64_t> decisions;  // the draft policy's (coordinator/draft_policy.h)
  double draft_passes = 0, draft_us = 0;      // MTP draft passes per step and their time (part of sampling)
  double tok_s() const { return tokens / wall_s; }
  double mean_accepted_length() const { return drafts > 0 ? 1.0 + double(accepted) / drafts : 1.0; }
  std::vector<double> acceptance_per_position() const {
    std::vector<double> v;
    for (int64_t n : accepted_per_pos) v.push_back(drafts > 0 ? double(n) / drafts : 0.0);
    return v;
  }
};

BenchFigures BenchStreams(MeshClient& client, const std::string& address, int streams, int prompt_tokens,
                          int max_tokens) {
  StatsResponse before = client.Stats();
  std::vector<GenerateResult> results(streams);
  std::vector<std::string> errors(streams);
  const auto t0 = BenchClock::now();
  std::vector<std::thread> threads;
  for (int s = 0; s < streams; ++s)
    threads.emplace_back([&, s] {
      try {
        MeshClient c(address, client.credentials());
        GenerateRequest req;
        req.set_request_id("bench-" + std::to_string(s));
        for (int32_t t : RandomTokenIds(prompt_tokens, s + 1)) req.add_prompt_token_ids(t);
        req.mutable_sampling()->set_temperature(0);
        req.mutable_sampling()->set_max_tokens(max_tokens);
        req.mutable_sampling()->set_ignore_eos(true);
        results[s] = c.Generate(req);
      } catch (const std::exception& e) {
        errors[s] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  const double wall = SecondsSince(t0);
  for (size_t s = 0; s < results.size(); ++s) {
    if (!errors[s].empty()) throw std::runtime_error("bench request failed: " + errors[s]);
    if (!results[s].error.empty()) throw std::runtime_error("bench request failed: " + results[s].error);
  }
  StatsResponse after = client.Stats();
  const double steps = double(after.steps() - before.steps());
  if (steps <= 0) throw std::runtime_error("bench: the coordinator counted no steps");
  auto per_step_us = [&](double a, double b) { return (a - b) / steps * 1e6; };
  const double step = per_step_us(after.step_wall_seconds_sum(), before.step_wall_seconds_sum());
  const double send = per_step_us(after.plan_send_seconds_sum(), before.plan_send_seconds_sum());
  const double fwd = per_step_us(after.forward_seconds_sum(), before.forward_seconds_sum());
  const double coll = per_step_us(after.collective_seconds_sum(), before.collective_seconds_sum());
  const double samp = per_step_us(after.sample_seconds_sum(), before.sample_seconds_sum());
  const double ret = per_step_us(after.result_return_seconds_sum(), before.result_return_seconds_sum());
  const double sched = per_step_us(after.schedule_seconds_sum(), before.schedule_seconds_sum());
  BenchFigures b;
  b.streams = streams;
  b.world = after.world();
  for (const auto& r : results) b.tokens += r.tokens.size();
  b.wall_s = wall;
  b.steps = steps;
  b.step_us = step;
  b.drafts = after.spec_decode_num_drafts() - before.spec_decode_num_drafts();
  b.accepted = after.spec_decode_num_accepted_tokens() - before.spec_decode_num_accepted_tokens();
  for (int p = 0; p < after.spec_decode_num_accepted_tokens_per_pos_size(); ++p)
    b.accepted_per_pos.push_back(after.spec_decode_num_accepted_tokens_per_pos(p) -
                                 (p < before.spec_decode_num_accepted_tokens_per_pos_size()
                                      ? before.spec_decode_num_accepted_tokens_per_pos(p) : 0));
  for (const auto& [d, n] : after.spec_decode_draft_decisions()) {
    const auto it = before.spec_decode_draft_decisions().find(d);
    b.decisions[d] = n - (it == before.spec_decode_draft_decisions().end() ? 0 : it->second);
  }
  b.send_us = send;
  b.forward_us = fwd;
  b.collectives_us = coll;
  b.sample_us = samp;
  b.return_us = ret;
  b.schedule_us = sched;
  b.calls = double(after.collective_calls() - before.collective_calls()) / steps;
  b.draft_passes = double(after.spec_decode_draft_passes() - before.spec_decode_draft_passes()) / steps;
  b.draft_us = per_step_us(after.spec_decode_draft_seconds_sum(), before.spec_decode_draft_seconds_sum());
  return b;
}

void PrintFigures(const BenchFigures& b) {
  const double step = b.step_us, send = b.send_us, fwd = b.forward_us, coll = b.collectives_us, samp = b.sample_us,
               ret = b.return_us, sched = b.schedule_us, calls = b.calls, steps = b.steps, wall = b.wall_s;
  const int streams = b.streams;
  const int world = b.world;
  const double control = step - fwd - coll - samp;
  std::printf("streams %d: %zu tokens in %.2f s (%.1f tokens/s), %.0f steps, %.2f ms per step, world %d\n", streams,
              b.tokens, wall, b.tok_s(), steps, step / 1e3, world);
  std::printf("  per step (rank 0), us: wall %.0f = plan send %.0f + forward %.0f + collectives %.0f + sampling %.0f "
              "+ result return %.0f + other %.0f; coordinator scheduling %.0f (outside the wall)\n",
              step, send, fwd, coll, samp, ret, step - send - fwd - coll - samp - ret, sched);
  if (calls > 0)
    std::printf("  collectives: %.1f calls per step, %.0f us each on average (waiting for the slowest rank included)\n",
                calls, coll / calls);
  std::printf("  control-plane overhead per step: %.0f us (wall - forward - collectives - sampling), %.1f%% of the step\n",
              control, 100.0 * control / step);
  if (!b.accepted_per_pos.empty()) {
    std::printf("  speculation: mean accepted length %.3f (1 + accepted drafts per verification step, over %lld "
                "verification steps), acceptance per position",
                b.mean_accepted_length(), static_cast<long long>(b.drafts));
    for (double a : b.acceptance_per_position()) std::printf(" %.3f", a);
    std::printf("; %.2f tokens per step per stream; draft policy:", b.tokens / steps / streams);
    for (const auto& [d, n] : b.decisions) std::printf(" %s %lld", d.c_str(), static_cast<long long>(n));
    std::printf("\n");
    std::printf("  drafting (part of sampling): %.0f us per step, %.2f draft passes per step, %.0f us per pass; "
                "forward (verification) %.0f us per step\n",
                b.draft_us, b.draft_passes, b.draft_passes > 0 ? b.draft_us / b.draft_passes : 0.0, fwd);
  }
  std::fflush(stdout);
}

nlohmann::json BenchJson(const BenchFigures& b, const std::string& speculation, int drafts, const std::string& acceptance,
                         const std::vector<double>& rates) {
  nlohmann::json j = {{"streams", b.streams}, {"world", b.world}, {"speculation", speculation},
                      {"num_speculative_tokens", drafts}, {"tokens", b.tokens}, {"seconds", b.wall_s},
                      {"tok_per_s", b.tok_s()}, {"steps", b.steps}, {"ms_per_step", b.step_us / 1e3},
                      {"tokens_per_step_per_stream", b.tokens / b.steps / b.streams},
                      {"mean_accepted_length", b.mean_accepted_length()},
                      {"acceptance_per_position", b.acceptance_per_position()},
                      {"verification_steps", b.drafts}, {"draft_decisions", b.decisions},
                      {"draft_passes_per_step", b.draft_passes}, {"draft_ms_per_step", b.draft_us / 1e3},
                      {"forward_ms_per_step", b.forward_us / 1e3}};
  if (!acceptance.empty()) j["acceptance"] = acceptance;
  if (!rates.empty()) j["simulated_rates"] = rates;
  return j;
}

}  // namespace

int RunMeshBench(const std::vector<std::string>& args) {
  auto known = kMeshFlags;
  known.insert({"streams", "prompt-tokens", "max-tokens", "draft-acceptance", "json", "repeat"});
  known.insert(kCoordinatorFlags.begin(), kCoordinatorFlags.end());
  Flags f(args, known, {"enforce-eager"});
  const int prompt_tokens = static_cast<int>(f.GetInt("prompt-tokens", 32));
  const int max_tokens = static_cast<int>(f.GetInt("max-tokens", 64));
  if (prompt_tokens < 1 || max_tokens < 1) throw UsageError("--prompt-tokens and --max-tokens must be >= 1");
  std::vector<int> streams;
  for (const auto& s : ParseIntList("streams", f.Get("streams", "1,4"), "integer stream count")) {
    if (s < 1) throw UsageError("--streams: counts must be >= 1");
    streams.push_back(s);
  }
  // With --speculative-config the bench starts the mesh twice, speculation on and off, and runs every
  // stream count on both: the comparison comes from one call.
  const bool speculation = f.Has("speculative-config");
  const int drafts = speculation ? ParseSpeculativeConfig(f.Get("speculative-config")).num_speculative_tokens : 0;
  std::vector<double> rates;
  if (f.Has("draft-acceptance")) {
    if (!speculation) throw UsageError("--draft-acceptance needs --speculative-config (the drafts to accept)");
    try {
      rates = ParseDraftAcceptance(f.Get("draft-acceptance"), drafts, "--draft-acceptance");
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }
  if (speculation && f.Has("coordinator"))
    throw UsageError("--speculative-config: the bench starts the mesh with and without speculation; give --world N "
                     "instead of --coordinator (a running mesh's speculation is fixed at its start)");
  const std::string acceptance = rates.empty() ? (speculation ? "verified" : "") : "simulated acceptance";
  const std::string policy = f.Get("draft-policy", "adaptive");
  if (speculation) {
    std::printf("# speculation: mtp, %d drafts per step, draft policy %s, ", drafts, policy.c_str());
    if (rates.empty()) {
      std::printf("acceptance as verified (the model's own MTP head)\n");
    } else {
      std::printf("SIMULATED ACCEPTANCE %s (bench only: draft position i passes in that fraction of verification "
                  "steps, by a seeded generator, emitting the target's own token; drafting, verification, rollback "
                  "and bookkeeping run as in serving; 1 + sum of the rates = %.3f)\n",
                  f.Get("draft-acceptance").c_str(), 1 + std::accumulate(rates.begin(), rates.end(), 0.0));
    }
  }
  const int repeat = static_cast<int>(f.GetInt("repeat", 1));
  if (repeat < 1) throw UsageError("--repeat must be >= 1");
  struct Shape {
    std::string label;
    BenchFigures figures;  // the fastest run
    double median_tok_s;   // the median run's tok/s
  };
  std::vector<Shape> shapes;
  nlohmann::json out = nlohmann::json::array();
  // On the CPU both meshes run side by side (the idle one waits on its queue), and with --repeat N each shape
  // runs N times alternating between them: the fastest run of each is kept, so a load spike from elsewhere on
  // the machine hits neither shape alone (every run's tok/s is printed too, for the spread). On a GPU the
  // two meshes' weights and KV pools do not fit beside each other (each worker sizes its pool to the
  // device's free memory), so each mesh runs all its shapes and is stopped before the other starts.
  const std::vector<bool> modes = speculation ? std::vector<bool>{true, false} : std::vector<bool>{false};
  const bool one_at_a_time = !f.Has("coordinator") && ChooseDevice(f).cuda() && modes.size() > 1;
  auto connect = [&](bool on) {
    return ConnectMesh(f, [&](LocalMeshOptions& o) {
      if (!on) {  // the same mesh without --speculative-config
        auto& a = o.coordinator_args;
        for (size_t i = 0; i + 1 < a.size();)
          if (a[i] == "--speculative-config") a.erase(a.begin() + i, a.begin() + i + 2);
          else i += 2;
      } else if (!rates.empty()) {
        o.bench_draft_acceptance = f.Get("draft-acceptance");
      }
    });
  };
  std::vector<MeshTarget> targets(modes.size());
  if (one_at_a_time)
    std::printf("# on a GPU: the mesh with speculation runs all shapes, then the mesh without (one at a time)\n");
  else
    for (size_t m = 0; m < modes.size(); ++m) targets[m] = connect(modes[m]);
  // best[s][m], runs[s][m]: per stream count and mode, the fastest run and every run's tok/s.
  std::vector<std::vector<BenchFigures>> best(streams.size(), std::vector<BenchFigures>(modes.size()));
  std::vector<std::vector<std::vector<double>>> runs(streams.size(), std::vector<std::vector<double>>(modes.size()));
  auto run_once = [&](size_t si, size_t m, int rep) {
    MeshTarget& t = targets[m];
    const std::string address = t.local ? t.local->coordinator_address() : f.Get("coordinator");
    BenchFigures b = BenchStreams(*t.client, address, streams[si], prompt_tokens, max_tokens);
    runs[si][m].push_back(b.tok_s());
    if (repeat > 1)
      std::printf("#   run %d/%d, streams %d%s: %.1f tok/s, %.3f ms per step, forward %.0f us per step\n", rep + 1,
                  repeat, streams[si], speculation ? (modes[m] ? ", speculation on" : ", speculation off") : "",
                  b.tok_s(), b.step_us / 1e3, b.forward_us);
    if (rep == 0 || b.tok_s() > best[si][m].tok_s()) best[si][m] = b;
  };
  if (one_at_a_time) {
    for (size_t m = 0; m < modes.size(); ++m) {
      targets[m] = connect(modes[m]);
      for (size_t si = 0; si < streams.size(); ++si)
        for (int rep = 0; rep < repeat; ++rep) run_once(si, m, rep);
      targets[m] = MeshTarget{};  // stops the local mesh: its GPU memory is free for the next
    }
  } else {
    for (size_t si = 0; si < streams.size(); ++si)
      for (int rep = 0; rep < repeat; ++rep)
        for (size_t i = 0; i < modes.size(); ++i)
          // Which mode goes first swaps every repeat (on off, off on, ...): whatever the run just before
          // leaves behind (caches, the other mesh settling) falls on both alike.
          run_once(si, rep % 2 == 0 ? i : modes.size() - 1 - i, rep);
  }
  for (size_t si = 0; si < streams.size(); ++si) {
    for (size_t m = 0; m < modes.size(); ++m) {
      const bool on = modes[m];
      const BenchFigures& b = best[si][m];
      if (speculation)
        std::printf("# speculation %s%s%s\n", on ? "on" : "off", on && !rates.empty() ? " (simulated acceptance)" : "",
                    repeat > 1 ? (", fastest of " + std::to_string(repeat) + " runs").c_str() : "");
      PrintFigures(b);
      const std::string label = !speculation ? "" : on ? (rates.empty() ? "mtp" : "mtp, simulated acceptance") : "off";
      out.push_back(BenchJson(b, speculation ? (on ? "mtp" : "off") : "off", on ? drafts : 0, on ? acceptance : "",
                              on ? rates : std::vector<double>{}));
      out.back()["runs"] = repeat;
      out.back()["tok_per_s_runs"] = runs[si][m];
      out.back()["tok_per_s_median"] = Median(runs[si][m]);
      if (on) out.back()["draft_policy"] = policy;
      shapes.push_back({label, b, Median(runs[si][m])});
    }
  }
  if (speculation) {
    std::printf("# %-8s %-28s %10s %10s %14s  %s\n", "streams", "speculation", "tok/s", "ms/step", "accepted len",
                "acceptance per position");
    for (const Shape& sh : shapes) {
      std::printf("  %-8d %-28s %10.1f %10.2f %14.3f ", sh.figures.streams, sh.label.c_str(), sh.figures.tok_s(),
                  sh.figures.step_us / 1e3, sh.figures.mean_accepted_length());
      for (double a : sh.figures.acceptance_per_position()) std::printf(" %.3f", a);
      std::printf("\n");
    }
    for (int s : streams) {
      const Shape *on = nullptr, *off = nullptr;
      for (const Shape& sh : shapes)
        if (sh.figures.streams == s) (sh.label == "off" ? off : on) = &sh;
      if (!on || !off) continue;
      std::printf("  streams %d: speculation on / off = %.3f (tok/s)", s, on->figures.tok_s() / off->figures.tok_s());
      if (repeat > 1)
        std::printf(" fastest runs, %.3f median runs (%.1f / %.1f)", on->median_tok_s / off->median_tok_s,
                    on->median_tok_s, off->median_tok_s);
      std::printf("\n");
    }
  }
  if (f.Has("json")) {
    std::ofstream(f.Get("json")) << out.dump(2) << "\n";
    std::fprintf(stderr, "bench: wrote %s\n", f.Get("json").c_str());
  }
  return 0;
}

}  // namespace dsmesh
