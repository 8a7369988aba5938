#include "common/chat/chat_request_parser.h"

#include <string>

namespace dsmesh {
namespace {

using Json = nlohmann::ordered_json;

[[noreturn]] void Fail(const std::string& message) { throw ChatFormatError(message); }

std::string Index(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

const char* TypeName(const Json& v) { return v.type_name(); }

// An image_url part: {"type": "image_url", "image_url": {"url": string, "detail"?: auto|low|high}}.
ChatImagePart ParseImagePart(const Json& part, const std::string& part_path, const std::string& role) {
  const std::string path = part_path + ".image_url";
  if (role != "user") Fail(part_path + ": image parts are only allowed in user messages, not '" + role + "'");
  auto image = part.find("image_url");
  if (image == part.end() || !image->is_object()) Fail(path + " must be an object {\"url\": ...}");
  auto url = image->find("url");
  if (url == image->end() || !url->is_string()) Fail(path + ".url must be a string");
  if (auto detail = image->find("detail"); detail != image->end() && !detail->is_null()) {
    if (!detail->is_string() || (*detail != "auto" && *detail != "low" && *detail != "high"))
      Fail(path + ".detail must be one of auto, low, high");
  }
  return ChatImagePart{url->get<std::string>(), path};
}

// Content: a string, null, or an array of text and image_url parts. Texts are joined with "\n" (what vLLM
// hands a template); each image adds a placeholder before the text and its part to `images`.
std::optional<std::string> ParseContent(const Json& msg, const std::string& path, const std::string& role,
                                        std::vector<ChatImagePart>* images) {
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array())
    Fail(path + ".content must be a string, null or an array of content parts, not " + TypeName(*it));
  std::string joined;
  bool any_text = false;
  for (size_t j = 0; j < it->size(); ++j) {
    const Json& part = (*it)[j];
    std::string part_path = Index(path + ".content", j);
    if (!part.is_object()) Fail(part_path + " must be an object, not " + TypeName(part));
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) Fail(part_path + ".type must be a string");
    if (*type == "image_url") {
      images->push_back(ParseImagePart(part, part_path, role));
      continue;
    }
    if (*type != "text")
      Fail(part_path + ".type '" + type->get<std::string>() + "' is not supported (text and image_url parts only)");
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) Fail(part_path + ".text must be a string");
    if (any_text) joined += "\n";
    joined += text->get<std::string>();
    any_text = true;
  }
  if (images->empty()) return joined;
  std::string out;
  for (size_t k = 0; k < images->size(); ++k) out += (k ? "\n" : "") + std::string(kImagePlaceholder);
  return any_text ? out + "\n" + joined : out;
}

std::optional<std::string> OptionalString(const Json& obj, const char* key, const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) Fail(path + "." + key + " must be a string, not " + TypeName(*it));
  return it->get<std::string>();
}

ChatToolCall ParseToolCall(const Json& call, const std::string& path) {
  if (!call.is_object()) Fail(path + " must be an object, not " + std::string(TypeName(call)));
  ChatToolCall out;
  out.id = OptionalString(call, "id", path).value_or("");
  if (auto type = OptionalString(call, "type", path)) {
    if (*type != "function") Fail(path + ".type must be \"function\", not \"" + *type + "\"");
  }
  auto fn = call.find("function");
  if (fn == call.end() || !fn->is_object()) Fail(path + ".function must be an object");
  auto name = fn->find("name");
  if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
    Fail(path + ".function.name must be a non-empty string");
  out.name = name->get<std::string>();
  auto args = fn->find("arguments");
  if (args == fn->end() || !args->is_string())
    Fail(path + ".function.arguments must be a string holding JSON");
  out.arguments = args->get<std::string>();
  return out;
}

