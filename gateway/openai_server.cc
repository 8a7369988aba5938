#include "gateway/openai_server.h"

#include "gateway/image_prompt_builder.h"

#include "common/constant_time.h"

#include <spdlog/spdlog.h>

#include <ctime>
#include <nlohmann/json.hpp>
#include <random>

#include "common/chat/chat_request_parser.h"
#include "common/chat/python_json.h"
#include "common/version.h"
#include "gateway/anthropic_request.h"
#include "gateway/api_error.h"
#include "gateway/generation_session.h"
#include "gateway/request_limits.h"
#include "gateway/request_options.h"
#include "gateway/request_schema.h"
#include "gateway/responses_request.h"
#include "gateway/structured_request.h"

namespace dsmesh {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string RandomHex(int bytes) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < bytes; ++i) {
    unsigned v = rng() & 0xff;
    out += digits[v >> 4];
    out += digits[v & 15];
  }
  return out;
}

// A client-supplied X-Request-Id is echoed and used in logs and response ids only if it is short
// printable ASCII (it ends up in headers and log lines).
bool UsableRequestId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (unsigned char c : id)
    if (c < 0x21 || c > 0x7e) return false;
  return true;
}

ojson ParseBody(const HttpRequest& request) {
  const std::string& body = request.body();
  if (body.empty()) throw BadRequest("the request body is empty; expected a JSON object");
  ojson parsed;
  try {
    parsed = ParseJsonText(body, "request body");
  } catch (const JsonRangeError& e) {  // a number no double or 64-bit integer holds: name its field
    if (e.top_level_key.empty()) throw BadRequest(e.what());
    throw BadRequest("'" + e.top_level_key + "' is out of range: " + e.what(), e.top_level_key);
  } catch (const std::exception& e) {
    throw BadRequest(std::string("malformed JSON: ") + e.what());
  }
  if (!parsed.is_object()) throw BadRequest("the request body must be a JSON object");
  return parsed;
}

}  // namespace

struct OpenAiServer::Context {
  std::string request_id;
  std::string handler;  // for the http_requests counter
  HeaderList headers;
  double arrival_s = 0;
  bool anthropic = false;  // an Anthropic API path: errors in Anthropic's shape
};

OpenAiServer::OpenAiServer(OpenAiServerOptions options, std::shared_ptr<const Tokenizer> tokenizer, MeshClient* mesh,
                           MeshMonitor* monitor, ServingMetrics* metrics, Admission* admission)
    : options_(std::move(options)),
      tokenizer_(tokenizer),
      mesh_(mesh),
      monitor_(monitor),
      metrics_(metrics),
      admission_(admission),
      created_(static_cast<int64_t>(std::time(nullptr))) {}

void OpenAiServer::Handle(std::shared_ptr<HttpExchange> exchange) {
  Context ctx;
  ctx.arrival_s = SteadySeconds();
  std::string given(exchange->request()["X-Request-Id"]);
  ctx.request_id = UsableRequestId(given) ? given : RandomHex(16);
  ctx.headers.emplace_back("X-Request-Id", ctx.request_id);
  ctx.handler = "other";
  const std::string method(exchange->request().method_string());
  auto error_body = [&ctx](const ApiError& e) {
    return ctx.anthropic ? AnthropicErrorBody(e.status, e.what(), "req_" + ctx.request_id) : ErrorBody(e);
  };
  try {
    Route(exchange, ctx);
    if (ctx.handler != "generation") metrics_->CountHttpRequest(ctx.handler, method, 200);
  } catch (const ApiError& e) {
    if (e.status >= 500 || e.status == 429) spdlog::warn("request {}: {} {}", ctx.request_id, e.status, e.what());
    metrics_->CountHttpRequest(ctx.handler, method, e.status);
    HeaderList headers = ctx.headers;
    if (e.status == 401) headers.emplace_back("WWW-Authenticate", "Bearer");
    if (e.status == 503) headers.emplace_back("Retry-After", kRetryAfterSeconds);
    exchange->Respond(e.status, "application/json", error_body(e), headers);
  } catch (const InvalidUtf8Error& e) {
    metrics_->CountHttpRequest(ctx.handler, method, 400);
    exchange->Respond(400, "application/json", error_body(BadRequest(std::string("invalid UTF-8: ") + e.what())),
                      ctx.headers);
  } catch (const std::exception& e) {
    spdlog::error("request {}: internal error: {}", ctx.request_id, e.what());
    metrics_->CountHttpRequest(ctx.handler, method, 500);
    exchange->Respond(500, "application/json",
                      error_body(ApiError(500, std::string("internal error: ") + e.what(), "server_error")), ctx.headers);
  }
}

