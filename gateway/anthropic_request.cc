#include "gateway/anthropic_request.h"

#include <cmath>

#include "gateway/api_error.h"
#include "gateway/json_field.h"

namespace dsmesh {

namespace {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

[[noreturn]] void Refuse(const std::string& field, const std::string& message) {
  throw BadRequest(field + ": " + message, field);
}

std::string At(const std::string& path, size_t i) { return path + "." + std::to_string(i); }

const std::string& TypeOf(const ojson& block, const std::string& where) {
  if (!block.is_object()) Refuse(where, "must be an object");
  const ojson* t = FindField(block, "type");
  if (!t || !t->is_string()) Refuse(where + ".type", "must be a string");
  return t->get_ref<const std::string&>();
}

std::string StringField(const ojson& obj, const char* key, const std::string& where) {
  const ojson* v = FindField(obj, key);
  if (!v || !v->is_string()) Refuse(where + "." + key, "must be a string");
  return v->get<std::string>();
}

// system: a string or an array of text blocks (joined with "\n", as the chat parser joins parts).
std::string SystemText(const ojson& system) {
  if (system.is_string()) return system.get<std::string>();
  if (!system.is_array()) Refuse("system", "must be a string or an array of text blocks");
  std::string text;
  for (size_t i = 0; i < system.size(); ++i) {
    const std::string where = At("system", i);
    if (TypeOf(system[i], where) != "text") Refuse(where + ".type", "must be 'text'");
    text += (i ? "\n" : "") + StringField(system[i], "text", where);
  }
  return text;
}

// An image block -> a chat image_url part; the chat path decodes it and names it in its own errors.
ojson ImagePart(const ojson& block, const std::string& where) {
  const ojson* source = FindField(block, "source");
  if (!source || !source->is_object()) Refuse(where + ".source", "must be an object");
  const std::string type = StringField(*source, "type", where + ".source");
  std::string url;
  if (type == "base64") {
    url = "data:" + StringField(*source, "media_type", where + ".source") + ";base64," +
          StringField(*source, "data", where + ".source");
  } else if (type == "url") {
    url = StringField(*source, "url", where + ".source");
  } else {
    Refuse(where + ".source.type", "'" + type + "' is not supported (base64, url)");
  }
  return {{"type", "image_url"}, {"image_url", {{"url", url}}}};
}

// A tool_result's content: a string or text blocks (a chat tool message holds text only).
std::string ToolResultText(const ojson& block, const std::string& where) {
  const ojson* content = FindField(block, "content");
  if (!content) return "";
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) Refuse(where + ".content", "must be a string or an array of text blocks");
  std::string text;
  for (size_t i = 0; i < content->size(); ++i) {
    const std::string part = At(where + ".content", i);
    const std::string& type = TypeOf((*content)[i], part);
    if (type != "text") Refuse(part + ".type", "'" + type + "' is not supported in a tool_result (text only)");
    text += (i ? "\n" : "") + StringField((*content)[i], "text", part);
  }
  return text;
}

// One Anthropic turn -> chat messages (a user turn's tool_result blocks become tool messages, in order,
// before the turn's text and images).
void AddTurn(const ojson& turn, const std::string& where, ojson* messages) {
  if (!turn.is_object()) Refuse(where, "must be an object");
  const std::string role = StringField(turn, "role", where);
  if (role != "user" && role != "assistant")
    Refuse(where + ".role", "must be 'user' or 'assistant', got '" + role + "'");
  const ojson* content = FindField(turn, "content");
  if (!content) Refuse(where + ".content", "is required");
  if (content->is_string()) {
    messages->push_back({{"role", role}, {"content", *content}});
    return;
  }
  if (!content->is_array()) Refuse(where + ".content", "must be a string or an array of content blocks");
  ojson parts = ojson::array();
  ojson calls = ojson::array();
  std::string reasoning;
  bool has_reasoning = false;
  for (size_t i = 0; i < content->size(); ++i) {
    const ojson& block = (*content)[i];
    const std::string at = At(where + ".content", i);
    const std::string& type = TypeOf(block, at);
    if (type == "text") {
      parts.push_back({{"type", "text"}, {"text", StringField(block, "text", at)}});
    } else if (type == "image") {
      if (role != "user") Refuse(at + ".type", "image blocks are allowed in user turns only");
      parts.push_back(ImagePart(block, at));
    } else if (type == "tool_result") {
      if (role != "user") Refuse(at + ".type", "tool_result blocks are allowed in user turns only");
      messages->push_back({{"role", "tool"},
                           {"tool_call_id", StringField(block, "tool_use_id", at)},
                           {"content", ToolResultText(block, at)}});
    } else if (type == "tool_use") {
      if (role != "assistant") Refuse(at + ".type", "tool_use blocks are allowed in assistant turns only");
      const ojson* input = FindField(block, "input");
      if (!input || !input->is_object()) Refuse(at + ".input", "must be an object");
      calls.push_back({{"id", StringField(block, "id", at)},
                       {"type", "function"},
                       {"function", {{"name", StringField(block, "name", at)}, {"arguments", input->dump()}}}});
    } else if (type == "thinking") {
      if (role != "assistant") Refuse(at + ".type", "thinking blocks are allowed in assistant turns only");
      reasoning += StringField(block, "thinking", at);
      has_reasoning = true;
    } else if (type == "redacted_thinking") {
      if (role != "assistant") Refuse(at + ".type", "redacted_thinking blocks are allowed in assistant turns only");
    } else {
      Refuse(at + ".type", "'" + type + "' is not supported (text, image, tool_use, tool_result, thinking)");
    }
  }
  if (role == "user") {
    if (!parts.empty()) messages->push_back({{"role", "user"}, {"content", parts}});
    return;
  }
  ojson m = {{"role", "assistant"}, {"content", parts.empty() ? ojson(nullptr) : parts}};
  if (has_reasoning) m["reasoning_content"] = reasoning;
  if (!calls.empty()) m["tool_calls"] = calls;
  messages->push_back(m);
}

ojson Tools(const ojson& tools) {
  if (!tools.is_array()) Refuse("tools", "must be an array");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string where = At("tools", i);
    if (!t.is_object()) Refuse(where, "must be an object");
    if (const ojson* type = FindField(t, "type"); type && *type != "custom")
      Refuse(where + ".type", (type->is_string() ? "'" + type->get<std::string>() + "'" : type->dump()) +
                                  " is not supported: only custom tools (name, description, input_schema) run here");
    ojson fn = {{"name", StringField(t, "name", where)}};
    if (const ojson* d = FindField(t, "description")) {
      if (!d->is_string()) Refuse(where + ".description", "must be a string");
      fn["description"] = *d;
    }
    const ojson* schema = FindField(t, "input_schema");
    if (!schema || !schema->is_object()) Refuse(where + ".input_schema", "must be a JSON Schema object");
    fn["parameters"] = *schema;
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  return out;
}

// tool_choice -> the chat tool_choice; `forced`: any / tool (a call must come).
void ToolChoice(const ojson& tc, ojson* chat, bool* forced) {
  const std::string& type = TypeOf(tc, "tool_choice");
  if (const ojson* p = FindField(tc, "disable_parallel_tool_use")) {
    if (!p->is_boolean()) Refuse("tool_choice.disable_parallel_tool_use", "must be a boolean");
    (*chat)["parallel_tool_calls"] = !p->get<bool>();
  }
  if (type == "auto") {
    (*chat)["tool_choice"] = "auto";
  } else if (type == "none") {
    (*chat)["tool_choice"] = "none";
  } else if (type == "any") {
    (*chat)["tool_choice"] = "required";
    *forced = true;
  } else if (type == "tool") {
    (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", StringField(tc, "name", "tool_choice")}}}};
    *forced = true;
  } else {
    Refuse("tool_choice.type", "must be one of auto, any, tool, none, got '" + type + "'");
  }
}

// thinking -> whether V4 thinks (enabled / adaptive) or answers in chat mode (disabled).
bool Thinking(const ojson& thinking) {
  const std::string& type = TypeOf(thinking, "thinking");
  if (type == "disabled") return false;
  if (type == "adaptive") return true;
  if (type != "enabled") Refuse("thinking.type", "must be one of enabled, disabled, adaptive, got '" + type + "'");
  // Anthropic's minimum; the budget itself is not enforced (V4 has no thinking budget; DeepSeek's own
  // Anthropic endpoint ignores it too): max_tokens bounds thinking and answer together.
  const ojson* budget = FindField(thinking, "budget_tokens");
  if (!budget || !budget->is_number_integer()) Refuse("thinking.budget_tokens", "must be an integer");
  if (budget->get<long long>() < 1024) Refuse("thinking.budget_tokens", "must be greater than or equal to 1024");
  return true;
}

void OutputConfig(const ojson& config, ojson* chat) {
  if (!config.is_object()) Refuse("output_config", "must be an object");
  if (const ojson* e = FindField(config, "effort")) {
    if (!e->is_string()) Refuse("output_config.effort", "must be a string");
    const std::string effort = e->get<std::string>();
    if (effort != "low" && effort != "medium" && effort != "high" && effort != "xhigh" && effort != "max")
      Refuse("output_config.effort", "must be one of low, medium, high, xhigh, max, got '" + effort + "'");
    (*chat)["reasoning_effort"] = effort;
  }
  if (const ojson* f = FindField(config, "format")) {
    if (TypeOf(*f, "output_config.format") != "json_schema")
      Refuse("output_config.format.type", "must be 'json_schema'");
    const ojson* schema = FindField(*f, "schema");
    if (!schema || !schema->is_object()) Refuse("output_config.format.schema", "must be a JSON Schema object");
    (*chat)["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "output"}, {"schema", *schema}}}};
  }
}

}  // namespace

AnthropicRequest TranslateAnthropicRequest(const ojson& body, const std::string& served_model, bool count_tokens) {
  AnthropicRequest r;
  ojson& chat = r.chat_body;
  chat = ojson::object();

  const ojson* model = FindField(body, "model");
  if (!model) Refuse("model", "Field required");
  if (!model->is_string()) Refuse("model", "must be a string");
  r.model = model->get<std::string>();
  // Anthropic-native tools name Claude models; the loaded model answers them (as DeepSeek's endpoint maps them).
  chat["model"] = r.model.rfind("claude-", 0) == 0 ? served_model : r.model;

  if (const ojson* m = FindField(body, "max_tokens")) {
    if (!m->is_number_integer() || m->get<long long>() < 1) Refuse("max_tokens", "must be an integer of at least 1");
    chat["max_tokens"] = *m;
  } else if (!count_tokens) {
    Refuse("max_tokens", "Field required");
  }

  ojson messages = ojson::array();
  if (const ojson* s = FindField(body, "system")) messages.push_back({{"role", "system"}, {"content", SystemText(*s)}});
  const ojson* turns = FindField(body, "messages");
  if (!turns) Refuse("messages", "Field required");
  if (!turns->is_array()) Refuse("messages", "must be an array");
  if (turns->empty()) Refuse("messages", "must not be empty");
  for (size_t i = 0; i < turns->size(); ++i) AddTurn((*turns)[i], At("messages", i), &messages);
  chat["messages"] = messages;

  if (const ojson* t = FindField(body, "tools")) chat["tools"] = Tools(*t);
  bool forced_call = false;
  if (const ojson* tc = FindField(body, "tool_choice")) ToolChoice(*tc, &chat, &forced_call);
  bool thinking = false;  // Anthropic's default: no thinking unless asked for
  if (const ojson* t = FindField(body, "thinking")) thinking = Thinking(*t);
  if (thinking && forced_call)
    Refuse("thinking", "thinking may not be enabled when tool_choice forces tool use (any, tool)");
  chat["chat_template_kwargs"] = {{"thinking", thinking}};
  if (const ojson* oc = FindField(body, "output_config")) OutputConfig(*oc, &chat);

  if (const ojson* md = FindField(body, "metadata")) {
    if (!md->is_object()) Refuse("metadata", "must be an object");
    if (const ojson* u = FindField(*md, "user_id"); u && !u->is_string()) Refuse("metadata.user_id", "must be a string");
  }
  if (count_tokens) return r;

  if (const ojson* s = FindField(body, "stop_sequences")) {
    if (!s->is_array()) Refuse("stop_sequences", "must be an array of strings");
    for (size_t i = 0; i < s->size(); ++i)
      if (!(*s)[i].is_string() || (*s)[i].get<std::string>().empty())
        Refuse(At("stop_sequences", i), "must be a non-empty string");
    if (!s->empty()) chat["stop"] = *s;
  }
  // Same names and meaning in both APIs (ranges are checked by the chat path).
  for (const char* key : {"stream", "temperature", "top_p", "top_k"})
    if (const ojson* v = FindField(body, key)) chat[key] = *v;
  return r;
}

std::string AnthropicErrorType(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

std::string AnthropicErrorBody(int status, const std::string& message, const std::string& request_id) {
  json body = {{"type", "error"}, {"error", {{"type", AnthropicErrorType(status)}, {"message", message}}}};
  if (!request_id.empty()) body["request_id"] = request_id;
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace dsmesh
