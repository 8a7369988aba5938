#include "common/chat/chat_format.h"

#include <stdexcept>

#include "common/chat/deepseek_v3_prompt.h"
#include "common/chat/deepseek_v4_prompt.h"

namespace dsmesh {

ChatFormat ParseChatFormatName(const std::string& name) {
  if (name == "v4") return ChatFormat::kDeepSeekV4;
  if (name == "v3") return ChatFormat::kDeepSeekV3;
  throw std::runtime_error("unknown chat format '" + name + "' (expected v4 or v3)");
}

const char* ChatFormatName(ChatFormat format) {
  return format == ChatFormat::kDeepSeekV4 ? "v4" : "v3";
}

std::optional<ChatFormat> ChatFormatForModelType(const std::string& model_type) {
  if (model_type == "deepseek_v4") return ChatFormat::kDeepSeekV4;
  if (model_type == "deepseek_v3") return ChatFormat::kDeepSeekV3;
  return std::nullopt;
}

std::string RenderChatPrompt(ChatFormat format, const ChatRequest& request) {
  switch (format) {
    case ChatFormat::kDeepSeekV4: return RenderDeepSeekV4Prompt(request);
    case ChatFormat::kDeepSeekV3: return RenderDeepSeekV3Prompt(request);
  }
  throw std::logic_error("RenderChatPrompt: bad format");
}

}  // namespace dsmesh