void OpenAiServer::Route(std::shared_ptr<HttpExchange>& exchange, Context& ctx) {
  const auto& req = exchange->request();
  std::string target(req.target());
  std::string path = target.substr(0, target.find('?'));
  const auto method = req.method();
  auto require = [&](http::verb v) {
    if (method != v)
      throw ApiError(405, "method " + std::string(req.method_string()) + " not allowed on " + path,
                     "invalid_request_error");
  };
  if (path == "/v1/messages" || path.rfind("/v1/messages/", 0) == 0) {
    ctx.anthropic = true;
    ctx.headers.emplace_back("request-id", "req_" + ctx.request_id);  // where Anthropic's clients read it
  }
  if (path.rfind("/v1/", 0) == 0) CheckApiKey(req);
  if (path == "/v1/chat/completions" || path == "/v1/completions") {
    ctx.handler = path;
    require(http::verb::post);
    ctx.handler = "generation";
    return Generation(exchange, ctx, path == "/v1/chat/completions" ? GenerationApi::kChat : GenerationApi::kCompletions,
                      ParseBody(exchange->request()), nullptr);
  }
  if (path == "/v1/responses") {
    ctx.handler = path;
    require(http::verb::post);
    ctx.handler = "generation";
    return Responses(exchange, ctx);
  }
  if (path == "/v1/messages") {
    ctx.handler = path;
    require(http::verb::post);
    ctx.handler = "generation";
    return Messages(exchange, ctx);
  }
  if (path == "/v1/messages/count_tokens") {
    ctx.handler = path;
    require(http::verb::post);
    return CountTokens(exchange, ctx);
  }
  if (path.rfind("/v1/responses/", 0) == 0)
    throw ApiError(404, "responses are not stored here (store: false), so there is nothing at " + path,
                   "not_found_error");
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
    ctx.handler = "/v1/models";
    require(http::verb::get);
    return Models(exchange, ctx, path);
  }
  if (path == "/version") {
    ctx.handler = path;
    require(http::verb::get);
    exchange->Respond(200, "application/json", Dump({{"version", kDsmeshVersion}}), ctx.headers);
    return;
  }
  if (path == "/health") {
    ctx.handler = path;
    require(http::verb::get);
    return Health(exchange, ctx);
  }
  if (path == "/metrics") {
    ctx.handler = path;
    require(http::verb::get);
    return Metrics(exchange, ctx);
  }
  if (path == "/tokenize") {
    ctx.handler = path;
    require(http::verb::post);
    return Tokenize(exchange, ctx);
  }
  if (path == "/detokenize") {
    ctx.handler = path;
    require(http::verb::post);
    return Detokenize(exchange, ctx);
  }
  throw ApiError(404, "no such endpoint: " + path, "not_found_error");
}

void OpenAiServer::CheckApiKey(const HttpRequest& request) const {
  if (options_.api_keys.empty()) return;
  std::string auth(request[http::field::authorization]);
  const std::string prefix = "bearer ";
  const bool bearer = auth.size() > prefix.size() && boost::beast::iequals(auth.substr(0, prefix.size()), prefix);
  const auto x_api_key = request.find("x-api-key");  // Anthropic's header
  if (bearer || x_api_key != request.end()) {
    const std::string key = bearer ? auth.substr(prefix.size()) : std::string(x_api_key->value());
    // Every configured key is compared, each in constant time, so the answer's timing says nothing about
    // how close a guess came or which key it resembled. The key is never logged.
    bool match = false;
    for (const std::string& k : options_.api_keys) match |= ConstantTimeEquals(key, k);
    if (match) return;
    throw ApiError(401, "invalid API key", "authentication_error", std::nullopt, std::string("invalid_api_key"));
  }
  throw ApiError(401, "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                 "authentication_error", std::nullopt,
                 std::string("invalid_api_key"));
}

StatsResponse OpenAiServer::RequireReady() const {
  if (!monitor_->ready()) {
    metrics_->CountRejected("not_ready");
    throw ApiError(503, "the mesh is not ready: " + monitor_->not_ready_reason(), "unavailable_error");
  }
  auto stats = monitor_->last_stats();
  if (!stats) throw ApiError(503, "the mesh is not ready: no coordinator figures yet", "unavailable_error");
  return *stats;
}

