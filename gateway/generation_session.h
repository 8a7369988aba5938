// One OpenAI generation request from admission to the last byte: opens the Generate stream to the
// coordinator, turns engine tokens into text (incremental detokenizer with stop strings), splits it
// (reasoning / content / tool calls), and answers either as SSE chunks framed exactly as OpenAI does
// or as one JSON body. Usage counts come from the engine's token counts, never from chunk counts
// (speculative decoding emits several tokens per message). A client disconnect cancels the gRPC
// call, which aborts the request in the mesh and frees its KV. Per-request latency figures go to
// ServingMetrics when the request ends, however it ends.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "gateway/admission.h"
#include "gateway/http_server.h"
#include "common/mesh/mesh_client.h"
#include "gateway/request_options.h"
#include "gateway/serving_metrics.h"

namespace dsmesh {

struct GenerationJob {
  bool chat = true;
  bool thinking = false;  // chat prompt opened a reasoning block
  RequestOptions options;
  std::vector<int> prompt_ids;
  int max_tokens = 0;  // resolved (request value or the rest of the context)
  std::string request_id;
  std::string response_id;  // "chatcmpl-<request_id>" / "cmpl-<request_id>"
  std::string model_name;
  double arrival_s = 0;  // steady clock seconds when the HTTP request was read (TTFT counts from here)
  HeaderList response_headers;  // X-Request-Id
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

double SteadySeconds();

}  // namespace dsmesh
