#include "gateway/responses_request.h"

#include <map>

#include "gateway/api_error.h"
#include "gateway/json_field.h"

namespace dsmesh {

namespace {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

[[noreturn]] void Refuse(const std::string& field, const std::string& message) {
  throw BadRequest("'" + field + "' " + message, field);
}

// A content part list (or a string) -> its text; only text parts map onto this model.
std::string PartsText(const ojson& content, const std::string& path) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) Refuse(path, "must be a string or an array of content parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& p = content[i];
    const std::string where = path + "[" + std::to_string(i) + "]";
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) Refuse(where, "must be an object with a 'type'");
    const std::string type = p["type"];
    const char* key = type == "input_text" || type == "output_text" || type == "text" || type == "reasoning_text" ||
                              type == "summary_text"
                          ? "text"
                          : type == "refusal" ? "refusal" : nullptr;
    if (!key) Refuse(where + ".type", "'" + type + "' is not supported (text only)");
    if (!p.contains(key) || !p[key].is_string()) Refuse(where + "." + key, "must be a string");
    text += p[key].get<std::string>();
  }
  return text;
}

// A user message's content with images: Responses parts -> chat parts (input_text -> text, input_image ->
// image_url), so the chat path's image checks, decoding and prompt layout serve them. A string, or parts
// without images, stays text (PartsText).
bool HasImagePart(const ojson& content) {
  if (!content.is_array()) return false;
  for (const ojson& p : content)
    if (p.is_object() && p.contains("type") && p["type"] == "input_image") return true;
  return false;
}

ojson ChatPartsWithImages(const ojson& content, const std::string& path) {
  ojson parts = ojson::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& p = content[i];
    const std::string where = path + "[" + std::to_string(i) + "]";
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) Refuse(where, "must be an object with a 'type'");
    const std::string type = p["type"];
    if (type == "input_image") {
      if (p.contains("file_id")) Refuse(where + ".file_id", "is not supported (no files API): send the image as image_url");
      if (!p.contains("image_url") || !p["image_url"].is_string())
        Refuse(where + ".image_url", "must be a string (a data: URL)");
      ojson image = {{"url", p["image_url"]}};
      if (p.contains("detail")) image["detail"] = p["detail"];
      parts.push_back({{"type", "image_url"}, {"image_url", image}});
      continue;
    }
    if (type != "input_text" && type != "text")
      Refuse(where + ".type", "'" + type + "' is not supported beside images (input_text, input_image)");
    if (!p.contains("text") || !p["text"].is_string()) Refuse(where + ".text", "must be a string");
    parts.push_back({{"type", "text"}, {"text", p["text"]}});
  }
  return parts;
}