std::vector<ChatImage> OpenAiServer::CheckImages(const ChatRequest& request) const {
  if (!request.has_images()) return {};
  // Decoded first, so a bad image gets its own 400 whatever the model.
  std::vector<ChatImage> images = DecodeChatImages(request, options_.images);
  if (!options_.vision) RefuseImages(request, options_.served_model_name, options_.images_refused_reason);
  return images;
}

void OpenAiServer::Responses(std::shared_ptr<HttpExchange>& exchange, Context& ctx) {
  ResponsesRequest request = TranslateResponsesRequest(ParseBody(exchange->request()));
  try {
    Generation(exchange, ctx, GenerationApi::kResponses, std::move(request.chat_body), std::move(request.echo));
  } catch (ApiError& e) {  // name the Responses field, not the chat field it became
    if (e.param) {
      const std::string from = *e.param, to = ResponsesParam(from);
      if (to != from) {
        std::string message = e.what();
        for (size_t at = message.find(from); at != std::string::npos; at = message.find(from, at + to.size()))
          message.replace(at, from.size(), to);
        throw ApiError(e.status, message, e.type, to, e.code);
      }
    }
    throw;
  }
}

OpenAiServer::RenderedChat OpenAiServer::RenderChat(const ojson& body, bool constrained) const {
  ChatRequest chat_request;
  std::string prompt;
  std::vector<ChatImage> images;
  try {
    chat_request = ParseChatRequest(body);
    images = CheckImages(chat_request);
    // Constrained output starts at the first generated token: no reasoning block before it.
    if (constrained) chat_request.thinking = false;
    prompt = RenderChatPrompt(options_.chat_format, chat_request);
  } catch (const ChatFormatError& e) {
    throw BadRequest(e.what(), ChatErrorParam(e.what()));
  }
  RenderedChat out;
  out.thinking = chat_request.thinking && options_.chat_format == ChatFormat::kDeepSeekV4;
  if (images.empty()) {
    out.prompt_ids = tokenizer_->Encode(prompt, /*add_special_tokens=*/false);  // the prompt has its BOS
  } else {  // each placeholder becomes its image's sentinel block; the patches ride beside the ids
    ImagePrompt built = BuildImagePrompt(prompt, images, *tokenizer_, *options_.vision);
    out.prompt_ids = std::move(built.prompt_ids);
    out.images = std::move(built.images);
  }
  return out;
}

namespace {

// The Anthropic field a chat-body field named in an error came from.
std::string AnthropicParam(const std::string& chat_param) {
  if (chat_param == "stop") return "stop_sequences";
  if (chat_param == "reasoning_effort") return "output_config.effort";
  if (chat_param.rfind("response_format", 0) == 0) return "output_config.format";
  return chat_param;
}

// Rethrows a chat-path error with the Anthropic field's name in its message.
[[noreturn]] void RethrowAsAnthropic(const ApiError& e) {
  if (e.param) {
    const std::string from = *e.param, to = AnthropicParam(from);
    if (to != from) {
      std::string message = e.what();
      for (size_t at = message.find(from); at != std::string::npos; at = message.find(from, at + to.size()))
        message.replace(at, from.size(), to);
      throw ApiError(e.status, message, e.type, to, e.code);
    }
  }
  throw e;
}

}  // namespace

void OpenAiServer::Messages(std::shared_ptr<HttpExchange>& exchange, Context& ctx) {
  AnthropicRequest request = TranslateAnthropicRequest(ParseBody(exchange->request()), options_.served_model_name);
  try {
    Generation(exchange, ctx, GenerationApi::kAnthropic, std::move(request.chat_body), json{{"model", request.model}});
  } catch (const ApiError& e) {
    RethrowAsAnthropic(e);
  }
}

void OpenAiServer::CountTokens(std::shared_ptr<HttpExchange>& exchange, Context& ctx) {
  AnthropicRequest request =
      TranslateAnthropicRequest(ParseBody(exchange->request()), options_.served_model_name, /*count_tokens=*/true);
  ojson& body = request.chat_body;
  std::vector<int> ids;
  try {
    if (body["model"] != options_.served_model_name)
      throw ApiError(404, "The model `" + request.model + "` does not exist.", "not_found_error", std::string("model"));
    // Counted as /v1/messages would render it (tool_choice none drops the tools, a forced call or a
    // schema renders without thinking).
    if (auto tc = body.find("tool_choice"); tc != body.end() && tc->is_string() && *tc == "none") body.erase("tools");
    const bool constrained = !ParseStructuredRequest(body, /*chat=*/true).spec.empty();
    ids = RenderChat(body, constrained).prompt_ids;
  } catch (const ApiError& e) {
    RethrowAsAnthropic(e);
  }
  exchange->Respond(200, "application/json", Dump({{"input_tokens", ids.size()}}), ctx.headers);
}

