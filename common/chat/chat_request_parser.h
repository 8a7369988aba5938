// OpenAI chat-completions JSON -> ChatRequest, with errors that name the offending field
// ("messages[1].content[0].type 'input_audio' is not supported") so the gateway can answer HTTP 400.
//
// Accepted (everything else in the body is the gateway's business and ignored here):
//   messages: [{role: system|user|assistant|tool, content: string | null | [{type:"text",text} |
//               {type:"image_url",image_url:{url,detail?}} (user only; kept undecoded, see ChatImagePart)],
//               reasoning_content | reasoning (assistant), tool_calls (assistant):
//               [{id?, type?: "function", function: {name, arguments: JSON string}}],
//               tool_call_id (tool)}]
//   tools: [{type: "function", function: {name, description?, parameters?, ...}}]
//   chat_template_kwargs: {thinking: bool, enable_thinking: bool}  (thinking is on unless a key says no)
//   reasoning_effort: "none" (thinking off) | minimal | low | medium | high | xhigh | max
//   add_generation_prompt: bool
#pragma once

#include <nlohmann/json.hpp>

#include "common/chat/chat_request.h"

namespace dsmesh {

// Parses a whole request body. Throws ChatFormatError.
ChatRequest ParseChatRequest(const nlohmann::ordered_json& body);

// Parses just the `messages` array; `path` prefixes field names in errors ("messages").
std::vector<ChatMessage> ParseChatMessages(const nlohmann::ordered_json& messages,
                                           const std::string& path = "messages");

// Parses just the `tools` array (null means none).
std::vector<nlohmann::ordered_json> ParseChatTools(const nlohmann::ordered_json& tools,
                                                   const std::string& path = "tools");

}  // namespace dsmesh
