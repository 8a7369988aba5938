// `dsmesh ppl --url`: the windows of `dsmesh ppl` scored by an OpenAI-compatible gateway (ours or vLLM)
// through /v1/completions with vLLM's `prompt_logprobs=0` and `max_tokens=1` (the reference deployment's
// ppl-vllm.py), the text tokenized by the gateway's /tokenize (no special tokens). Every HTTP or format problem is a
// std::runtime_error naming the URL and what came back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/http_client.h"

namespace dsmesh {

class PplGateway {
 public:
  // Asks /v1/models for the served model name (sent with every request).
  PplGateway(const std::string& url, const std::string& api_key, int timeout_s);

  const std::string& model_name() const { return model_; }
  std::vector<int32_t> Tokenize(const std::string& text) const;
  // Sum over window[1..] of -logprob(token | the tokens before it in the window).
  double WindowNll(const std::vector<int32_t>& window) const;

 private:
  std::string url_, api_key_, model_;
  HttpEndpoint endpoint_;
  int timeout_s_;
};

}  // namespace dsmesh