void OpenAiServer::Generation(std::shared_ptr<HttpExchange>& exchange, Context& ctx, GenerationApi api, ojson body,
                              nlohmann::json echo) {
  const bool chat = api != GenerationApi::kCompletions;
  RequestOptions options = ParseRequestOptions(body, chat);
  CheckSchemaFields(body, chat);
  if (auto m = body.find("model"); m != body.end() && !m->is_null() && options.model != options_.served_model_name)
    throw ApiError(404, "The model `" + options.model + "` does not exist.", "not_found_error",
                   std::string("model"), std::string("model_not_found"));
  if (!options.ignored_fields.empty()) {
    std::string list;
    for (const auto& f : options.ignored_fields) list += (list.empty() ? "" : ", ") + f;
    spdlog::warn("request {}: the following fields were present in the request but ignored: {}", ctx.request_id, list);
  }

  StructuredRequest structured = ParseStructuredRequest(body, chat);
  options.sampling.set_structured_output(structured.spec);
  GenerationJob job;
  job.api = api;
  job.chat = chat;
  job.echo = std::move(echo);
  if (chat) {
    if (!body.contains("messages")) throw BadRequest("'messages' is required", "messages");
    if (auto tc = body.find("tool_choice"); tc != body.end() && tc->is_string() && *tc == "none") body.erase("tools");
    // The model may write DSML even without tools in the prompt (it saw calls in the history): with no tools
    // or tool_choice "none" nothing of it is returned (OpenAI: "none" is the default when no tools are present).
    auto tools = body.find("tools");
    options.tool_calls = tools != body.end() && tools->is_array() && !tools->empty();
    RenderedChat rendered = RenderChat(body, !structured.spec.empty());
    job.thinking = rendered.thinking;
    job.prompt_ids = std::move(rendered.prompt_ids);
    job.images = std::move(rendered.images);
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) throw BadRequest("'prompt' is required", "prompt");
    const ojson* prompt = &*it;
    if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) prompt = &(*prompt)[0];
    if (prompt->is_string()) {
      bool add_special = true;
      if (auto a = body.find("add_special_tokens"); a != body.end() && a->is_boolean()) add_special = a->get<bool>();
      job.prompt_ids = tokenizer_->Encode(prompt->get<std::string>(), add_special);
    } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number_integer()) {
      for (const auto& t : *prompt) {
        if (!t.is_number_integer() || t.get<long long>() < 0 || t.get<long long>() >= tokenizer_->vocab_size())
          throw BadRequest("'prompt' token ids must be integers in [0, " + std::to_string(tokenizer_->vocab_size()) +
                               ")",
                           "prompt");
        job.prompt_ids.push_back(t.get<int>());
      }
    } else if (prompt->is_array()) {
      throw BadRequest("'prompt' must be a string, an array of one string, or an array of token ids "
                       "(batched prompts are not supported)",
                       "prompt");
    } else {
      throw BadRequest("'prompt' must be a string or an array of token ids", "prompt");
    }
  }
  if (job.prompt_ids.empty()) throw BadRequest("the prompt is empty", chat ? "messages" : "prompt");

  StatsResponse stats = RequireReady();
  job.max_tokens = CheckRequestLimits(stats, static_cast<int>(job.prompt_ids.size()), options, chat);

  // Admission is the coordinator's (shared by every gateway): a request beyond its bound ends, before any
  // byte was sent, with 429 queue_full (generation_session.cc).
  job.max_queued = admission_->max_queued();
  if (options.request_id) spdlog::debug("request {}: body request_id {}", ctx.request_id, *options.request_id);
  job.options = std::move(options);
  job.request_id = ctx.request_id;
  job.response_id = (api == GenerationApi::kResponses   ? "resp_"
                     : api == GenerationApi::kAnthropic ? "msg_"
                     : chat                             ? "chatcmpl-"
                                                        : "cmpl-") +
                    ctx.request_id;
  job.model_name = options_.served_model_name;
  job.arrival_s = ctx.arrival_s;
  job.response_headers = ctx.headers;
  StartGeneration(exchange, GenerationServices{tokenizer_, mesh_, metrics_}, std::move(job), admission_->Enter());
}

