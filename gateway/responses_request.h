// A Responses API request body (POST /v1/responses) -> the chat-completions body the generation path
// already serves, for the subset that maps onto chat: `input` (a string or a list of message /
// function_call / function_call_output / reasoning items; a user message's input_image parts become chat
// image_url parts), `instructions` (a system message first),
// function `tools`, `tool_choice`, `max_output_tokens`, `temperature` / `top_p`, `text.format`
// (json_schema / json_object: constrained decoding), `reasoning.effort`, `stream`. Stateless: nothing
// is stored (`store` is answered false), so `previous_response_id`, `conversation`, `background` and
// item references are 400s naming the field.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace dsmesh {

struct ResponsesRequest {
  nlohmann::ordered_json chat_body;  // for ParseRequestOptions / ParseChatRequest / ParseStructuredRequest
  nlohmann::json echo;               // the request parameters the response object repeats
};

// Throws ApiError(400) naming the Responses field.
ResponsesRequest TranslateResponsesRequest(const nlohmann::ordered_json& body);

// The Responses field for a chat-body field named in an error ("max_tokens" -> "max_output_tokens").
std::string ResponsesParam(const std::string& chat_param);

}  // namespace dsmesh
