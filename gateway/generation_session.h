// One OpenAI generation request from admission to the last byte. Each choice is one engine sequence
// (its own Generate stream to the coordinator, request id "<id>" for choice 0 and "<id>-<i>" after it,
// seed ChoiceSeed(seed, i)): choice 0 is submitted first and the others when its first message arrives,
// so its prefill has left a prefix-cache snapshot of the prompt's whole blocks that they start from;
// from then on all of them decode in the same engine steps. ChoiceDecoder turns each stream into
// text (reasoning / content / tool calls); a GenerationWriter frames it (chat / completions chunks with
// `index` per choice, the Responses API's events, or the Anthropic Messages API's). Usage counts come from the engine's token counts
// (all sequences, best_of included), never from chunk counts. A client disconnect cancels every gRPC
// call, which aborts the sequences in the mesh and frees their KV. Per-request latency figures go to
// ServingMetrics when the request ends, however it ends.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "gateway/admission.h"
#include "gateway/http_server.h"
#include "common/mesh/mesh_client.h"
#include "gateway/request_options.h"
#include "gateway/serving_metrics.h"

namespace dsmesh {

enum class GenerationApi { kChat, kCompletions, kResponses, kAnthropic };

struct GenerationJob {
  GenerationApi api = GenerationApi::kChat;
  bool chat = true;       // the chat output splitter (chat completions and responses)
  bool thinking = false;  // chat prompt opened a reasoning block
  RequestOptions options;
  std::vector<int> prompt_ids;
  std::vector<PromptImage> images;  // image blocks in prompt_ids (chat with image parts on a vision model)
  int max_tokens = 0;  // resolved (request value or the rest of the context)
  std::string request_id;
  std::string response_id;  // "chatcmpl-<request_id>" / "cmpl-<request_id>" / "resp_<request_id>" / "msg_<request_id>"
  std::string model_name;
  double arrival_s = 0;  // steady clock seconds when the HTTP request was read (TTFT counts from here)
  HeaderList response_headers;  // X-Request-Id
  nlohmann::json echo;  // Responses API: the request parameters the response object repeats; Anthropic: {model}
  std::optional<int> max_queued;  // this gateway's --max-queued, forwarded to the coordinator's admission
};

struct GenerationServices {
  std::shared_ptr<const Tokenizer> tokenizer;
  MeshClient* mesh;
  ServingMetrics* metrics;
};

// Takes over the exchange: it will be answered exactly once (or streamed to the end).
void StartGeneration(std::shared_ptr<HttpExchange> exchange, const GenerationServices& services, GenerationJob job,
                     std::unique_ptr<Admission::Ticket> ticket);

// The seed of choice i of a request seeded with `seed`: choice 0 keeps the request's seed (n = 1 answers
// do not change), the others get well-mixed distinct seeds, so every choice is reproducible on its own.
uint64_t ChoiceSeed(uint64_t seed, int choice);

double SteadySeconds();

}  // namespace dsmesh
