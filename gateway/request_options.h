// The generation parameters of an OpenAI chat/completions request body, validated: every field of a
// wrong type or out of range is a 400 naming the field (the JSON library's own exceptions never reach
// the client). Fields that only shape the prompt (messages, tools, chat_template_kwargs) are parsed by
// common/chat; unknown fields are ignored and logged, as vLLM does.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "proto/mesh.pb.h"

namespace dsmesh {

struct RequestOptions {
  std::string model;
  bool stream = false;
  bool include_usage = false;             // stream_options.include_usage
  bool continuous_usage_stats = false;    // stream_options.continuous_usage_stats (vLLM)
  std::optional<int> max_tokens;          // max_completion_tokens or max_tokens
  std::vector<std::string> stop_strings;  // stop
  SamplingParams sampling;                // temperature, top_p, ..., stop_token_ids, logprobs
  bool logprobs = false;                  // chat: logprobs=true; completions: logprobs=N given
  int top_logprobs = 0;
  bool skip_special_tokens = true;
  bool echo = false;                      // completions only
  std::optional<int> prompt_logprobs;     // completions, not streamed (vLLM extension): per prompt token
                                          // logprob + this many top alternatives (gateway/prompt_logprobs.h)
  std::optional<std::string> request_id;  // body "request_id" (vLLM extension)
  int priority = 0;                       // body "priority" (vLLM extension): lower runs first
  int n = 1;                              // choices returned, 1..kMaxChoices
  int best_of = 1;                        // sequences generated (>= n); the n with the highest cumulative logprob win
  bool tool_calls = true;                 // chat: the request has tools and tool_choice is not "none" (set by the
                                          // handler); off, DSML in the output is removed instead of returned
  std::vector<std::string> ignored_fields;
};

// The bound on n and best_of (vLLM has none beyond max_num_seqs; 128 keeps one request from flooding the
// scheduler's queue).
inline constexpr int kMaxChoices = 128;

// `chat` selects chat-completions rules (logprobs bool + top_logprobs) over completions rules
// (logprobs integer). Throws ApiError(400).
RequestOptions ParseRequestOptions(const nlohmann::ordered_json& body, bool chat);

}  // namespace dsmesh
