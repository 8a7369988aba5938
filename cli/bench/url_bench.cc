// `dsmesh bench --url http://HOST:PORT`: the reference deployment's serving benchmark against any OpenAI
// endpoint (docs/reference-deployment.md section 5): three chat prompts (en / ja / code), run with 1 and
// 4 concurrent streams on the same prompt, temperature 0, streaming with include_usage.
//   tokens     = usage.completion_tokens (never chunk counts: speculative decoding sends several
//                tokens per chunk)
//   TTFT       = request sent -> first content or reasoning delta (max over streams)
//   decode     = tokens / (wall - TTFT) per stream; aggregate = sum of tokens / wall of the run
//   acceptance = 1 + d(accepted) / d(drafts) from /metrics vllm:spec_decode_* counters around the run
// The reference deployment's figures (vLLM, 8 x RTX PRO 2000, n=3 speculation) are printed beside as the
// anchor.
#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli/bench/bench_clock.h"
#include "cli/bench/openai_endpoint.h"
#include "cli/bench/url_bench.h"
#include "common/flags.h"
#include "common/http_client.h"

namespace dsmesh {
namespace {

using json = nlohmann::json;

struct Prompt {
  const char* name;
  const char* text;
  double seat_1, seat_4;  // reference deployment tok/s (1 stream per-stream decode, 4 streams aggregate), n=3
};

const Prompt kPrompts[] = {
    {"en", "Explain in detail how a transformer language model generates text, step by step.", 62, 136},
    {"ja", "日本の四季の特徴と、それぞれの季節の代表的な行事や食べ物について詳しく説明してください。", 55, 116},
    {"code", "Write a Python LRU cache class with O(1) get and put, with docstrings and a unit test.", 86, 186},
};

struct SpecCounters {
  double drafts = 0, accepted = 0;
  bool present = false;  // the endpoint exports the speculation counters (vLLM's names)
};

SpecCounters ReadSpecCounters(const HttpEndpoint& e) {
  const std::map<std::string, double> m = ReadMetrics(e);
  SpecCounters c;
  c.present = m.count("vllm:spec_decode_num_drafts_total") > 0;
  c.drafts = MetricValue(m, "vllm:spec_decode_num_drafts_total");
  c.accepted = MetricValue(m, "vllm:spec_decode_num_accepted_tokens_total");
  return c;
}

}  // namespace

int RunUrlBench(const std::vector<std::string>& args) {
  const Flags flags = ParseUrlBenchFlags(args);
  const HttpEndpoint endpoint = EndpointFromFlags(flags);
  const int max_tokens = static_cast<int>(flags.GetInt("max-tokens", 256));
  const int runs = static_cast<int>(flags.GetInt("runs", 1));
  if (max_tokens < 1 || runs < 1) throw UsageError("--max-tokens and --runs must be >= 1");
  const bool thinking = flags.GetBool("thinking", false);
  const std::string api_key = ApiKeyFromFlags(flags);
  std::vector<int> stream_counts;
  {
    std::stringstream ss(flags.Get("streams", "1,4"));
    std::string item;
    while (std::getline(ss, item, ',')) {
      int n = std::atoi(item.c_str());
      if (n < 1 || n > 256) throw UsageError("--streams: bad count '" + item + "'");
      stream_counts.push_back(n);
    }
  }
  const std::string wanted = flags.Get("prompts", "en,ja,code");
  const std::string model = ServedModel(flags, endpoint, api_key);
  std::printf("dsmesh bench: %s model %s, max_tokens %d, temperature 0, thinking %s, %d run(s) per point\n",
              flags.Get("url").c_str(), model.c_str(), max_tokens, thinking ? "on" : "off", runs);
  std::printf("%-5s %7s %9s %14s %14s %10s %12s\n", "prompt", "streams", "TTFT s", "decode tok/s", "aggregate t/s",
              "accept len", "seat tok/s");
  json report = json::array();
  bool failed = false;
  for (const Prompt& p : kPrompts) {
    if (("," + wanted + ",").find("," + std::string(p.name) + ",") == std::string::npos) continue;
    for (int streams : stream_counts) {
      json body = {{"model", model},
                   {"messages", json::array({{{"role", "user"}, {"content", p.text}}})},
                   {"max_tokens", max_tokens},
                   {"temperature", 0},
                   {"stream", true},
                   {"stream_options", {{"include_usage", true}}},
                   {"chat_template_kwargs", {{"thinking", thinking}}}};
      const std::string text = body.dump();
      double sum_ttft = 0, sum_decode = 0, sum_agg = 0, sum_accept = 0;
      int accept_runs = 0;
      for (int run = 0; run < runs; ++run) {
        SpecCounters before = ReadSpecCounters(endpoint);
        std::vector<StreamResult> results(streams);
        const auto t0 = BenchClock::now();
        std::vector<std::thread> threads;
        for (int s = 0; s < streams; ++s)
          threads.emplace_back([&, s] { results[s] = RunStream(endpoint, text, api_key, t0); });
        for (auto& t : threads) t.join();
        const double wall = SecondsSince(t0);
        SpecCounters after = ReadSpecCounters(endpoint);
        double ttft = 0, decode = 0;
        int tokens = 0;
        for (const auto& r : results) {
          if (!r.error.empty()) {
            std::fprintf(stderr, "dsmesh bench: %s x%d: %s\n", p.name, streams, r.error.c_str());
            failed = true;
            continue;
          }
          ttft = std::max(ttft, r.ttft_s);
          tokens += r.tokens;
          decode += r.tokens / std::max(1e-9, r.end_s - r.ttft_s);
        }
        sum_ttft += ttft;
        sum_decode += decode / streams;
        sum_agg += tokens / wall;
        if (after.present && after.drafts > before.drafts) {
          sum_accept += 1 + (after.accepted - before.accepted) / (after.drafts - before.drafts);
          ++accept_runs;
        }
      }
      const double seat = streams == 1 ? p.seat_1 : streams == 4 ? p.seat_4 : 0;
      char accept[32] = "n/a";
      if (accept_runs) std::snprintf(accept, sizeof(accept), "%.2f", sum_accept / accept_runs);
      char seat_text[32] = "-";
      if (seat > 0) std::snprintf(seat_text, sizeof(seat_text), "%.0f", seat);
      std::printf("%-5s %7d %9.3f %14.1f %14.1f %10s %12s\n", p.name, streams, sum_ttft / runs, sum_decode / runs,
                  sum_agg / runs, accept, seat_text);
      std::fflush(stdout);
      report.push_back({{"prompt", p.name},
                        {"streams", streams},
                        {"ttft_s", sum_ttft / runs},
                        {"decode_tok_s_per_stream", sum_decode / runs},
                        {"aggregate_tok_s", sum_agg / runs},
                        {"acceptance_length", accept_runs ? json(sum_accept / accept_runs) : json(nullptr)},
                        {"seat_tok_s", seat > 0 ? json(seat) : json(nullptr)}});
    }
  }
  std::printf("seat tok/s: the reference deployment (\"the seat\": vLLM + exllamav3 on 8 x RTX PRO 2000) with MTP "
              "n=3 (1 stream: per-stream decode; 4 streams: aggregate), docs/reference-deployment.md section 3\n");
  if (flags.Has("json")) {
    FILE* f = std::fopen(flags.Get("json").c_str(), "w");
    if (!f) throw std::runtime_error("--json " + flags.Get("json") + ": cannot write");
    std::string s = report.dump(2);
    std::fwrite(s.data(), 1, s.size(), f);
    std::fclose(f);
  }
  return failed ? 1 : 0;
}

}  // namespace dsmesh
