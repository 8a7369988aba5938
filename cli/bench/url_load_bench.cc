// `dsmesh bench --url U --clients N`: a load run. N client threads send streaming chat requests (each a
// distinct prompt of --prompt-words words, --max-tokens with ignore_eos so every answer has that length)
// until --requests have been sent; a 429 is counted, not retried. Reports TTFT, inter-token latency (the
// gaps between output events, as vLLM's benchmark_serving) and time per output token, p50/p99, output
// throughput, and checks the usage sums against the gateway's counters. With --long-prompt-bytes B,
// --long-prompts K requests carrying a B-byte prompt are sent once the streams run, and the longest
// gap of the other streams while those were in flight is reported beside the gaps outside (the stall a
// long tokenization causes).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/bench/bench_clock.h"
#include "cli/bench/openai_endpoint.h"
#include "cli/bench/percentile.h"
#include "cli/bench/synthetic_prompts.h"
#include "cli/bench/url_bench.h"
#include "common/flags.h"
#include "common/http_client.h"

namespace dsmesh {
namespace {

using json = nlohmann::json;

// Seconds as milliseconds with one decimal; "-" for NaN (the percentile of no values).
std::string Ms(double s) {
  char buf[32];
  if (std::isnan(s)) return "-";
  std::snprintf(buf, sizeof(buf), "%.1f", s * 1e3);
  return buf;
}

}  // namespace

int RunUrlLoadBench(const std::vector<std::string>& args) {
  const Flags flags = ParseUrlBenchFlags(args);
  const HttpEndpoint endpoint = EndpointFromFlags(flags);
  const int clients = static_cast<int>(flags.GetInt("clients", 64));
  const int requests = static_cast<int>(flags.GetInt("requests", clients));
  const int max_tokens = static_cast<int>(flags.GetInt("max-tokens", 64));
  const int words = static_cast<int>(flags.GetInt("prompt-words", 32));
  const long long long_bytes = flags.GetInt("long-prompt-bytes", 0);
  const int long_count = static_cast<int>(flags.GetInt("long-prompts", long_bytes > 0 ? 1 : 0));
  const int timeout_s = static_cast<int>(flags.GetInt("timeout-s", 600));
  if (clients < 1 || clients > 4096) throw UsageError("--clients must be in 1..4096");
  if (requests < 1 || max_tokens < 1 || words < 1 || timeout_s < 1)
    throw UsageError("--requests, --max-tokens, --prompt-words and --timeout-s must be >= 1");
  if (long_bytes < 0 || long_count < 0) throw UsageError("--long-prompt-bytes and --long-prompts must be >= 0");
  const bool thinking = flags.GetBool("thinking", false);
  const std::string api_key = ApiKeyFromFlags(flags);
  const std::string model = ServedModel(flags, endpoint, api_key);

  auto body_for = [&](int i) {
    return json{{"model", model},
                {"messages", json::array({{{"role", "user"}, {"content", NumberedWordPrompt(i, words)}}})},
                {"max_tokens", max_tokens},
                {"temperature", 0},
                {"ignore_eos", true},
                {"stream", true},
                {"stream_options", {{"include_usage", true}}},
                {"chat_template_kwargs", {{"thinking", thinking}}}}
        .dump();
  };
  std::printf("dsmesh bench (load): %s model %s, %d clients, %d requests, %d-word prompts, max_tokens %d "
              "(ignore_eos), streaming\n",
              flags.Get("url").c_str(), model.c_str(), clients, requests, words, max_tokens);
  std::fflush(stdout);

  const auto before = ReadMetrics(endpoint);
  std::vector<StreamResult> results(requests);
  std::atomic<int> next{0}, first_tokens{0};
  const auto t0 = BenchClock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&] {
      for (int i = next++; i < requests; i = next++) {
        results[i] = RunStream(endpoint, body_for(i), api_key, t0, "/v1/chat/completions", timeout_s);
        if (results[i].ttft_s >= 0) ++first_tokens;
      }
    });
  // Long prompts, once the streams produce output (or after 2 s): completions with max_tokens 1.
  std::vector<StreamResult> longs(long_count);
  std::vector<std::thread> long_threads;
  std::string long_body;  // outlives the threads that send it
  if (long_count > 0) {
    while (first_tokens.load() < std::min(clients, requests) / 2 && SecondsSince(t0) < 2)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    long_body = json{{"model", model}, {"prompt", FillerText(long_bytes)}, {"max_tokens", 1}, {"stream", true}}.dump();
    for (int k = 0; k < long_count; ++k)
      long_threads.emplace_back(
          [&, k] { longs[k] = RunStream(endpoint, long_body, api_key, t0, "/v1/completions", timeout_s); });
  }
  for (auto& t : threads) t.join();
  for (auto& t : long_threads) t.join();
  const double wall = SecondsSince(t0);
  const auto after = ReadMetrics(endpoint);

  int ok = 0, rejected = 0, errors = 0;
  long long tokens = 0, prompt_tokens = 0;
  std::vector<double> ttft, itl, tpot, e2e;
  for (const auto& r : results) {
    if (r.status == 429) {
      ++rejected;
      continue;
    }
    if (!r.error.empty() || r.ttft_s < 0) {
      if (++errors <= 5) std::fprintf(stderr, "dsmesh bench: request failed: %s\n", r.error.substr(0, 300).c_str());
      continue;
    }
    ++ok;
    tokens += r.tokens;
    prompt_tokens += r.prompt_tokens;
    ttft.push_back(r.ttft_s - r.start_s);
    e2e.push_back(r.end_s - r.start_s);
    if (r.tokens > 1) tpot.push_back((r.end_s - r.ttft_s) / (r.tokens - 1));  // as vLLM: (e2e - TTFT) / (n - 1)
    for (size_t k = 1; k < r.chunk_s.size(); ++k) itl.push_back(r.chunk_s[k] - r.chunk_s[k - 1]);
  }
  std::printf("%-22s %10s %10s\n", "", "p50 ms", "p99 ms");
  std::printf("%-22s %10s %10s\n", "TTFT", Ms(Percentile(ttft, 50)).c_str(), Ms(Percentile(ttft, 99)).c_str());
  std::printf("%-22s %10s %10s\n", "inter-token latency", Ms(Percentile(itl, 50)).c_str(), Ms(Percentile(itl, 99)).c_str());
  std::printf("%-22s %10s %10s\n", "time per output token", Ms(Percentile(tpot, 50)).c_str(),
              Ms(Percentile(tpot, 99)).c_str());
  std::printf("%-22s %10s %10s\n", "end to end", Ms(Percentile(e2e, 50)).c_str(), Ms(Percentile(e2e, 99)).c_str());
  std::printf("completed %d, 429 %d, errors %d of %d requests in %.2f s; output %.1f tok/s, %.2f req/s\n", ok,
              rejected, errors, requests, wall, tokens / wall, ok / wall);
  json report = {{"clients", clients},
                 {"requests", requests},
                 {"max_tokens", max_tokens},
                 {"completed", ok},
                 {"rejected_429", rejected},
                 {"errors", errors},
                 {"wall_s", wall},
                 {"output_tokens", tokens},
                 {"prompt_tokens", prompt_tokens},
                 {"output_tok_s", tokens / wall},
                 {"ttft_ms", {{"p50", Percentile(ttft, 50) * 1e3}, {"p99", Percentile(ttft, 99) * 1e3}}},
                 {"itl_ms", {{"p50", Percentile(itl, 50) * 1e3}, {"p99", Percentile(itl, 99) * 1e3}}},
                 {"tpot_ms", {{"p50", Percentile(tpot, 50) * 1e3}, {"p99", Percentile(tpot, 99) * 1e3}}}};
  // Usage against the gateway's own counters (only meaningful when nothing else used the gateway).
  if (!before.empty() && !after.empty()) {
    auto delta = [&](const char* name) { return MetricValue(after, name) - MetricValue(before, name); };
    const double gen = delta("vllm:generation_tokens_total"), rej = delta("dsmesh_requests_rejected_total");
    std::printf("gateway counters: generation tokens +%.0f (usage says %lld), rejected +%.0f (429s seen %d)\n", gen,
                tokens, rej, rejected);
    report["counter_generation_tokens"] = gen;
    report["counter_rejected"] = rej;
  }
  if (long_count > 0) {
    double long_from = 1e300, long_to = 0;
    int long_ok = 0;
    std::vector<double> long_latency;
    for (const auto& r : longs) {
      long_from = std::min(long_from, r.start_s);
      long_to = std::max(long_to, r.end_s);
      long_latency.push_back(r.end_s - r.start_s);
      if (r.status == 200 || r.status == 400) ++long_ok;  // 400: over the context, after tokenizing
      else std::fprintf(stderr, "dsmesh bench: long prompt: HTTP %d %s\n", r.status, r.error.substr(0, 200).c_str());
    }
    // Gaps of the other streams that overlap the window, and the gaps wholly outside it.
    double worst_in = 0;
    std::vector<double> outside;
    for (const auto& r : results)
      for (size_t k = 1; k < r.chunk_s.size(); ++k) {
        double a = r.chunk_s[k - 1], b = r.chunk_s[k];
        if (b >= long_from && a <= long_to) worst_in = std::max(worst_in, b - a);
        else outside.push_back(b - a);
      }
    std::printf("long prompts: %d x %lld bytes, answered %d (200 or 400) in %s ms (max); longest gap of the other "
                "streams meanwhile %s ms, outside p99 %s ms / max %s ms\n",
                long_count, long_bytes, long_ok, Ms(Percentile(long_latency, 100)).c_str(), Ms(worst_in).c_str(),
                Ms(Percentile(outside, 99)).c_str(), Ms(Percentile(outside, 100)).c_str());
    report["long_prompts"] = {{"count", long_count},
                              {"bytes", long_bytes},
                              {"answered", long_ok},
                              {"latency_max_ms", Percentile(long_latency, 100) * 1e3},
                              {"stream_gap_during_ms", worst_in * 1e3},
                              {"stream_gap_outside_p99_ms", Percentile(outside, 99) * 1e3},
                              {"stream_gap_outside_max_ms", Percentile(outside, 100) * 1e3}};
  }
  std::fflush(stdout);
  if (flags.Has("json")) {
    FILE* f = std::fopen(flags.Get("json").c_str(), "w");
    if (!f) throw std::runtime_error("--json " + flags.Get("json") + ": cannot write");
    std::string text = report.dump(2);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  return errors > 0 ? 1 : 0;
}

}  // namespace dsmesh