void OpenAiServer::Models(std::shared_ptr<HttpExchange>& exchange, Context& ctx, const std::string& path) {
  auto stats = monitor_->last_stats();
  // vLLM's model card: root is the model as loaded (its directory), parent null, one permission entry.
  json permission = {{"id", "modelperm-" + options_.served_model_name},
                     {"object", "model_permission"},
                     {"created", created_},
                     {"allow_create_engine", false},
                     {"allow_sampling", true},
                     {"allow_logprobs", true},
                     {"allow_search_indices", false},
                     {"allow_view", true},
                     {"allow_fine_tuning", false},
                     {"organization", "*"},
                     {"group", nullptr},
                     {"is_blocking", false}};
  json card = {{"id", options_.served_model_name},
               {"object", "model"},
               {"created", created_},
               {"owned_by", "dsmesh"},
               {"root", options_.model_dir},
               {"parent", nullptr},
               {"permission", json::array({permission})}};
  if (stats && stats->max_model_len() > 0) card["max_model_len"] = stats->max_model_len();
  if (path == "/v1/models") {
    exchange->Respond(200, "application/json", Dump({{"object", "list"}, {"data", json::array({card})}}), ctx.headers);
    return;
  }
  std::string id = path.substr(std::string("/v1/models/").size());
  if (id != options_.served_model_name)
    throw ApiError(404, "The model `" + id + "` does not exist.", "not_found_error", std::string("model"),
                   std::string("model_not_found"));
  exchange->Respond(200, "application/json", Dump(card), ctx.headers);
}

void OpenAiServer::Health(std::shared_ptr<HttpExchange>& exchange, Context& ctx) {
  if (monitor_->ready()) {
    exchange->Respond(200, "application/json", Dump({{"status", "ok"}}), ctx.headers);
    return;
  }
  std::string status = monitor_->draining() ? "draining" : "unavailable";
  HeaderList headers = ctx.headers;
  headers.emplace_back("Retry-After", kRetryAfterSeconds);
  exchange->Respond(503, "application/json", Dump({{"status", status}, {"reason", monitor_->not_ready_reason()}}),
                    headers);
}

void OpenAiServer::Metrics(std::shared_ptr<HttpExchange>& exchange, Context& ctx) {
  // Fresh coordinator figures per scrape (counters must not lag behind the requests just served).
  auto stats = mesh_->TryStats(std::chrono::milliseconds(1000));
  exchange->Respond(200, "text/plain; version=0.0.4; charset=utf-8", metrics_->Render(stats, admission_->in_flight()),
                    ctx.headers);
}

void OpenAiServer::Tokenize(std::shared_ptr<HttpExchange>& exchange, Context& ctx) {
  ojson body = ParseBody(exchange->request());
  if (auto m = body.find("model"); m != body.end() && m->is_string() && *m != options_.served_model_name)
    throw ApiError(404, "The model `" + m->get<std::string>() + "` does not exist.", "not_found_error",
                   std::string("model"), std::string("model_not_found"));
  std::vector<int> ids;
  if (body.contains("messages")) {
    ids = RenderChat(body, /*constrained=*/false).prompt_ids;
  } else {
    auto p = body.find("prompt");
    if (p == body.end() || !p->is_string()) throw BadRequest("'prompt' (a string) or 'messages' is required", "prompt");
    bool add_special = true;
    if (auto a = body.find("add_special_tokens"); a != body.end()) {
      if (!a->is_boolean()) throw BadRequest("'add_special_tokens' must be a boolean", "add_special_tokens");
      add_special = a->get<bool>();
    }
    ids = tokenizer_->Encode(p->get<std::string>(), add_special);
  }
  json out = {{"count", ids.size()}, {"tokens", ids}, {"token_strs", nullptr}};
  auto stats = monitor_->last_stats();
  out["max_model_len"] = stats ? stats->max_model_len() : 0;
  exchange->Respond(200, "application/json", Dump(out), ctx.headers);
}

void OpenAiServer::Detokenize(std::shared_ptr<HttpExchange>& exchange, Context& ctx) {
  ojson body = ParseBody(exchange->request());
  auto t = body.find("tokens");
  if (t == body.end() || !t->is_array()) throw BadRequest("'tokens' (an array of token ids) is required", "tokens");
  std::vector<int> ids;
  for (const auto& e : *t) {
    if (!e.is_number_integer() || e.get<long long>() < 0 || e.get<long long>() >= tokenizer_->vocab_size())
      throw BadRequest("'tokens' must hold token ids in [0, " + std::to_string(tokenizer_->vocab_size()) + ")",
                       "tokens");
    ids.push_back(e.get<int>());
  }
  exchange->Respond(200, "application/json", Dump({{"prompt", tokenizer_->Decode(ids)}}), ctx.headers);
}

}  // namespace dsmesh