ojson Messages(const ojson& input) {
  ojson messages = ojson::array();
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return messages;
  }
  if (!input.is_array()) Refuse("input", "must be a string or an array of input items");
  std::string pending_reasoning;
  auto assistant = [&]() -> ojson& {  // the assistant message a function_call or reasoning joins
    if (messages.empty() || messages.back()["role"] != "assistant" || messages.back().contains("tool_call_id")) {
      messages.push_back({{"role", "assistant"}, {"content", nullptr}});
    }
    ojson& m = messages.back();
    if (!pending_reasoning.empty()) m["reasoning_content"] = pending_reasoning;
    pending_reasoning.clear();
    return m;
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const ojson& item = input[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) Refuse(where, "must be an object");
    std::string type = "message";
    if (const ojson* t = FindField(item, "type")) {
      if (!t->is_string()) Refuse(where + ".type", "must be a string");
      type = t->get<std::string>();
    }
    auto text_field = [&](const char* key) {
      const ojson* v = FindField(item, key);
      if (!v || !v->is_string()) Refuse(where + "." + key, "must be a string");
      return v->get<std::string>();
    };
    if (type == "message") {
      const std::string role = text_field("role");
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        Refuse(where + ".role", "must be one of user, system, developer, assistant, got '" + role + "'");
      const ojson* content = FindField(item, "content");
      if (!content) Refuse(where + ".content", "is required");
      if (HasImagePart(*content)) {
        if (role != "user") Refuse(where + ".content", "may hold input_image parts only in a user message");
        messages.push_back({{"role", "user"}, {"content", ChatPartsWithImages(*content, where + ".content")}});
        continue;
      }
      std::string text = PartsText(*content, where + ".content");
      if (role == "assistant") {
        messages.push_back({{"role", "assistant"}, {"content", text}});
        if (!pending_reasoning.empty()) messages.back()["reasoning_content"] = pending_reasoning;
        pending_reasoning.clear();
      } else {
        messages.push_back({{"role", role == "developer" ? "system" : role}, {"content", text}});
      }
    } else if (type == "function_call") {
      ojson call = {{"id", text_field("call_id")},
                    {"type", "function"},
                    {"function", {{"name", text_field("name")}, {"arguments", text_field("arguments")}}}};
      ojson& m = assistant();
      if (!m.contains("tool_calls")) m["tool_calls"] = ojson::array();
      m["tool_calls"].push_back(call);
    } else if (type == "function_call_output") {
      const ojson* out = FindField(item, "output");
      if (!out) Refuse(where + ".output", "is required");
      messages.push_back(
          {{"role", "tool"}, {"tool_call_id", text_field("call_id")}, {"content", PartsText(*out, where + ".output")}});
    } else if (type == "reasoning") {
      std::string text;
      if (const ojson* c = FindField(item, "content")) text = PartsText(*c, where + ".content");
      else if (const ojson* s = FindField(item, "summary")) text = PartsText(*s, where + ".summary");
      pending_reasoning += text;
    } else if (type == "item_reference") {
      Refuse(where + ".type", "'item_reference' is not supported: this server stores nothing (store: false)");
    } else {
      Refuse(where + ".type", "'" + type + "' is not supported (message, function_call, function_call_output, "
                              "reasoning)");
    }
  }
  if (messages.empty()) Refuse("input", "must not be empty");
  return messages;
}

ojson Tools(const ojson& tools) {
  if (!tools.is_array()) Refuse("tools", "must be an array");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("type") || !t["type"].is_string()) Refuse(where, "must be an object with a 'type'");
    if (t["type"] != "function")
      Refuse(where + ".type", "'" + t["type"].get<std::string>() + "' is not supported (function tools only)");
    if (!t.contains("name") || !t["name"].is_string()) Refuse(where + ".name", "must be a string");
    ojson fn = {{"name", t["name"]}};
    for (const char* key : {"description", "parameters", "strict"})
      if (const ojson* v = FindField(t, key)) fn[key] = *v;
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  return out;
}

ojson ToolChoice(const ojson& tc) {
  if (tc.is_string()) return tc;  // auto | none | required (checked by the chat path)
  if (tc.is_object() && tc.contains("type") && tc["type"] == "function") {
    if (!tc.contains("name") || !tc["name"].is_string()) Refuse("tool_choice.name", "must be a string");
    return {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
  }
  Refuse("tool_choice", "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}");
}

ojson ResponseFormat(const ojson& format) {
  if (!format.is_object() || !format.contains("type") || !format["type"].is_string())
    Refuse("text.format", "must be an object with a string 'type'");
  const std::string type = format["type"];
  if (type == "text") return nullptr;
  if (type == "json_object") return {{"type", "json_object"}};
  if (type == "json_schema") {
    ojson js = ojson::object();
    for (const char* key : {"name", "schema", "strict", "description"})
      if (const ojson* v = FindField(format, key)) js[key] = *v;
    if (!js.contains("schema")) Refuse("text.format.schema", "is required for type json_schema");
    return {{"type", "json_schema"}, {"json_schema", js}};
  }
  Refuse("text.format.type", "must be one of text, json_object, json_schema, got '" + type + "'");
}

}  // namespace

