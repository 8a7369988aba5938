// `dsmesh bench --device cpu|cuda[:N] --model DIR|synthetic:...`: decode steps of the model in this
// process (no mesh), ms/step and tok/s at each stream count and context, beside the step's floor
// (cli/perf/roofline.h) and measured / floor. Contexts are filled by prefill chunks first (--prefill-chunk,
// 512 tokens by default; the first stream's chunks timed: the prefill line, and for a long context the chunk
// rate at every tenth of it, so the per-chunk growth is visible); `--rows 4` times the verification shape (each stream 1 + 3 draft
// rows). On the CPU with a make-tiny model, `--contexts 64 --steps 64` is the tiny model's CPU decode speed
// (docs/cpu-forward.md). `--speculative-tokens K`
// makes every stream's state a speculating one (NewState(K): rings K rows longer, the MTP block's input
// history kept) whose steps propose no drafts: the step of a sequence whose drafts the draft policy
// withholds, to compare with the same bench at 0. `--timeline` (CUDA) traces --timeline-steps more steps with
// CUPTI and prints where their wall time goes on the device (cli/bench/timeline_trace.h).
#include "cli/bench/in_process_bench.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench/bench_clock.h"
#include "cli/bench/step_profile.h"
#include "cli/bench/synthetic_prompts.h"
#include "cli/bench/timeline_trace.h"
#include "cli/model_commands/load_model.h"
#include "cli/perf/roofline.h"
#include "common/flags.h"
#include "common/safetensors.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/kv_layout.h"
#include "model/model.h"
#include "model/testing/synthetic.h"

