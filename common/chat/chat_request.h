// The conversation the chat formats render: OpenAI chat-completions messages, tools and the options
// that change the prompt. The gateway builds it with ParseChatRequest (chat_request_parser.h) from the
// request body; the renderers (deepseek_v4_prompt.h, deepseek_v3_prompt.h) turn it into prompt text.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsmesh {

// A request that cannot be rendered (malformed message, unsupported field value). Its message names
// the field, e.g. "messages[2].tool_calls[0].function.name must be a string"; the gateway returns it
// as HTTP 400.
struct ChatFormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ChatToolCall {
  std::string id;               // may be empty (clients are not required to echo ids back)
  std::string type = "function";
  std::string name;
  std::string arguments;        // JSON text as the client sent it
};

// An image content part of a user message ({"type":"image_url","image_url":{"url":...,"detail"?}}), kept
// undecoded: the gateway decodes it (common/image) and names `param` in its errors.
struct ChatImagePart {
  std::string url;    // data: URL, file:// URL or http(s) URL as the client sent it
  std::string param;  // "messages[0].content[1].image_url"
};

// The placeholder an image part leaves in its message's text (DeepSeek-V4-Flash-Vision's image token;
// vllm/models/deepseek_v4/common/mm_preprocess.py IMAGE_PLACEHOLDER).
inline constexpr char kImagePlaceholder[] = "<｜deepseek_image｜>";

struct ChatMessage {
  enum class Role { kSystem, kUser, kAssistant, kTool };
  Role role = Role::kUser;
  // Absent and null are the same (nullopt). Array content ([{type:"text",text}...]) is joined with "\n"
  // by the parser, as vLLM does before it applies a chat template. With image parts, the text is one
  // kImagePlaceholder per image, then the joined text, all joined with "\n" (vLLM's default placement,
  // vllm/entrypoints/chat_utils.py _get_full_multimodal_text_prompt: placeholders first).
  std::optional<std::string> content;
  std::vector<ChatImagePart> images;             // user only, in content order
  std::optional<std::string> reasoning_content;  // assistant only
  std::vector<ChatToolCall> tool_calls;          // assistant only
  std::string tool_call_id;                      // tool only
};

// How much the model should think. Only kMax changes the DeepSeek-V4 prompt (the official encoder
// prepends its "Reasoning Effort: Absolute maximum..." paragraph); the others render like no setting.
enum class ReasoningEffort { kDefault, kHigh, kMax };

struct ChatRequest {
  std::vector<ChatMessage> messages;
  // OpenAI tool definitions ({"type":"function","function":{...}}) with key order kept: V4 writes each
  // "function" object into the prompt through Python's json.dumps.
  std::vector<nlohmann::ordered_json> tools;
  bool thinking = true;               // chat_template_kwargs.thinking; on by default, as in the reference deployment (vLLM)
  // false: the V3 template ends without "<｜Assistant｜>"; V4 refuses it (its encoder always opens
  // the assistant turn after a user turn).
  bool add_generation_prompt = true;
  ReasoningEffort reasoning_effort = ReasoningEffort::kDefault;

  bool has_images() const {
    for (const auto& m : messages)
      if (!m.images.empty()) return true;
    return false;
  }
};

const char* RoleName(ChatMessage::Role role);

}  // namespace dsmesh