ResponsesRequest TranslateResponsesRequest(const ojson& body) {
  for (const char* key : {"previous_response_id", "conversation"})
    if (FindField(body, key))
      Refuse(key, "is not supported: this server is stateless (store: false); send the whole conversation in "
                  "'input'");
  if (const ojson* b = FindField(body, "background"); b && (!b->is_boolean() || b->get<bool>()))
    Refuse("background", "= true is not supported: responses are not stored");
  if (FindField(body, "prompt")) Refuse("prompt", "(a stored prompt template) is not supported");
  if (const ojson* s = FindField(body, "store"); s && !s->is_boolean()) Refuse("store", "must be a boolean");

  ResponsesRequest r;
  ojson& chat = r.chat_body;
  chat = ojson::object();
  if (const ojson* m = FindField(body, "model")) chat["model"] = *m;
  const ojson* input = FindField(body, "input");
  if (!input) Refuse("input", "is required");
  ojson messages = Messages(*input);
  json instructions = nullptr;
  if (const ojson* ins = FindField(body, "instructions")) {
    if (!ins->is_string()) Refuse("instructions", "must be a string");
    messages.insert(messages.begin(), ojson{{"role", "system"}, {"content", *ins}});
    instructions = ins->get<std::string>();
  }
  chat["messages"] = messages;
  if (const ojson* v = FindField(body, "max_output_tokens")) chat["max_tokens"] = *v;
  // Sampling fields with the same meaning (OpenAI's and vLLM's extensions).
  for (const char* key : {"stream", "temperature", "top_p", "seed", "top_k", "min_p", "presence_penalty",
                          "frequency_penalty", "repetition_penalty", "stop", "parallel_tool_calls",
                          "chat_template_kwargs", "priority", "request_id", "user", "metadata"})
    if (const ojson* v = FindField(body, key)) chat[key] = *v;
  json tools = json::array();
  if (const ojson* t = FindField(body, "tools")) {
    chat["tools"] = Tools(*t);
    tools = json::parse(t->dump());
  }
  json tool_choice = "auto";
  if (const ojson* tc = FindField(body, "tool_choice")) {
    chat["tool_choice"] = ToolChoice(*tc);
    tool_choice = json::parse(tc->dump());
  }
  json text = {{"format", {{"type", "text"}}}};
  if (const ojson* t = FindField(body, "text")) {
    if (!t->is_object()) Refuse("text", "must be an object");
    if (const ojson* f = FindField(*t, "format")) {
      ojson rf = ResponseFormat(*f);
      if (!rf.is_null()) chat["response_format"] = rf;
      text["format"] = json::parse(f->dump());
    }
  }
  json reasoning = {{"effort", nullptr}, {"summary", nullptr}};
  if (const ojson* rs = FindField(body, "reasoning")) {
    if (!rs->is_object()) Refuse("reasoning", "must be an object");
    if (const ojson* e = FindField(*rs, "effort")) {
      chat["reasoning_effort"] = *e;
      reasoning["effort"] = json::parse(e->dump());
    }
  }
  auto given = [&](const char* key, json fallback) {
    const ojson* v = FindField(body, key);
    return v ? json::parse(v->dump()) : fallback;
  };
  r.echo = {{"instructions", instructions},
            {"max_output_tokens", given("max_output_tokens", nullptr)},
            {"metadata", given("metadata", json::object())},
            {"parallel_tool_calls", given("parallel_tool_calls", true)},
            {"reasoning", reasoning},
            {"temperature", given("temperature", 1.0)},
            {"text", text},
            {"tool_choice", tool_choice},
            {"tools", tools},
            {"top_p", given("top_p", 1.0)}};
  if (const ojson* u = FindField(body, "user")) r.echo["user"] = json::parse(u->dump());
  return r;
}

std::string ResponsesParam(const std::string& chat_param) {
  static const std::map<std::string, std::string> kMap = {{"messages", "input"},
                                                          {"max_tokens", "max_output_tokens"},
                                                          {"max_completion_tokens", "max_output_tokens"},
                                                          {"response_format", "text.format"},
                                                          {"reasoning_effort", "reasoning.effort"}};
  // response_format.json_schema.schema... -> text.format.schema...
  const std::string schema_prefix = "response_format.json_schema";
  if (chat_param.rfind(schema_prefix, 0) == 0) return "text.format" + chat_param.substr(schema_prefix.size());
  auto it = kMap.find(chat_param);
  return it == kMap.end() ? chat_param : it->second;
}

}  // namespace dsmesh
