#include "gateway/request_schema.h"

#include <cctype>
#include <cmath>
#include <set>

#include "gateway/api_error.h"
#include "gateway/json_field.h"

namespace dsmesh {

namespace {

using json = nlohmann::ordered_json;

[[noreturn]] void Refuse(const char* name, const std::string& message) {
  throw BadRequest(std::string("'") + name + "' " + message, name);
}

void Boolean(const json& body, const char* name, bool allow_true = true, const char* why_not = "") {
  const json* v = FindField(body, name);
  if (!v) return;
  if (!v->is_boolean()) Refuse(name, std::string("must be a boolean, got ") + v->type_name());
  if (!allow_true && v->get<bool>()) Refuse(name, std::string("= true is not supported") + why_not);
}

void String(const json& body, const char* name, size_t max_bytes = 1 << 20) {
  const json* v = FindField(body, name);
  if (!v) return;
  if (!v->is_string()) Refuse(name, std::string("must be a string, got ") + v->type_name());
  if (v->get_ref<const std::string&>().size() > max_bytes)
    Refuse(name, "is longer than " + std::to_string(max_bytes) + " bytes");
}

void Enum(const json& body, const char* name, const std::set<std::string>& values) {
  const json* v = FindField(body, name);
  if (!v) return;
  std::string list;
  for (const auto& x : values) list += (list.empty() ? "" : ", ") + x;
  if (!v->is_string()) Refuse(name, "must be one of " + list + ", got " + v->type_name());
  if (!values.count(v->get<std::string>()))
    Refuse(name, "must be one of " + list + ", got '" + v->get<std::string>() + "'");
}

void Unsupported(const json& body, const char* name, const std::string& why) {
  if (FindField(body, name)) Refuse(name, "is not supported: " + why);
}

}  // namespace

void CheckSchemaFields(const json& body, bool chat) {
  String(body, "user");
  Boolean(body, "include_stop_str_in_output", /*allow_true=*/false,
          ": stop strings are never part of the output here");
  if (const json* lb = FindField(body, "logit_bias")) {
    if (!lb->is_object()) Refuse("logit_bias", std::string("must be an object, got ") + lb->type_name());
    for (const auto& [key, value] : lb->items()) {
      bool digits = !key.empty() && key.size() <= 10;
      for (char c : key) digits = digits && std::isdigit(static_cast<unsigned char>(c));
      if (!digits) Refuse("logit_bias", "keys must be token ids (decimal integers), got '" + key.substr(0, 40) + "'");
      if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < -100 ||
          value.get<double>() > 100)
        Refuse("logit_bias", "values must be numbers between -100 and 100");
    }
    if (!lb->empty()) Refuse("logit_bias", "is not supported yet: the sampler applies no per-token bias");
  }
  if (!chat) {
    Boolean(body, "add_special_tokens");
    return;
  }
  Boolean(body, "echo", /*allow_true=*/false, " for chat completions");
  Boolean(body, "parallel_tool_calls");
  Boolean(body, "store");
  Boolean(body, "add_special_tokens");
  String(body, "prompt_cache_key", 1024);
  String(body, "safety_identifier", 256);
  Enum(body, "service_tier", {"auto", "default", "flex", "scale", "priority"});
  Enum(body, "verbosity", {"low", "medium", "high"});
  if (const json* md = FindField(body, "metadata")) {
    if (!md->is_object()) Refuse("metadata", std::string("must be an object, got ") + md->type_name());
    if (md->size() > 16) Refuse("metadata", "allows at most 16 keys");
    for (const auto& [key, value] : md->items()) {
      if (key.size() > 64) Refuse("metadata", "keys must be at most 64 characters");
      if (!value.is_string() || value.get_ref<const std::string&>().size() > 512)
        Refuse("metadata", "values must be strings of at most 512 characters");
    }
  }
  if (const json* mod = FindField(body, "modalities")) {
    if (!mod->is_array()) Refuse("modalities", std::string("must be an array, got ") + mod->type_name());
    for (const auto& m : *mod) {
      if (!m.is_string()) Refuse("modalities", "must be an array of strings");
      if (m != "text") Refuse("modalities", "'" + m.get<std::string>() + "' is not supported (text only)");
    }
  }
  if (const json* p = FindField(body, "prediction")) {  // a latency hint only: checked, then not used
    if (!p->is_object() || !p->contains("type") || (*p)["type"] != "content" || !p->contains("content"))
      Refuse("prediction", "must be an object {\"type\": \"content\", \"content\": ...}");
  }
  Unsupported(body, "functions", "the deprecated functions API; send 'tools'");
  Unsupported(body, "function_call", "the deprecated functions API; send 'tool_choice'");
  Unsupported(body, "audio", "the model has no audio output");
  Unsupported(body, "web_search_options", "the mesh has no web search");
}

std::string ChatErrorParam(const std::string& message) {
  // An image part's own field: the part ("messages[0].content[1].image_url.url must be ..." ->
  // "messages[0].content[1].image_url").
  const std::string first_word = message.substr(0, message.find_first_of(" :"));
  if (first_word.rfind("messages[", 0) == 0) {
    const size_t image = first_word.find(".image_url");
    if (image != std::string::npos) return first_word.substr(0, image + std::string(".image_url").size());
  }
  static const std::set<std::string> kFields = {"messages",        "tools", "chat_template_kwargs", "reasoning_effort",
                                                "add_generation_prompt", "tool_choice"};
  size_t n = 0;
  while (n < message.size() && (std::islower(static_cast<unsigned char>(message[n])) || message[n] == '_')) ++n;
  std::string head = message.substr(0, n);
  return kFields.count(head) ? head : "messages";
}

}  // namespace dsmesh
