#include "gateway/structured_request.h"

#include "common/structured/schema_compiler.h"
#include "gateway/api_error.h"

namespace dsmesh {

namespace {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

json Plain(const ojson& v) { return json::parse(v.dump()); }

// Compiles the spec; a GrammarError becomes a 400 naming `field` (and the schema path).
std::string Checked(const json& spec, const std::string& field) {
  try {
    structured::CompileSpec(spec);
  } catch (const structured::GrammarError& e) {
    std::string where = e.path.empty() ? "" : " (at " + field + e.path + ")";
    throw BadRequest(std::string("unsupported ") + field + ": " + e.what() + where, field);
  } catch (const std::exception& e) {
    throw BadRequest(std::string("invalid ") + field + ": " + e.what(), field);
  }
  return spec.dump();
}

}  // namespace

StructuredRequest ParseStructuredRequest(const ojson& body, bool chat) {
  StructuredRequest out;
  auto set = [&](const json& spec, const std::string& field) {
    if (!out.spec.empty())
      throw BadRequest("only one of response_format, guided_*, structured_outputs and a forced tool_choice may "
                       "constrain the output",
                       field);
    out.spec = Checked(spec, field);
  };
  if (auto rf = body.find("response_format"); rf != body.end() && !rf->is_null()) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      throw BadRequest("'response_format' must be an object with a string 'type'", "response_format");
    const std::string type = (*rf)["type"].get<std::string>();
    if (type == "json_object") {
      set({{"type", "json_object"}}, "response_format");
    } else if (type == "json_schema") {
      auto js = rf->find("json_schema");
      if (js == rf->end() || !js->is_object())
        throw BadRequest("response_format.json_schema must be an object with 'name' and 'schema'",
                         "response_format.json_schema");
      auto schema = js->find("schema");
      if (schema == js->end() || !(schema->is_object() || schema->is_boolean()))
        throw BadRequest("response_format.json_schema.schema must be a JSON Schema object",
                         "response_format.json_schema.schema");
      set({{"type", "json_schema"}, {"schema", Plain(*schema)}}, "response_format.json_schema.schema");
    } else if (type != "text") {
      throw BadRequest("response_format type '" + type + "' is not supported: use text, json_object or json_schema",
                       "response_format.type");
    }
  }
  // vLLM's extensions.
  auto guided = [&](const ojson& holder, const std::string& prefix, const char* json_key, const char* regex_key,
                    const char* choice_key) {
    if (auto g = holder.find(json_key); g != holder.end() && !g->is_null()) {
      json schema = g->is_string() ? json::parse(g->get<std::string>(), nullptr, false) : Plain(*g);
      if (schema.is_discarded() || !(schema.is_object() || schema.is_boolean()))
        throw BadRequest("'" + prefix + json_key + "' must be a JSON Schema", prefix + json_key);
      set({{"type", "json_schema"}, {"schema", schema}}, prefix + json_key);
    }
    if (auto g = holder.find(regex_key); g != holder.end() && !g->is_null()) {
      if (!g->is_string()) throw BadRequest("'" + prefix + regex_key + "' must be a string", prefix + regex_key);
      set({{"type", "regex"}, {"pattern", g->get<std::string>()}}, prefix + regex_key);
    }
    if (auto g = holder.find(choice_key); g != holder.end() && !g->is_null()) {
      if (!g->is_array() || g->empty())
        throw BadRequest("'" + prefix + choice_key + "' must be a non-empty array of strings", prefix + choice_key);
      set({{"type", "choice"}, {"choices", Plain(*g)}}, prefix + choice_key);
    }
  };
  guided(body, "", "guided_json", "guided_regex", "guided_choice");
  if (auto so = body.find("structured_outputs"); so != body.end() && !so->is_null()) {
    if (!so->is_object()) throw BadRequest("'structured_outputs' must be an object", "structured_outputs");
    guided(*so, "structured_outputs.", "json", "regex", "choice");
  }

  auto tc = body.find("tool_choice");
  if (!chat || tc == body.end() || tc->is_null()) return out;
  std::string forced_name;
  bool required = false;
  if (tc->is_string()) {
    if (*tc == "required") required = true;
    else if (*tc != "auto" && *tc != "none")
      throw BadRequest("tool_choice must be 'auto', 'none', 'required' or {\"type\":\"function\",\"function\":{\"name\":...}}",
                       "tool_choice");
  } else if (tc->is_object() && tc->contains("function") && (*tc)["function"].is_object() &&
             (*tc)["function"].contains("name") && (*tc)["function"]["name"].is_string()) {
    forced_name = (*tc)["function"]["name"].get<std::string>();
  } else {
    throw BadRequest("tool_choice must be 'auto', 'none', 'required' or {\"type\":\"function\",\"function\":{\"name\":...}}",
                     "tool_choice");
  }
  if (!required && forced_name.empty()) return out;
  auto tools = body.find("tools");
  if (tools == body.end() || !tools->is_array() || tools->empty())
    throw BadRequest("tool_choice '" + std::string(required ? "required" : forced_name) + "' needs a non-empty 'tools'",
                     "tool_choice");
  json list = json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const ojson& t = (*tools)[i];
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
        !t["function"]["name"].is_string())
      throw BadRequest("tools[" + std::to_string(i) + "] must be {\"type\":\"function\",\"function\":{\"name\":...}}",
                       "tools");
    const std::string name = t["function"]["name"].get<std::string>();
    if (!forced_name.empty() && name != forced_name) continue;
    json params = t["function"].contains("parameters") ? Plain(t["function"]["parameters"]) : json::object();
    list.push_back({{"name", name}, {"parameters", params}});
  }
  if (list.empty()) throw BadRequest("tool_choice names '" + forced_name + "', which is not in 'tools'", "tool_choice");
  bool parallel = true;
  if (auto p = body.find("parallel_tool_calls"); p != body.end() && p->is_boolean()) parallel = p->get<bool>();
  const int max_calls = forced_name.empty() && parallel ? 8 : 1;
  set({{"type", "tool_calls"}, {"tools", list}, {"min_calls", 1}, {"max_calls", max_calls}}, "tools");
  out.forced_tool_call = true;
  return out;
}

}  // namespace dsmesh
