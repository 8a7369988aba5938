// The gateway's /metrics: vLLM's metric names, types, labels and buckets
// (vllm/v1/metrics/loggers.py, summarized in docs/openai-api.md, "Errors and metrics"), so
// vLLM's Grafana dashboard and the bench scripts of the reference deployment (vLLM on 8 x RTX PRO 2000)
// work unchanged. Per-request figures are observed here as responses stream through; scheduler, KV and
// speculative figures come from the coordinator's Stats RPC at scrape time.
// Names outside vLLM's set use the `dsmesh_` prefix: so do the
// image counters (dsmesh_image_inputs_total, dsmesh_image_tokens_total), since vLLM counts no image inputs
// (its only multimodal families, vllm:mm_cache_queries/hits, count its processor cache, which dsmesh does
// not have); the image tokens are a part of vllm:prompt_tokens_total. vLLM counts no tool-call parse
// failures either: dsmesh_malformed_tool_call_blocks_total and dsmesh_suppressed_tool_calls_total.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "gateway/prometheus_text.h"
#include "proto/mesh.pb.h"

namespace dsmesh {

// What one finished request contributes to the histograms and counters.
struct FinishedRequestFigures {
  std::string finished_reason;  // "stop", "length", "abort", "error"
  int prompt_tokens = 0;
  int generation_tokens = 0;
  int max_tokens_param = 0;
  int image_inputs = 0;  // pictures in the prompt
  int image_tokens = 0;  // prompt tokens of their blocks (alignment pads, sentinels and image rows)
  std::optional<double> ttft_s;  // unset when no token was produced
  double e2e_s = 0;
  std::optional<double> queue_s;
  std::optional<double> prefill_s;  // queue end -> first token
  std::optional<double> decode_s;   // first token -> last token
  int malformed_tool_call_blocks = 0;  // DSML blocks that did not parse, over all choices
  int suppressed_tool_calls = 0;       // calls removed for tool_choice "none" / no tools, over all choices
};

class ServingMetrics {
 public:
  ServingMetrics(std::string model_name, int max_model_len);

  void ObserveInterTokenLatency(double seconds);  // one per token-bearing engine step
  void ObserveFinished(const FinishedRequestFigures& f);
  void CountHttpRequest(const std::string& handler, const std::string& method, int status);
  void CountRejected(const std::string& reason);  // queue_full, not_ready, ...

  // Full exposition. `stats` unset when the coordinator did not answer (then dsmesh_coordinator_up 0
  // and coordinator-side families are left out rather than reported as zeros).
  std::string Render(const std::optional<StatsResponse>& stats, int gateway_in_flight) const;

 private:
  Labels Base() const { return {{"model_name", model_name_}, {"engine", "0"}}; }

  const std::string model_name_;
  Counter prompt_tokens_, generation_tokens_, image_inputs_, image_tokens_;
  Counter malformed_tool_call_blocks_, suppressed_tool_calls_;
  mutable std::mutex mu_;  // guards the maps below
  std::map<std::string, Counter> request_success_;  // by finished_reason
  std::map<std::string, Counter> rejected_;         // by reason
  std::map<std::tuple<std::string, std::string, int>, Counter> http_requests_;
  Histogram ttft_, itl_, e2e_, queue_, inference_, prefill_, decode_;
  Histogram prompt_len_, generation_len_, max_tokens_param_;
};

}  // namespace dsmesh
