#include "gateway/request_options.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "gateway/api_error.h"
#include "gateway/json_field.h"

namespace dsmesh {

namespace {

using json = nlohmann::ordered_json;

double Number(const json& body, const char* name, double fallback, double lo, double hi) {
  const json* v = FindField(body, name);
  if (!v) return fallback;
  if (!v->is_number()) throw BadRequest(std::string("'") + name + "' must be a number", name);
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    throw BadRequest(std::string("'") + name + "' must be between " + std::to_string(lo) + " and " +
                         std::to_string(hi) + ", got " + v->dump(),
                     name);
  return d;
}

std::optional<long long> Integer(const json& body, const char* name, long long lo, long long hi) {
  const json* v = FindField(body, name);
  if (!v) return std::nullopt;
  bool integral = v->is_number_integer() || (v->is_number_float() && std::isfinite(v->get<double>()) &&
                                             std::floor(v->get<double>()) == v->get<double>());
  if (!integral) throw BadRequest(std::string("'") + name + "' must be an integer, got " + v->dump(), name);
  if (v->is_number_float() && std::fabs(v->get<double>()) >= 9.2e18)
    throw BadRequest(std::string("'") + name + "' is out of range: " + v->dump(), name);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<long long>::max()))
    throw BadRequest(std::string("'") + name + "' is out of range: " + v->dump(), name);
  long long x = v->is_number_float() ? static_cast<long long>(v->get<double>()) : v->get<long long>();
  if (x < lo || x > hi)
    throw BadRequest(std::string("'") + name + "' must be between " + std::to_string(lo) + " and " +
                         std::to_string(hi) + ", got " + v->dump(),
                     name);
  return x;
}

bool Bool(const json& body, const char* name, bool fallback) {
  const json* v = FindField(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) throw BadRequest(std::string("'") + name + "' must be a boolean", name);
  return v->get<bool>();
}

// Fields this gateway reads or knowingly accepts; anything else is reported as ignored.
const std::set<std::string> kKnownFields = {
    "model", "messages", "prompt", "stream", "stream_options", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "n", "logprobs", "top_logprobs",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos", "response_format", "tools",
    "tool_choice", "parallel_tool_calls", "chat_template_kwargs", "reasoning_effort", "add_generation_prompt",
    "skip_special_tokens", "echo", "user", "request_id", "priority", "best_of", "suffix", "logit_bias",
    "include_stop_str_in_output", "add_special_tokens", "metadata", "store", "service_tier", "prompt_cache_key",
    "safety_identifier", "verbosity", "modalities", "prediction", "functions", "function_call", "audio",
    "web_search_options", "guided_json", "guided_regex", "guided_choice", "structured_outputs", "prompt_logprobs"};

}  // namespace

