#include "cli/bench/openai_endpoint.h"

#include <utility>  // before Asio: Boost 1.74 needs std::exchange declared

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

namespace dsmesh {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using json = nlohmann::json;

// An HTTP/1.1 request with a JSON body (and the API key as a bearer token when given).
http::request<http::string_body> JsonRequest(const HttpEndpoint& e, http::verb verb, const std::string& path,
                                             const std::string& body, const std::string& api_key) {
  http::request<http::string_body> req{verb, e.prefix + path, 11};
  req.set(http::field::host, e.host);
  req.set(http::field::content_type, "application/json");
  if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  req.body() = body;
  req.prepare_payload();
  return req;
}

}  // namespace

Flags ParseUrlBenchFlags(const std::vector<std::string>& args) {
  return Flags(args, {"url", "model", "max-tokens", "streams", "api-key", "thinking", "prompts", "runs", "json",
                      "clients", "requests", "prompt-words", "long-prompt-bytes", "long-prompts", "timeout-s"});
}

HttpEndpoint EndpointFromFlags(const Flags& flags) {
  if (!flags.Has("url"))
    throw UsageError("--url is required (the OpenAI endpoint of a running gateway, e.g. http://127.0.0.1:8000)");
  return ParseHttpUrl(flags.Get("url"), "--url");
}

std::string ApiKeyFromFlags(const Flags& flags) {
  const char* env = std::getenv("DSMESH_API_KEY");
  return flags.Get("api-key", env ? env : "");
}

std::string ServedModel(const Flags& flags, const HttpEndpoint& endpoint, const std::string& api_key) {
  if (!flags.Get("model").empty()) return flags.Get("model");
  const HttpResult models = HttpFetch(endpoint, "GET", "/v1/models", "", api_key);
  if (models.status != 200)
    throw std::runtime_error(flags.Get("url") + "/v1/models: HTTP " + std::to_string(models.status) + ": " +
                             models.body);
  return json::parse(models.body)["data"][0]["id"].get<std::string>();
}

StreamResult RunStream(const HttpEndpoint& e, const std::string& body, const std::string& api_key,
                       BenchClock::time_point t0, const std::string& path, int timeout_s) {
  StreamResult r;
  r.start_s = SecondsSince(t0);
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
      r.end_s = SecondsSince(t0);
      r.error = "HTTP " + std::to_string(parser.get().result_int()) + ": " + parser.get().body();
      return r;
    }
    std::string pending;
    auto on_event = [&](const std::string& data) {
      if (data == "[DONE]") return;
      json chunk = json::parse(data, nullptr, false);
      if (chunk.is_discarded()) throw std::runtime_error("bad SSE event: " + data.substr(0, 200));
      if (chunk.contains("error")) throw std::runtime_error("stream error: " + chunk["error"].dump());
      const double now = SecondsSince(t0);
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
    r.end_s = SecondsSince(t0);
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    if (r.tokens == 0) r.error = "no usage in the stream (include_usage ignored?)";
  } catch (const std::exception& ex) {
    r.error = ex.what();
  }
  return r;
}

std::map<std::string, double> ReadMetrics(const HttpEndpoint& e) {
  std::map<std::string, double> out;
  HttpResult m;
  try {
    m = HttpFetch(e, "GET", "/metrics", "", "");
  } catch (const std::exception&) {
    return out;
  }
  if (m.status != 200) return out;
  std::istringstream in(m.body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    const std::string key = line.substr(0, sp);
    out[key.substr(0, key.find('{'))] += std::atof(line.c_str() + sp + 1);
  }
  return out;
}

double MetricValue(const std::map<std::string, double>& metrics, const std::string& name) {
  const auto it = metrics.find(name);
  return it == metrics.end() ? 0 : it->second;
}

}  // namespace dsmesh
