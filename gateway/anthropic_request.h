// An Anthropic Messages API request body (POST /v1/messages, /v1/messages/count_tokens) -> the
// chat-completions body the generation path already serves:
//   system (string or text blocks)            -> a system message first
//   messages: user / assistant turns, content a string or blocks:
//     text                                    -> text (parts joined as the chat parser joins them)
//     image (source base64 or url)            -> an image_url part (user turns only)
//     tool_use (assistant)                    -> tool_calls {id, function {name, arguments: JSON of input}}
//     tool_result (user)                      -> a tool message {tool_call_id, content}, before the turn's other blocks
//     thinking (assistant)                    -> reasoning_content; redacted_thinking is dropped (opaque)
//   tools [{name, description, input_schema}] -> function tools; tool_choice auto/any/tool/none
//                                                -> auto / required / the named function / none
//   thinking enabled|adaptive -> V4's thinking mode (its output comes back as thinking blocks);
//            disabled or absent (Anthropic's default) -> chat mode
//   max_tokens (required), stop_sequences, temperature, top_p, top_k, metadata.user_id, stream,
//   output_config {effort, format json_schema} -> reasoning_effort, response_format.
// Anything else Anthropic defines for its own models (cache_control, service_tier, container, ...) is
// ignored, as DeepSeek's Anthropic endpoint ignores it. A `claude-...` model name is served by the loaded
// model. Errors are ApiError(400) naming the Anthropic field ("messages.1.content.0.source").
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace dsmesh {

struct AnthropicRequest {
  nlohmann::ordered_json chat_body;  // for ParseRequestOptions / ParseChatRequest / ParseStructuredRequest
  std::string model;                 // as the client named it (the response repeats it)
};

// `served_model`: the loaded model's name (what a claude-* name becomes). `count_tokens`: the
// /v1/messages/count_tokens body (max_tokens not required; sampling fields not read). Throws ApiError(400).
AnthropicRequest TranslateAnthropicRequest(const nlohmann::ordered_json& body, const std::string& served_model,
                                           bool count_tokens = false);

// Anthropic's error body {"type":"error","error":{"type","message"},"request_id"} for an ApiError, with
// the error type Anthropic uses for its status (400 invalid_request_error, 401 authentication_error,
// 404 not_found_error, 413 request_too_large, 429 rate_limit_error, 503 overloaded_error, 5xx api_error).
std::string AnthropicErrorBody(int status, const std::string& message, const std::string& request_id);
std::string AnthropicErrorType(int status);

}  // namespace dsmesh