RequestOptions ParseRequestOptions(const json& body, bool chat) {
  if (!body.is_object()) throw BadRequest("the request body must be a JSON object");
  RequestOptions r;
  for (const auto& [key, value] : body.items())
    if (!kKnownFields.count(key)) r.ignored_fields.push_back(key);

  if (const json* m = FindField(body, "model")) {
    if (!m->is_string()) throw BadRequest("'model' must be a string", "model");
    r.model = m->get<std::string>();
  }
  r.stream = Bool(body, "stream", false);
  if (const json* so = FindField(body, "stream_options")) {
    if (!so->is_object()) throw BadRequest("'stream_options' must be an object", "stream_options");
    if (!r.stream) throw BadRequest("'stream_options' is only allowed when 'stream' is true", "stream_options");
    for (const char* key : {"include_usage", "continuous_usage_stats"})
      if (const json* v = FindField(*so, key); v && !v->is_boolean())
        throw BadRequest(std::string("'stream_options.") + key + "' must be a boolean", "stream_options");
    r.include_usage = Bool(*so, "include_usage", false);
    r.continuous_usage_stats = Bool(*so, "continuous_usage_stats", false);
  }
  auto max_completion = Integer(body, "max_completion_tokens", 1, std::numeric_limits<int>::max());
  auto max_tokens = Integer(body, "max_tokens", 1, std::numeric_limits<int>::max());
  if (max_completion) r.max_tokens = static_cast<int>(*max_completion);
  else if (max_tokens) r.max_tokens = static_cast<int>(*max_tokens);

  r.n = static_cast<int>(Integer(body, "n", 1, kMaxChoices).value_or(1));
  r.best_of = static_cast<int>(Integer(body, "best_of", 1, kMaxChoices).value_or(r.n));
  if (r.best_of < r.n)
    throw BadRequest("'best_of' must be greater than or equal to 'n', got best_of " + std::to_string(r.best_of) +
                         " and n " + std::to_string(r.n),
                     "best_of");
  if (r.stream && r.best_of > r.n)
    throw BadRequest("'best_of' greater than 'n' is not supported when streaming (the best sequences are only "
                     "known at the end)",
                     "best_of");
  if (const json* s = FindField(body, "suffix"))
    if (!s->is_string() || !s->get<std::string>().empty())
      throw BadRequest("'suffix' is not supported", "suffix");

  SamplingParams& s = r.sampling;
  s.set_temperature(static_cast<float>(Number(body, "temperature", 1.0, 0.0, 2.0)));
  const double top_p = Number(body, "top_p", 1.0, 0.0, 1.0);
  if (top_p <= 0) throw BadRequest("'top_p' must be in (0, 1]", "top_p");
  // A positive top_p below float's smallest normal keeps only the most likely token, as FLT_MIN does.
  s.set_top_p(std::max(static_cast<float>(top_p), std::numeric_limits<float>::min()));
  s.set_top_k(static_cast<int>(Integer(body, "top_k", -1, std::numeric_limits<int>::max()).value_or(-1)));
  s.set_min_p(static_cast<float>(Number(body, "min_p", 0.0, 0.0, 1.0)));
  s.set_presence_penalty(static_cast<float>(Number(body, "presence_penalty", 0.0, -2.0, 2.0)));
  s.set_frequency_penalty(static_cast<float>(Number(body, "frequency_penalty", 0.0, -2.0, 2.0)));
  // Logits are divided by it: below 1e-6 a float logit overflows.
  s.set_repetition_penalty(static_cast<float>(Number(body, "repetition_penalty", 1.0, 1e-6, 100.0)));
  if (auto seed = Integer(body, "seed", std::numeric_limits<long long>::min(), std::numeric_limits<long long>::max()))
    s.set_seed(static_cast<uint64_t>(*seed));
  s.set_ignore_eos(Bool(body, "ignore_eos", false));
  r.skip_special_tokens = Bool(body, "skip_special_tokens", true);

  if (const json* stop = FindField(body, "stop")) {
    if (stop->is_string()) {
      r.stop_strings.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > 16) throw BadRequest("'stop' allows at most 16 sequences", "stop");
      for (const auto& e : *stop) {
        if (!e.is_string()) throw BadRequest("'stop' must be a string or an array of strings", "stop");
        r.stop_strings.push_back(e.get<std::string>());
      }
    } else {
      throw BadRequest("'stop' must be a string or an array of strings", "stop");
    }
    for (const auto& st : r.stop_strings)
      if (st.empty()) throw BadRequest("'stop' sequences must not be empty", "stop");
  }
  if (const json* ids = FindField(body, "stop_token_ids")) {
    if (!ids->is_array()) throw BadRequest("'stop_token_ids' must be an array of integers", "stop_token_ids");
    for (const auto& e : *ids) {
      if (!e.is_number_integer() || e.get<long long>() < 0 || e.get<long long>() > std::numeric_limits<int>::max())
        throw BadRequest("'stop_token_ids' must be an array of non-negative integers", "stop_token_ids");
      s.add_stop_token_ids(e.get<int>());
    }
  }

  if (chat) {
    r.logprobs = Bool(body, "logprobs", false);
    r.top_logprobs = static_cast<int>(Integer(body, "top_logprobs", 0, 20).value_or(0));
    if (r.top_logprobs > 0 && !r.logprobs)
      throw BadRequest("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
  } else {
    auto lp = Integer(body, "logprobs", 0, 20);
    r.logprobs = lp.has_value();
    r.top_logprobs = static_cast<int>(lp.value_or(0));
    r.echo = Bool(body, "echo", false);
    if (r.echo) throw BadRequest("'echo' is not supported", "echo");
    if (auto k = Integer(body, "prompt_logprobs", 0, 20)) {
      if (r.stream) throw BadRequest("'prompt_logprobs' is not supported with 'stream'", "prompt_logprobs");
      r.prompt_logprobs = static_cast<int>(*k);
    }
  }
  if (chat && FindField(body, "prompt_logprobs"))
    throw BadRequest("'prompt_logprobs' is supported on /v1/completions only", "prompt_logprobs");
  s.set_want_logprobs(r.logprobs);
  s.set_logprobs(r.top_logprobs);

  if (const json* rf = FindField(body, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      throw BadRequest("'response_format' must be an object with a string 'type'", "response_format");
    // json_object / json_schema: constrained decoding, parsed by gateway/structured_request.h.
  }
  if (const json* rid = FindField(body, "request_id")) {
    if (!rid->is_string()) throw BadRequest("'request_id' must be a string", "request_id");
    r.request_id = rid->get<std::string>();
  }
  r.priority = static_cast<int>(
      Integer(body, "priority", std::numeric_limits<int>::min(), std::numeric_limits<int>::max()).value_or(0));
  return r;
}

}  // namespace dsmesh
