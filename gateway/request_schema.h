// Checks of the request fields the OpenAI schemas (and vLLM) define that ParseRequestOptions does not
// read: each given a wrong type, an out-of-range value or an unknown enum value is a 400 naming the
// field, and a field whose meaning the mesh cannot honour (deprecated `functions`, audio output, web
// search, logit_bias, include_stop_str_in_output) is refused the same way rather than silently
// ignored. Also maps the chat parser's messages ("tools[0].function.name must be ...") to the
// top-level field they name.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace dsmesh {

// `chat`: chat-completions schema, else completions. Throws ApiError(400).
void CheckSchemaFields(const nlohmann::ordered_json& body, bool chat);

// The top-level request field a chat-parser message starts with ("messages[2].role ..." -> "messages",
// "chat_template_kwargs.thinking ..." -> "chat_template_kwargs"), or the image part an image field belongs
// to ("messages[0].content[1].image_url.url ..." -> "messages[0].content[1].image_url"); "messages" when it
// names none.
std::string ChatErrorParam(const std::string& message);

}  // namespace dsmesh