namespace dsmesh {
namespace {

// Prints the profiled steps per phase (the forward's Phase scopes) and the costliest ops, in ms per
// step; returns the same as JSON.
// `device_only` (the same steps with each op isolated behind a spin, OpProfiling::kDeviceOnly) adds each
// op's device time alone; beside the host's time inside its call (from the timeline pass: in the isolated
// pass the spins fill the launch queue and host calls block) they tell a launch-bound op from a slow one.
nlohmann::json PrintProfile(const OpProfile& profile, const OpProfile& device_only) {
  const std::vector<OpTiming>& ops = profile.ops;
  if (ops.empty() || profile.steps == 0) {
    std::printf("  profile: this backend does not time its ops (a CUDA device does)\n");
    return nlohmann::json::object();
  }
  std::map<std::string, std::pair<double, int64_t>> phases;
  const double steps = static_cast<double>(profile.steps);
  const double total = profile.step_ms / steps, between = profile.between_ms / steps;
  for (const OpTiming& t : ops) {
    const size_t cut = t.op.find(" / ");
    auto& p = phases[cut == std::string::npos ? "(no phase)" : t.op.substr(0, cut)];
    p.first += t.ms / steps;
    p.second += t.calls;
  }
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> sorted(phases.begin(), phases.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::printf("  profile (eager, device events, %lld steps): %.3f ms/step on the device timeline\n",
              static_cast<long long>(profile.steps), total);
  std::printf("  %-50s %10s %8s %12s\n", "phase", "ms/step", "%", "ops/step");
  nlohmann::json j = {{"step_ms", total}, {"between_ops_ms", between}};
  for (const auto& [name, v] : sorted) {
    std::printf("  %-50s %10.3f %7.1f%% %12.1f\n", name.c_str(), v.first, 100 * v.first / total, v.second / steps);
    j["phases"].push_back({{"phase", name}, {"ms", v.first}, {"ops_per_step", v.second / steps}});
  }
  std::printf("  %-50s %10.3f %7.1f%%\n", "(host gaps between ops)", between, 100 * between / total);
  std::map<std::string, const OpTiming*> alone;
  for (const OpTiming& t : device_only.ops) alone[t.op] = &t;
  std::printf("  costliest ops (timeline, with the host's time inside the call; and from a second pass with each op "
              "isolated, its device time alone):\n");
  std::printf("  %-78s %12s %7s %10s %10s %10s\n", "op", "ms/step", "calls", "us/call", "device us", "host us");
  int shown = 0;
  for (const OpTiming& t : ops) {
    const auto a = alone.find(t.op);
    const double dev_us = a != alone.end() && a->second->calls ? 1e3 * a->second->ms / a->second->calls : -1;
    const double host_us = 1e3 * t.host_ms / t.calls;
    nlohmann::json o = {{"op", t.op}, {"ms", t.ms / steps}, {"calls_per_step", t.calls / steps},
                        {"host_us_per_call", host_us}};
    if (dev_us >= 0) o["device_us_per_call"] = dev_us;
    j["ops"].push_back(o);
    if (shown++ < 30)
      std::printf("  %-78s %9.3f ms %7.1f %10.1f %10.1f %10.1f\n", t.op.c_str(), t.ms / steps, t.calls / steps,
                  1e3 * t.ms / t.calls, dev_us, host_us);
  }
  double host = 0;
  for (const OpTiming& t : ops) host += t.host_ms;
  std::printf("  host time inside the calls: %.3f ms/step\n", host / steps);
  j["host_in_calls_ms"] = host / steps;
  if (!device_only.ops.empty()) {
    double dev = 0;
    for (const OpTiming& t : device_only.ops) dev += t.ms;
    const double dsteps = static_cast<double>(std::max<int64_t>(device_only.steps, 1));
    std::printf("  all ops, isolated: %.3f ms/step of device work\n", dev / dsteps);
    j["device_only_ms"] = dev / dsteps;
  }
  return j;
}

struct PrefillTiming {
  double seconds = 0, first_chunk_tok_s = 0, last_chunk_tok_s = 0;
  std::vector<std::pair<int64_t, double>> chunk_tok_s;  // (context before the chunk, tok/s) at every tenth
};

// What one sequence's state costs in each storage dtype (model/kv_layout.h), at the longest context.
void PrintKvCosts(const ModelConfig& c, int64_t context) {
  for (KvCacheDtype d : {KvCacheDtype::kF32, KvCacheDtype::kBf16, KvCacheDtype::kFp8}) {
    const KvLayout l = ComputeKvLayout(c, d);
    std::printf("# KV %-4s: %.0f B/token, %.1f MiB fixed per sequence; one sequence at %lld tokens: %.2f GiB, at "
                "380000: %.2f GiB (per rank at any TP size)%s\n",
                KvCacheDtypeName(d), l.BytesPerToken(), l.FixedBytesPerSequence() / 1048576.0,
                static_cast<long long>(context), l.SequenceBytes(context) / 1073741824.0,
                l.SequenceBytes(380000) / 1073741824.0, d == KvCacheDtype::kF32 ? " (as stored today)" : "");
  }
}

}  // namespace

int RunInProcessBench(const std::vector<std::string>& args) {
  Flags f(args, {"model", "device", "threads", "streams", "contexts", "rows", "steps", "bits", "json", "enforce-eager", "profile",
           "kv-cache-dtype", "speculative-tokens", "prefill-chunk", "timeline", "timeline-steps"},
          {"enforce-eager", "profile", "timeline"});
  const bool profile = f.Has("profile"), timeline = f.Has("timeline");
  const int timeline_steps = static_cast<int>(f.GetInt("timeline-steps", 4));
  if (timeline_steps < 1 || timeline_steps > 64) throw UsageError("--timeline-steps must be 1..64");
  if (f.Has("timeline-steps") && !timeline) throw UsageError("--timeline-steps goes with --timeline");
  const std::string source = f.Require("model");
  const std::vector<int32_t> streams = ParseIntList("streams", f.Get("streams", "1,4"), "stream count");
  const std::vector<int32_t> contexts = ParseIntList("contexts", f.Get("contexts", "4096"), "context length");
  const int rows = static_cast<int>(f.GetInt("rows", 1)), steps = static_cast<int>(f.GetInt("steps", 20));
  if (rows < 1 || steps < 1) throw UsageError("--rows and --steps must be >= 1");
  const int speculative = static_cast<int>(f.GetInt("speculative-tokens", 0));
  const long long chunk_flag = f.GetInt("prefill-chunk", 512);
  if (chunk_flag < 1 || chunk_flag > 65536) throw UsageError("--prefill-chunk must be 1..65536 tokens");
  const int64_t chunk_tokens = chunk_flag;
  if (speculative < 0) throw UsageError("--speculative-tokens must be >= 0");
  for (int32_t s : streams)
    if (s < 1) throw UsageError("--streams: counts must be >= 1");
  for (int32_t c : contexts)
    if (c < 1) throw UsageError("--contexts: lengths must be >= 1");
  // The floor needs the pack's bits: a synthetic source says them; for a directory --bits, else the reference
  // deployment's when it holds EXL3 tensors and bf16 everywhere when it holds none.
  Exl3BitsSpec bits;  // experts = dense = 0: every linear bf16
  if (f.Has("bits")) {
    bits = Exl3BitsSpec::Parse(f.Get("bits"));
  } else if (IsSyntheticSource(source)) {
    bits = ParseSyntheticSource(source).bits;
  } else {
    const Checkpoint ck = Checkpoint::Open(source);
    for (const std::string& name : ck.names())
      if (name.size() > 8 && name.compare(name.size() - 8, 8, ".trellis") == 0) {
        bits = Exl3BitsSpec::Parse("experts=2,dense=6");
        std::fprintf(stderr, "bench: %s holds EXL3 tensors; the floor assumes experts=2,dense=6 (--bits to say)\n",
                     source.c_str());
        break;
      }
  }
  std::fprintf(stderr, "bench: loading %s\n", source.c_str());  // on the device LoadForCli names
  auto model = LoadForCli(f);
  const ModelConfig& c = model->config();
  if (speculative > 0 && !model->has_mtp())
    throw UsageError("--speculative-tokens: " + source + " has no MTP block (make-tiny --mtp-layers 1 makes one)");
  if (speculative > model->state_pool().max_spare())
    throw UsageError("--speculative-tokens: at most " + std::to_string(model->state_pool().max_spare()) +
                     " (the rows the state pool keeps for rollback)");
  {
    // The state pool holds the largest shape's streams at the longest context (and the measured steps).
    const StatePool& probe = model->state_pool();
    // (the warm-up step, the timed steps, with --timeline its traced steps and their warm-up, and with
    // --profile the two profiled passes and the graph trace)
    const int64_t all_steps = 1 + (profile ? 3 : 1) * static_cast<int64_t>(steps) + (profile ? 4 : 0) +
                              (timeline ? timeline_steps + 1 : 0);
    // (with --profile also two profiled --prefill-chunk-token chunks after the steps)
    const int64_t max_ctx =
        *std::max_element(contexts.begin(), contexts.end()) + all_steps * rows + (profile ? 2 * chunk_tokens : 0);
    const int max_streams = *std::max_element(streams.begin(), streams.end());
    const int64_t blocks = (max_ctx + probe.block_tokens() - 1) / probe.block_tokens();
    StatePoolOptions po;
    po.kv_dtype = probe.kv_dtype();
    po.slots = max_streams;
    po.bytes = max_streams * (probe.slot_bytes() + blocks * probe.block_bytes()) + probe.block_bytes();
    std::fprintf(stderr, "bench: %s\n", model->ConfigureStatePool(po).Describe().c_str());
  }
  nlohmann::json out = nlohmann::json::array();
  std::printf("# %s on %s; floors from the H200 ceilings (kernels/cuda/testdata/anchors-h200.json: copy %.1f TB/s, "
              "LOP3 %.2f Tops/s), KV as the floor's f32\n",
              source.c_str(), model->backend().name().c_str(), RooflineCeilings{}.copy_bytes_per_s / 1e12,
              RooflineCeilings{}.int_ops_per_s / 1e12);
  std::printf("# weights: %s\n", model->WeightsDescription().c_str());
  if (speculative > 0)
    std::printf("# every stream speculates %d tokens (rollback rows, MTP input history) and proposes no drafts\n",
                speculative);
  PrintKvCosts(c, *std::max_element(contexts.begin(), contexts.end()));
  const std::string memory_before = model->backend().MemoryDescription();
  if (!memory_before.empty()) std::printf("# %s (weights and state pool)\n", memory_before.c_str());
  std::printf("%-8s %-5s %-8s %12s %10s %12s %12s %10s\n", "streams", "rows", "context", "ms/step", "tok/s",
              "floor ms", "(byte/op)", "x floor");
  for (int32_t ctx : contexts) {
    for (int32_t ns : streams) {
      // Each stream is filled by --prefill-chunk-token chunks; the first stream's chunks are timed (prefill
      // tok/s at context 0 and at the last chunk, and the whole prompt's time: its TTFT but for one step).
      std::vector<std::unique_ptr<SequenceState>> st;
      PrefillTiming prefill;
      for (int s = 0; s < ns; ++s) {
        st.push_back(model->NewState(speculative));
        const int64_t chunks = (ctx + chunk_tokens - 1) / chunk_tokens;
        const auto fill0 = BenchClock::now();
        for (int64_t pos = 0, n = 0; pos < ctx; pos += chunk_tokens, ++n) {
          std::vector<int32_t> chunk;
          for (int64_t i = pos; i < std::min<int64_t>(ctx, pos + chunk_tokens); ++i)
            chunk.push_back(TokenAtPosition(i + s, c.vocab_size));
          const auto t0 = BenchClock::now();
          model->Forward({{st.back().get(), chunk, false}});
          const double tok_s = chunk.size() / SecondsSince(t0);
          if (s == 0 && n == 0) prefill.first_chunk_tok_s = tok_s;
          if (s == 0 && n == chunks - 1) prefill.last_chunk_tok_s = tok_s;
          if (chunks >= 20 && (n + 1) % (chunks / 10) == 0) {
            std::fprintf(stderr, "bench: stream %d/%d: %lld/%d tokens\n", s + 1, ns,
                         static_cast<long long>(std::min<int64_t>(ctx, pos + chunk_tokens)), ctx);
            if (s == 0) prefill.chunk_tok_s.push_back({pos, tok_s});
          }
        }
        if (s == 0) prefill.seconds = SecondsSince(fill0);
        std::fprintf(stderr, "bench: stream %d/%d filled to %d tokens\n", s + 1, ns, ctx);
      }
      auto step = [&](int i) {
        std::vector<SequenceStep> batch;
        for (int s = 0; s < ns; ++s) {
          std::vector<int32_t> t;
          for (int r = 0; r < rows; ++r) t.push_back(TokenAtPosition(ctx + i * rows + r + s, c.vocab_size));
          batch.push_back({st[s].get(), t, false});
        }
        model->Forward(batch);
      };
      step(0);  // warm-up: first-call allocations and lazily built device parts
      const CudaStepHostTimes host0 = CudaBackendStats(model->backend()).host;
      const auto t0 = BenchClock::now();
      for (int i = 1; i <= steps; ++i) step(i);
      const double ms = SecondsSince(t0) * 1e3 / steps;
      const CudaStepHostTimes host1 = CudaBackendStats(model->backend()).host;
      DecodeStepShape shape;
      shape.streams = ns;
      shape.rows_per_stream = rows;
      shape.context = ctx;
      shape.kv = KvCacheDtype::kF32;  // what the forward stores today
      const DecodeStepFloor fl = ComputeDecodeStepFloor(c, bits, shape);
      const double tok_s = 1e3 * ns / ms;  // one new token per stream per step (drafts not counted)
      char fo[64];
      std::snprintf(fo, sizeof(fo), "%.3f/%.3f", fl.byte_floor_s * 1e3, fl.op_floor_s * 1e3);
      std::printf("%-8d %-5d %-8d %12.3f %10.1f %12.3f %12s %10.1f\n", ns, rows, ctx, ms, tok_s, fl.floor_s() * 1e3, fo,
                  ms / (fl.floor_s() * 1e3));
      std::fflush(stdout);
      nlohmann::json row = {{"streams", ns}, {"rows_per_stream", rows}, {"context", ctx}, {"ms_per_step", ms},
                            {"tok_per_s", tok_s}, {"floor_ms", fl.floor_s() * 1e3},
                            {"byte_floor_ms", fl.byte_floor_s * 1e3}, {"op_floor_ms", fl.op_floor_s * 1e3},
                            {"bytes_per_step", fl.bytes()}, {"backend", model->backend().name()}, {"model", source},
                            {"speculative_tokens", speculative}};
      if (host1.steps > host0.steps) {  // a CUDA backend: is the step host-bound?
        const double n = static_cast<double>(host1.steps - host0.steps) / steps;  // backend steps per step
        const double busy = (host1.busy_ms() - host0.busy_ms()) / steps;
        const double wait = (host1.sync_wait_ms - host0.sync_wait_ms) / steps;
        const double launch = (host1.graph_launch_ms - host0.graph_launch_ms) / steps;
        const double staging = (host1.stateful_ops_ms - host0.stateful_ops_ms) / steps;
        const double launches = static_cast<double>(host1.graph_launches - host0.graph_launches) / steps;
        // A launch blocks while the device's launch queue is full, so "in the calls" holds waiting for the
        // device too when the host runs ahead; `--profile` compares the step with its graphs' device time.
        std::printf("  host: %.3f ms/step in the step's calls (%.3f in %.0f graph launches, %.3f staging the stateful "
                    "segments' parameters, %.3f the rest; a launch blocks while the launch queue is full), %.3f ms/step "
                    "waiting in ToHost/FromHost\n",
                    busy, launch, launches, staging, busy - launch - staging, wait);
        row["host_busy_ms_per_step"] = busy;
        row["host_graph_launch_ms_per_step"] = launch;
        row["host_staging_ms_per_step"] = staging;
        row["host_wait_ms_per_step"] = wait;
        row["backend_steps_per_step"] = n;
      }
      if (ctx > 0) {
        std::printf("  prefill of %d tokens (%lld-token chunks, one stream): %.3f s, %.0f tok/s; chunk at context 0: "
                    "%.0f tok/s, last chunk (context %lld): %.0f tok/s\n",
                    ctx, static_cast<long long>(chunk_tokens), prefill.seconds, ctx / prefill.seconds,
                    prefill.first_chunk_tok_s, static_cast<long long>((ctx - 1) / chunk_tokens * chunk_tokens),
                    prefill.last_chunk_tok_s);
        if (!prefill.chunk_tok_s.empty()) {
          std::printf("  prefill chunk rate by context (tok/s):");
          nlohmann::json rates = nlohmann::json::array();
          for (const auto& [at, rate] : prefill.chunk_tok_s) {
            std::printf(" %lld: %.0f", static_cast<long long>(at), rate);
            rates.push_back({{"context", at}, {"tok_per_s", rate}});
          }
          std::printf("\n");
          row["prefill_chunk_tok_per_s_by_context"] = rates;
        }
        row["prefill_chunk_tokens"] = chunk_tokens;
        row["prefill_s"] = prefill.seconds;
        row["prefill_tok_per_s"] = ctx / prefill.seconds;
        row["prefill_first_chunk_tok_per_s"] = prefill.first_chunk_tok_s;
        row["prefill_last_chunk_tok_per_s"] = prefill.last_chunk_tok_s;
        std::fflush(stdout);  // a run cut off later (a device call's time limit) keeps this line
      }
      int extra = steps;  // the index of the last step run (it picks the step's tokens)
      if (timeline) {
        // More steps like the timed ones under a CUPTI timeline: where their wall time goes on the device.
        row["timeline"] = TraceStepTimeline(model->backend(), [&] { step(++extra); }, timeline_steps, ms);
        std::fflush(stdout);
      }
      if (profile) {
        // The same steps again, eager, every op timed by device events: where the step's time goes.
        model->backend().SetOpProfiling(OpProfiling::kTimeline);
        for (int i = 1; i <= steps; ++i) step(extra + i);
        const OpProfile prof = model->backend().TakeOpProfile();
        model->backend().SetOpProfiling(OpProfiling::kDeviceOnly);
        for (int i = 1; i <= steps; ++i) step(extra + steps + i);
        const OpProfile alone = model->backend().TakeOpProfile();
        model->backend().SetOpProfiling(OpProfiling::kOff);
        row["profile"] = PrintProfile(prof, alone);
        row["op_bytes"] = PrintOpBytes(alone);
        int trace_step = extra + 2 * steps;  // the graphs one step replays, and the chain alone (cli/bench/step_profile.h)
        row["step_graphs"] =
            PrintStepGraphs(TraceDecodeGraphs(model->backend(), [&] { step(++trace_step); }, 20), ms);
        if (ns == streams.front()) {
          // One --prefill-chunk-token chunk of stream 0 at this context, timed the same two ways.
          auto chunk = [&](int k) {
            std::vector<int32_t> t;
            for (int64_t i = 0; i < chunk_tokens; ++i) t.push_back(TokenAtPosition(ctx + 100000 * (k + 1) + i, c.vocab_size));
            model->Forward({{st[0].get(), t, false}});
          };
          std::printf("  one %lld-token prefill chunk of stream 0 after its context (ms per chunk):\n",
                      static_cast<long long>(chunk_tokens));
          model->backend().SetOpProfiling(OpProfiling::kTimeline);
          chunk(0);
          const OpProfile chunk_prof = model->backend().TakeOpProfile();
          model->backend().SetOpProfiling(OpProfiling::kDeviceOnly);
          chunk(1);
          const OpProfile chunk_alone = model->backend().TakeOpProfile();
          model->backend().SetOpProfiling(OpProfiling::kOff);
          row["prefill_chunk_profile"] = PrintProfile(chunk_prof, chunk_alone);
          row["prefill_chunk_op_bytes"] = PrintOpBytes(chunk_alone);
        }
      }
      out.push_back(row);
    }
  }
  const std::string memory_after = model->backend().MemoryDescription();
  if (!memory_after.empty()) std::printf("# %s (after the run: + scratch arena, workspaces, graphs)\n", memory_after.c_str());
  if (f.Has("json")) {
    std::ofstream(f.Get("json")) << out.dump(2) << "\n";
    std::fprintf(stderr, "bench: wrote %s\n", f.Get("json").c_str());
  }
  return 0;
}

}  // namespace dsmesh
