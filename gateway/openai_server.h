// The OpenAI-compatible surface of the gateway: routing, API keys, request ids, and the handlers
// for /v1/chat/completions, /v1/completions, /v1/responses, /v1/models, /health, /metrics, /tokenize, /detokenize,
// /version, and Anthropic's /v1/messages and /v1/messages/count_tokens (answered in Anthropic's error shape).
// Generation itself is in generation_session.h; HTTP mechanics in http_server.h.
#pragma once

#include <optional>

#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "common/chat/chat_format.h"
#include "common/tokenizer/tokenizer.h"
#include "gateway/admission.h"
#include "gateway/generation_session.h"
#include "gateway/http_server.h"
#include "gateway/image_inputs.h"
#include "common/vision/vision_config.h"
#include "common/mesh/mesh_client.h"
#include "gateway/mesh_monitor.h"
#include "gateway/serving_metrics.h"

namespace dsmesh {

struct OpenAiServerOptions {
  std::string served_model_name;
  std::string model_dir;
  std::set<std::string> api_keys;  // empty: no authentication
  ChatFormat chat_format = ChatFormat::kDeepSeekV4;
  ImageInputOptions images;  // how image_url parts are read and bounded
  // Why image parts are refused after they decode (the mesh has no vision path yet): the tail of the 400
  // "model `X` does not accept images: <reason>".
  std::string images_refused_reason = "it has no vision tower";
  // The model's vision tower (config.json vision_* keys); absent: image parts are refused after decoding.
  std::optional<VisionConfig> vision;
};

class OpenAiServer {
 public:
  OpenAiServer(OpenAiServerOptions options, std::shared_ptr<const Tokenizer> tokenizer, MeshClient* mesh, MeshMonitor* monitor,
               ServingMetrics* metrics, Admission* admission);

  void Handle(std::shared_ptr<HttpExchange> exchange);

 private:
  struct Context;  // one request's id, headers, arrival time
  void Route(std::shared_ptr<HttpExchange>& exchange, Context& ctx);
  // `body`: a chat or completions request (the Responses API's translated to chat; `echo` is what its
  // response object repeats).
  void Generation(std::shared_ptr<HttpExchange>& exchange, Context& ctx, GenerationApi api, nlohmann::ordered_json body,
                  nlohmann::json echo);
  void Responses(std::shared_ptr<HttpExchange>& exchange, Context& ctx);
  void Messages(std::shared_ptr<HttpExchange>& exchange, Context& ctx);
  void CountTokens(std::shared_ptr<HttpExchange>& exchange, Context& ctx);
  void Models(std::shared_ptr<HttpExchange>& exchange, Context& ctx, const std::string& path);
  void Health(std::shared_ptr<HttpExchange>& exchange, Context& ctx);
  void Metrics(std::shared_ptr<HttpExchange>& exchange, Context& ctx);
  void Tokenize(std::shared_ptr<HttpExchange>& exchange, Context& ctx);
  void Detokenize(std::shared_ptr<HttpExchange>& exchange, Context& ctx);
  void CheckApiKey(const HttpRequest& request) const;  // Authorization: Bearer <key> or x-api-key: <key>
  // A chat body's prompt: rendered (DeepSeek-V4 or V3), tokenized, image blocks expanded. `constrained`:
  // the output is constrained from its first token, so the prompt opens no reasoning block.
  struct RenderedChat {
    std::vector<int> prompt_ids;
    std::vector<PromptImage> images;
    bool thinking = false;  // the prompt opened a reasoning block
  };
  RenderedChat RenderChat(const nlohmann::ordered_json& body, bool constrained) const;
  // A chat request's image parts: each decoded under options_.images (a 400 naming the part when one is
  // bad), then refused, since no model served here takes images yet (400 "does not accept images").
  // Decodes the request's images (400 for a bad one) and refuses them when the model has no tower.
  std::vector<ChatImage> CheckImages(const ChatRequest& request) const;
  // Stats for limits (max_model_len, max_num_seqs); throws 503 when the mesh is not ready.
  StatsResponse RequireReady() const;

  OpenAiServerOptions options_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  MeshClient* mesh_;
  MeshMonitor* monitor_;
  ServingMetrics* metrics_;
  Admission* admission_;
  const int64_t created_;
};

}  // namespace dsmesh
