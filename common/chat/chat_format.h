// Which prompt format a model uses, and rendering by format. The gateway picks the format once from
// the model's config.json `model_type` and renders every request with it.
#pragma once

#include <optional>
#include <string>

#include "common/chat/chat_request.h"

namespace dsmesh {

enum class ChatFormat {
  kDeepSeekV4,  // encoding_dsv4.py (deepseek_v4_prompt.h)
  kDeepSeekV3,  // DeepSeek-V3's Jinja chat_template (deepseek_v3_prompt.h)
};

// "v4" / "v3" (CLI spelling). Throws std::runtime_error naming the value otherwise.
ChatFormat ParseChatFormatName(const std::string& name);
const char* ChatFormatName(ChatFormat format);

// From config.json's model_type: deepseek_v4 -> V4; deepseek_v3 -> V3. nullopt for other families
// (V3.1/V3.2 use other templates that are not implemented here).
std::optional<ChatFormat> ChatFormatForModelType(const std::string& model_type);

// Throws ChatFormatError when the request cannot be expressed in the format.
std::string RenderChatPrompt(ChatFormat format, const ChatRequest& request);

}  // namespace dsmesh
