// `dsmesh bench --url http://HOST:PORT`: the seat's serving benchmark against any OpenAI endpoint
// (docs/reference-deployment.md section 5): three chat prompts (en / ja / code), run with 1 and
// 4 concurrent streams on the same prompt, temperature 0, streaming with include_usage.
//   tokens     = usage.completion_tokens (never chunk counts: speculative decoding sends several
//                tokens per chunk)
//   TTFT       = request sent -> first content or reasoning delta (max over streams)
//   decode     = tokens / (wall - TTFT) per stream; aggregate = sum of tokens / wall of the run
//   acceptance = 1 + d(accepted) / d(drafts) from /metrics vllm:spec_decode_* counters around the run
// Seat figures (vLLM, 8 x RTX PRO 2000, n=3 speculation) are printed beside as the anchor.
// With --clients N it is a load run instead (RunLoad below): TTFT / inter-token latency p50/p99,
// throughput and the 429 count under N concurrent streaming clients.
#include <utility>  // before Asio: Boost 1.74 needs std::exchange declared

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "gateway/bench_command.h"
#include "common/flags.h"
#include "common/http_client.h"

namespace dsmesh {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

using Endpoint = HttpEndpoint;
Endpoint ParseUrl(const std::string& url) { return ParseHttpUrl(url, "--url"); }

// An HTTP/1.1 request with a JSON body (and the API key as a bearer token when given).
http::request<http::string_body> JsonRequest(const Endpoint& e, http::verb verb, const std::string& path,
                                             const std::string& body, const std::string& api_key) {
  http::request<http::string_body> req{verb, e.prefix + path, 11};
  req.set(http::field::host, e.host);
  req.set(http::field::content_type, "application/json");
  if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  req.body() = body;
  req.prepare_payload();
  return req;
}

// Plain request/response (GET /metrics, /v1/models).
HttpResult Fetch(const Endpoint& e, http::verb verb, const std::string& path, const std::string& body,
                 const std::string& api_key) {
  return HttpFetch(e, verb == http::verb::get ? "GET" : "POST", path, body, api_key);
}

struct StreamResult {
  int status = 0;      // HTTP status (0: no answer)
  double start_s = 0;  // request sent
  double ttft_s = -1;  // first content/reasoning delta
  double last_s = 0;   // last delta
  double end_s = 0;
  int tokens = 0;      // usage.completion_tokens
  int prompt_tokens = 0;
  std::vector<double> chunk_s;  // arrival of each event carrying output
  std::string error;
};

// One streaming chat (or completions) request; times are relative to `t0`. `timeout_s` bounds the whole
// exchange so a hung server ends the run with an error instead of a hang.
StreamResult RunStream(const Endpoint& e, const std::string& body, const std::string& api_key, Clock::time_point t0,
                       const std::string& path = "/v1/chat/completions", int timeout_s = 600) {
  StreamResult r;
  r.start_s = std::chrono::duration<double>(Clock::now() - t0).count();
  try {
    net::io_context io;
    tcp::resolver resolver(io);
    beast::tcp_stream stream(io);
    stream.expires_after(std::chrono::seconds(timeout_s));
    stream.connect(resolver.resolve(e.host, e.port));
    http::write(stream, JsonRequest(e, http::verb::post, path, body, api_key));
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(1ull << 30);
    http::read_header(stream, buffer, parser);
    r.status = parser.get().result_int();
    if (r.status != 200) {
      http::read(stream, buffer, parser);
      r.end_s = std::chrono::duration<double>(Clock::now() - t0).count();
      r.error = "HTTP " + std::to_string(parser.get().result_int()) + ": " + parser.get().body();
      return r;
    }
    std::string pending;
    auto on_event = [&](const std::string& data) {
      if (data == "[DONE]") return;
      json chunk = json::parse(data, nullptr, false);
      if (chunk.is_discarded()) throw std::runtime_error("bad SSE event: " + data.substr(0, 200));
      if (chunk.contains("error")) throw std::runtime_error("stream error: " + chunk["error"].dump());
      double now = std::chrono::duration<double>(Clock::now() - t0).count();
      if (chunk.contains("choices") && !chunk["choices"].empty()) {
        const json& choice = chunk["choices"][0];
        const json& delta = choice.contains("delta") ? choice["delta"] : choice;  // completions: {"text": ...}
        auto has = [&](const char* k) { return delta.contains(k) && delta[k].is_string() && !delta[k].get<std::string>().empty(); };
        if (has("content") || has("reasoning_content") || has("text") || delta.contains("tool_calls")) {
          if (r.ttft_s < 0) r.ttft_s = now;
          r.last_s = now;
          r.chunk_s.push_back(now);
        }
      }
      if (chunk.contains("usage") && chunk["usage"].is_object()) {
        r.tokens = chunk["usage"].value("completion_tokens", 0);
        r.prompt_tokens = chunk["usage"].value("prompt_tokens", 0);
      }
    };
    auto on_chunk = [&](std::uint64_t, beast::string_view data, beast::error_code&) -> std::size_t {
      pending.append(data.data(), data.size());
      size_t pos;
      while ((pos = pending.find("\n\n")) != std::string::npos) {
        std::string event = pending.substr(0, pos);
        pending.erase(0, pos + 2);
        if (event.rfind("data: ", 0) == 0) on_event(event.substr(6));
      }
      return data.size();
    };
    parser.on_chunk_body(on_chunk);
    http::read(stream, buffer, parser);
    r.end_s = std::chrono::duration<double>(Clock::now() - t0).count();
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    if (r.tokens == 0) r.error = "no usage in the stream (include_usage ignored?)";
  } catch (const std::exception& ex) {
    r.error = ex.what();
  }
  return r;
}

struct SpecCounters {
  double drafts = 0, accepted = 0;
  bool present = false;
};

// Sum over all series of each named metric on /metrics (empty map when /metrics cannot be read).
std::map<std::string, double> ReadMetrics(const Endpoint& e) {
  std::map<std::string, double> out;
  HttpResult m;
  try {
    m = Fetch(e, http::verb::get, "/metrics", "", "");
  } catch (const std::exception&) {
    return out;
  }
  if (m.status != 200) return out;
  std::istringstream in(m.body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    auto sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    std::string key = line.substr(0, sp);
    out[key.substr(0, key.find('{'))] += std::atof(line.c_str() + sp + 1);
  }
  return out;
}

SpecCounters ReadSpecCounters(const Endpoint& e) {
  SpecCounters c;
  HttpResult m = Fetch(e, http::verb::get, "/metrics", "", "");
  if (m.status != 200) return c;
  std::istringstream in(m.body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    auto sp = line.rfind(' ');
    std::string key = line.substr(0, sp);
    double v = std::atof(line.c_str() + sp + 1);
    std::string name = key.substr(0, key.find('{'));
    if (name == "vllm:spec_decode_num_drafts_total") c.drafts += v, c.present = true;
    if (name == "vllm:spec_decode_num_accepted_tokens_total") c.accepted += v;
  }
  return c;
}

struct Prompt {
  const char* name;
  const char* text;
  double seat_1, seat_4;  // seat tok/s (1 stream per-stream decode, 4 streams aggregate), n=3
};

const Prompt kPrompts[] = {
    {"en", "Explain in detail how a transformer language model generates text, step by step.", 62, 136},
    {"ja", "日本の四季の特徴と、それぞれの季節の代表的な行事や食べ物について詳しく説明してください。", 55, 116},
    {"code", "Write a Python LRU cache class with O(1) get and put, with docstrings and a unit test.", 86, 186},
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(std::ceil(p / 100 * v.size()));
  return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
}

std::string Ms(double s) {
  char buf[32];
  if (std::isnan(s)) return "-";
  std::snprintf(buf, sizeof(buf), "%.1f", s * 1e3);
  return buf;
}

// `dsmesh bench --url U --clients N`: a load run. N client threads send streaming chat requests (each a
// distinct prompt of --prompt-words words, --max-tokens with ignore_eos so every answer has that length)
// until --requests have been sent; a 429 is counted, not retried. Reports TTFT, inter-token latency (the
// gaps between output events, as vLLM's benchmark_serving) and time per output token, p50/p99, output
// throughput, and checks the usage sums against the gateway's counters. With --long-prompt-bytes B,
// --long-prompts K requests carrying a B-byte prompt are sent once the streams run, and the longest
// gap of the other streams while those were in flight is reported beside the gaps outside (the stall a
// long tokenization causes).
int RunLoad(const Flags& flags, const Endpoint& endpoint, const std::string& model, const std::string& api_key) {
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

  auto body_for = [&](int i) {
    std::string prompt = "Request " + std::to_string(i) + ":";
    for (int w = 0; w < words; ++w) prompt += " w" + std::to_string((i * 131 + w * 7) % 997);
    return json{{"model", model},
                {"messages", json::array({{{"role", "user"}, {"content", prompt}}})},
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
  const auto t0 = Clock::now();
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
    while (first_tokens.load() < std::min(clients, requests) / 2 &&
           Clock::now() - t0 < std::chrono::seconds(2))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::string text;
    text.reserve(long_bytes);
    for (long long k = 0; static_cast<long long>(text.size()) < long_bytes; ++k) text += "word" + std::to_string(k % 9973) + " ";
    text.resize(long_bytes);
    long_body = json{{"model", model}, {"prompt", text}, {"max_tokens", 1}, {"stream", true}}.dump();
    for (int k = 0; k < long_count; ++k)
      long_threads.emplace_back(
          [&, k] { longs[k] = RunStream(endpoint, long_body, api_key, t0, "/v1/completions", timeout_s); });
  }
  for (auto& t : threads) t.join();
  for (auto& t : long_threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
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
    auto delta = [&](const char* name) {
      auto a = after.find(name), b = before.find(name);
      return (a == after.end() ? 0 : a->second) - (b == before.end() ? 0 : b->second);
    };
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

}  // namespace

int RunUrlBench(const std::vector<std::string>& args) {
  Flags flags(args, {"url", "model", "max-tokens", "streams", "api-key", "thinking", "prompts", "runs", "json",
                     "clients", "requests", "prompt-words", "long-prompt-bytes", "long-prompts", "timeout-s"});
  if (!flags.Has("url"))
    throw UsageError("--url is required (the OpenAI endpoint of a running gateway, e.g. http://127.0.0.1:8000)");
  const Endpoint endpoint = ParseUrl(flags.Get("url"));
  if (flags.Has("clients")) {
    const std::string api_key =
        flags.Get("api-key", std::getenv("DSMESH_API_KEY") ? std::getenv("DSMESH_API_KEY") : "");
    std::string model = flags.Get("model");
    if (model.empty()) {
      HttpResult models = Fetch(endpoint, http::verb::get, "/v1/models", "", api_key);
      if (models.status != 200)
        throw std::runtime_error(flags.Get("url") + "/v1/models: HTTP " + std::to_string(models.status) + ": " +
                                 models.body);
      model = json::parse(models.body)["data"][0]["id"].get<std::string>();
    }
    return RunLoad(flags, endpoint, model, api_key);
  }
  const int max_tokens = static_cast<int>(flags.GetInt("max-tokens", 256));
  const int runs = static_cast<int>(flags.GetInt("runs", 1));
  if (max_tokens < 1 || runs < 1) throw UsageError("--max-tokens and --runs must be >= 1");
  const bool thinking = flags.GetBool("thinking", false);
  const std::string api_key = flags.Get("api-key", std::getenv("DSMESH_API_KEY") ? std::getenv("DSMESH_API_KEY") : "");
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
  std::string wanted = flags.Get("prompts", "en,ja,code");
  std::string model = flags.Get("model");
  if (model.empty()) {
    HttpResult models = Fetch(endpoint, http::verb::get, "/v1/models", "", api_key);
    if (models.status != 200)
      throw std::runtime_error(flags.Get("url") + "/v1/models: HTTP " + std::to_string(models.status) + ": " + models.body);
    model = json::parse(models.body)["data"][0]["id"].get<std::string>();
  }
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
        auto t0 = Clock::now();
        std::vector<std::thread> threads;
        for (int s = 0; s < streams; ++s)
          threads.emplace_back([&, s] { results[s] = RunStream(endpoint, text, api_key, t0); });
        for (auto& t : threads) t.join();
        double wall = std::chrono::duration<double>(Clock::now() - t0).count();
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
  std::printf("seat tok/s: vLLM seat with MTP n=3 (1 stream: per-stream decode; 4 streams: aggregate), "
              "docs/reference-deployment.md section 3\n");
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
