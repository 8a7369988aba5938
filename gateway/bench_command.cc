// `dsmesh bench --url http://HOST:PORT`: the seat's serving benchmark against any OpenAI endpoint
// (shared/reference/seed-dsv4-carve.md section 5): three chat prompts (en / ja / code), run with 1 and
// 4 concurrent streams on the same prompt, temperature 0, streaming with include_usage.
//   tokens     = usage.completion_tokens (never chunk counts: speculative decoding sends several
//                tokens per chunk)
//   TTFT       = request sent -> first content or reasoning delta (max over streams)
//   decode     = tokens / (wall - TTFT) per stream; aggregate = sum of tokens / wall of the run
//   acceptance = 1 + d(accepted) / d(drafts) from /metrics vllm:spec_decode_* counters around the run
// Seat figures (vLLM, 8 x RTX PRO 2000, n=3 speculation) are printed beside as the anchor.
#include <utility>  // before Asio: Boost 1.74 needs std::exchange declared

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/cli_registry.h"
#include "common/flags.h"

namespace dsmesh {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Endpoint {
  std::string host, port, prefix;  // prefix: path before /v1 (usually empty)
};

Endpoint ParseUrl(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0)
    throw UsageError("--url must start with http:// (TLS is not supported by the bench client): " + url);
  std::string rest = url.substr(scheme.size());
  std::string hostport = rest.substr(0, rest.find('/'));
  Endpoint e;
  e.prefix = rest.size() > hostport.size() ? rest.substr(hostport.size()) : "";
  while (!e.prefix.empty() && e.prefix.back() == '/') e.prefix.pop_back();
  if (e.prefix.size() >= 3 && e.prefix.compare(e.prefix.size() - 3, 3, "/v1") == 0)
    e.prefix.resize(e.prefix.size() - 3);
  auto colon = hostport.rfind(':');
  e.host = colon == std::string::npos ? hostport : hostport.substr(0, colon);
  e.port = colon == std::string::npos ? "80" : hostport.substr(colon + 1);
  if (e.host.empty()) throw UsageError("--url has no host: " + url);
  return e;
}

struct HttpResult {
  int status = 0;
  std::string body;
};

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
  net::io_context io;
  tcp::resolver resolver(io);
  beast::tcp_stream stream(io);
  stream.expires_after(std::chrono::seconds(60));
  stream.connect(resolver.resolve(e.host, e.port));
  http::write(stream, JsonRequest(e, verb, path, body, api_key));
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(256u << 20);
  http::read(stream, buffer, parser);
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  return {static_cast<int>(parser.get().result_int()), parser.get().body()};
}

struct StreamResult {
  double ttft_s = -1;  // first content/reasoning delta
  double last_s = 0;   // last delta
  double end_s = 0;
  int tokens = 0;      // usage.completion_tokens
  std::string error;
};

// One streaming chat completion; times are relative to `t0`.
StreamResult RunStream(const Endpoint& e, const std::string& body, const std::string& api_key, Clock::time_point t0) {
  StreamResult r;
  try {
    net::io_context io;
    tcp::resolver resolver(io);
    beast::tcp_stream stream(io);
    stream.connect(resolver.resolve(e.host, e.port));
    http::write(stream, JsonRequest(e, http::verb::post, "/v1/chat/completions", body, api_key));
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(1ull << 30);
    http::read_header(stream, buffer, parser);
    if (parser.get().result_int() != 200) {
      http::read(stream, buffer, parser);
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
        const json& delta = chunk["choices"][0]["delta"];
        auto has = [&](const char* k) { return delta.contains(k) && delta[k].is_string() && !delta[k].get<std::string>().empty(); };
        if (has("content") || has("reasoning_content") || delta.contains("tool_calls")) {
          if (r.ttft_s < 0) r.ttft_s = now;
          r.last_s = now;
        }
      }
      if (chunk.contains("usage") && chunk["usage"].is_object()) r.tokens = chunk["usage"].value("completion_tokens", 0);
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

int RunBench(const std::vector<std::string>& args) {
  Flags flags(args, {"url", "model", "max-tokens", "streams", "api-key", "thinking", "prompts", "runs", "json"});
  if (!flags.Has("url"))
    throw UsageError("--url is required (the OpenAI endpoint of a running gateway, e.g. http://127.0.0.1:8000)");
  const Endpoint endpoint = ParseUrl(flags.Get("url"));
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
              "shared/reference/seed-dsv4-carve.md section 4\n");
  if (flags.Has("json")) {
    FILE* f = std::fopen(flags.Get("json").c_str(), "w");
    if (!f) throw std::runtime_error("--json " + flags.Get("json") + ": cannot write");
    std::string s = report.dump(2);
    std::fwrite(s.data(), 1, s.size(), f);
    std::fclose(f);
  }
  return failed ? 1 : 0;
}

}  // namespace

// `dsmesh bench` belongs to the mesh commands (coordinator/mesh_commands.cc); it hands `--url` runs to
// the command registered under "bench-url" (a dash, so registered directly, not by the macro).
static CommandRegistration bench_url_registration(
    "bench-url",
    "bench --url http://HOST:PORT [--model NAME] [--max-tokens 256] [--streams 1,4] [--prompts en,ja,code] "
    "[--runs N] [--thinking true|false] [--api-key K] [--json FILE]",
    RunBench);

}  // namespace dsmesh
