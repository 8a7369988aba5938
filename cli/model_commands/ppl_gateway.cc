#include "cli/model_commands/ppl_gateway.h"

#include <nlohmann/json.hpp>
#include <stdexcept>

namespace dsmesh {
namespace {

using json = nlohmann::json;

json ParseAnswer(const std::string& where, const HttpResult& r) {
  if (r.status != 200)
    throw std::runtime_error(where + ": HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 2000));
  try {
    return json::parse(r.body);
  } catch (const json::exception& e) {
    throw std::runtime_error(where + ": the answer is not JSON (" + e.what() + "): " + r.body.substr(0, 200));
  }
}

}  // namespace

PplGateway::PplGateway(const std::string& url, const std::string& api_key, int timeout_s)
    : url_(url), api_key_(api_key), endpoint_(ParseHttpUrl(url, "--url")), timeout_s_(timeout_s) {
  const json models = ParseAnswer(url_ + "/v1/models", HttpFetch(endpoint_, "GET", "/v1/models", "", api_key_, timeout_s_));
  if (!models.contains("data") || !models["data"].is_array() || models["data"].empty() ||
      !models["data"][0].contains("id") || !models["data"][0]["id"].is_string())
    throw std::runtime_error(url_ + "/v1/models: no model listed: " + models.dump().substr(0, 200));
  model_ = models["data"][0]["id"].get<std::string>();
}

std::vector<int32_t> PplGateway::Tokenize(const std::string& text) const {
  const json body = {{"model", model_}, {"prompt", text}, {"add_special_tokens", false}};
  const std::string where = url_ + "/tokenize";
  const json r = ParseAnswer(where, HttpFetch(endpoint_, "POST", "/tokenize", body.dump(), api_key_, timeout_s_));
  if (!r.contains("tokens") || !r["tokens"].is_array()) throw std::runtime_error(where + ": no \"tokens\" array in the answer");
  std::vector<int32_t> ids;
  for (const json& t : r["tokens"]) {
    if (!t.is_number_integer()) throw std::runtime_error(where + ": a token id is not an integer: " + t.dump());
    ids.push_back(t.get<int32_t>());
  }
  return ids;
}

double PplGateway::WindowNll(const std::vector<int32_t>& window) const {
  const json body = {{"model", model_}, {"prompt", window}, {"max_tokens", 1}, {"temperature", 0},
                     {"prompt_logprobs", 0}};
  const std::string where = url_ + "/v1/completions";
  const json r = ParseAnswer(where, HttpFetch(endpoint_, "POST", "/v1/completions", body.dump(), api_key_, timeout_s_));
  const json* lp = nullptr;
  if (r.contains("choices") && r["choices"].is_array() && !r["choices"].empty() && r["choices"][0].contains("prompt_logprobs"))
    lp = &r["choices"][0]["prompt_logprobs"];
  if (!lp || !lp->is_array())
    throw std::runtime_error(where + ": the answer has no choices[0].prompt_logprobs (does the server support vLLM's "
                             "prompt_logprobs?)");
  if (lp->size() != window.size())
    throw std::runtime_error(where + ": prompt_logprobs has " + std::to_string(lp->size()) + " entries for a window of " +
                             std::to_string(window.size()) + " tokens");
  double nll = 0;
  for (size_t j = 1; j < window.size(); ++j) {
    const std::string key = std::to_string(window[j]);
    const json& e = (*lp)[j];
    if (!e.is_object() || !e.contains(key) || !e[key].is_object() || !e[key].contains("logprob") ||
        !e[key]["logprob"].is_number())
      throw std::runtime_error(where + ": prompt_logprobs[" + std::to_string(j) + "] has no logprob for token " + key);
    nll -= e[key]["logprob"].get<double>();
  }
  return nll;
}

}  // namespace dsmesh