ChatMessage ParseMessage(const Json& msg, const std::string& path) {
  if (!msg.is_object()) Fail(path + " must be an object, not " + std::string(TypeName(msg)));
  auto role_it = msg.find("role");
  if (role_it == msg.end() || !role_it->is_string()) Fail(path + ".role must be a string");
  const std::string role = role_it->get<std::string>();
  ChatMessage out;
  if (role == "system") {
    out.role = ChatMessage::Role::kSystem;
  } else if (role == "user") {
    out.role = ChatMessage::Role::kUser;
  } else if (role == "assistant") {
    out.role = ChatMessage::Role::kAssistant;
  } else if (role == "tool") {
    out.role = ChatMessage::Role::kTool;
  } else if (role == "developer") {
    Fail(path + ".role 'developer' is not supported (DeepSeek gives it another meaning; use 'system')");
  } else {
    Fail(path + ".role '" + role + "' is not one of system, user, assistant, tool");
  }
  out.content = ParseContent(msg, path, role, &out.images);
  if (out.role != ChatMessage::Role::kAssistant && !out.content)
    Fail(path + ".content is required for role '" + role + "'");

  bool has_tool_calls = msg.contains("tool_calls") && !msg["tool_calls"].is_null();
  if (out.role == ChatMessage::Role::kAssistant) {
    auto reasoning = OptionalString(msg, "reasoning_content", path);
    auto reasoning_alias = OptionalString(msg, "reasoning", path);
    if (reasoning && reasoning_alias && *reasoning != *reasoning_alias)
      Fail(path + ".reasoning and " + path + ".reasoning_content disagree; send one of them");
    out.reasoning_content = reasoning ? reasoning : reasoning_alias;
    if (has_tool_calls) {
      const Json& calls = msg["tool_calls"];
      if (!calls.is_array()) Fail(path + ".tool_calls must be an array");
      for (size_t j = 0; j < calls.size(); ++j)
        out.tool_calls.push_back(ParseToolCall(calls[j], Index(path + ".tool_calls", j)));
    }
  } else if (has_tool_calls) {
    Fail(path + ".tool_calls is only allowed on assistant messages");
  }
  if (out.role == ChatMessage::Role::kTool)
    out.tool_call_id = OptionalString(msg, "tool_call_id", path).value_or("");
  return out;
}

bool RequireBool(const Json& v, const std::string& path) {
  if (!v.is_boolean()) Fail(path + " must be a boolean, not " + std::string(TypeName(v)));
  return v.get<bool>();
}

}  // namespace

const char* RoleName(ChatMessage::Role role) {
  switch (role) {
    case ChatMessage::Role::kSystem: return "system";
    case ChatMessage::Role::kUser: return "user";
    case ChatMessage::Role::kAssistant: return "assistant";
    case ChatMessage::Role::kTool: return "tool";
  }
  return "?";
}

std::vector<ChatMessage> ParseChatMessages(const Json& messages, const std::string& path) {
  if (!messages.is_array()) Fail(path + " must be an array, not " + std::string(TypeName(messages)));
  if (messages.empty()) Fail(path + " must not be empty");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) out.push_back(ParseMessage(messages[i], Index(path, i)));
  return out;
}

std::vector<Json> ParseChatTools(const Json& tools, const std::string& path) {
  std::vector<Json> out;
  if (tools.is_null()) return out;
  if (!tools.is_array()) Fail(path + " must be an array, not " + std::string(TypeName(tools)));
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    std::string tool_path = Index(path, i);
    if (!tool.is_object()) Fail(tool_path + " must be an object, not " + std::string(TypeName(tool)));
    auto type = tool.find("type");
    if (type == tool.end() || *type != "function") Fail(tool_path + ".type must be \"function\"");
    auto fn = tool.find("function");
    if (fn == tool.end() || !fn->is_object()) Fail(tool_path + ".function must be an object");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
      Fail(tool_path + ".function.name must be a non-empty string");
    out.push_back(tool);
  }
  return out;
}

ChatRequest ParseChatRequest(const Json& body) {
  if (!body.is_object()) Fail("request body must be a JSON object");
  ChatRequest req;
  auto messages = body.find("messages");
  if (messages == body.end()) Fail("messages is required");
  req.messages = ParseChatMessages(*messages);
  if (auto tools = body.find("tools"); tools != body.end()) req.tools = ParseChatTools(*tools);

  if (auto kwargs = body.find("chat_template_kwargs"); kwargs != body.end() && !kwargs->is_null()) {
    if (!kwargs->is_object()) Fail("chat_template_kwargs must be an object");
    // As vLLM's DeepSeek-V4 tokenizer: thinking is on unless `thinking` or `enable_thinking` is given,
    // and then on if either is true.
    bool any_key = false, on = false;
    for (const char* key : {"thinking", "enable_thinking"}) {
      auto it = kwargs->find(key);
      if (it == kwargs->end()) continue;
      any_key = true;
      on = on || RequireBool(*it, std::string("chat_template_kwargs.") + key);
    }
    if (any_key) req.thinking = on;
  }
  if (auto effort = body.find("reasoning_effort"); effort != body.end() && !effort->is_null()) {
    if (!effort->is_string()) Fail("reasoning_effort must be a string");
    const std::string e = effort->get<std::string>();
    if (e == "none") {
      req.thinking = false;
    } else if (e == "max" || e == "xhigh") {
      req.reasoning_effort = ReasoningEffort::kMax;
    } else if (e == "high" || e == "medium" || e == "low" || e == "minimal") {
      req.reasoning_effort = ReasoningEffort::kHigh;
    } else {
      Fail("reasoning_effort '" + e + "' is not one of none, minimal, low, medium, high, xhigh, max");
    }
  }
  if (auto agp = body.find("add_generation_prompt"); agp != body.end() && !agp->is_null())
    req.add_generation_prompt = RequireBool(*agp, "add_generation_prompt");
  return req;
}

}  // namespace dsmesh
