// Constrained-decoding fields of an OpenAI / vLLM request body -> the structured-output spec the worker
// compiles (common/structured/schema_compiler.h): response_format json_object / json_schema, vLLM's
// guided_json / guided_regex / guided_choice and structured_outputs {json, regex, choice}, and tool_choice
// "required" or a named function (a DSML tool-call block whose arguments match the tool's parameters).
// Every spec is compiled here once, so an unsupported schema is a 400 naming the field and the keyword.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace dsmesh {

struct StructuredRequest {
  std::string spec;         // empty: unconstrained
  bool forced_tool_call = false;
};

// `body` is the request (tools read from body["tools"] for tool_choice). Throws ApiError(400).
StructuredRequest ParseStructuredRequest(const nlohmann::ordered_json& body, bool chat);

}  // namespace dsmesh
