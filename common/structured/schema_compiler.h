// Structured-output specs -> byte NFA. A spec is the JSON object the gateway puts into
// SamplingParams.structured_output (the worker compiles the same text; identical specs share one
// compiled grammar):
//   {"type":"json_object"}                         any JSON object
//   {"type":"json_schema","schema":{...}}          a value valid under the schema (compact JSON)
//   {"type":"regex","pattern":"..."}               vLLM guided_regex / structured_outputs.regex
//   {"type":"choice","choices":["a","b"]}          vLLM guided_choice: exactly one of the strings
//   {"type":"tool_calls","tools":[{"name":N,"parameters":S},...],"min_calls":1,"max_calls":K}
//        a DeepSeek-V4 DSML tool-call block (common/chat/deepseek_v4_output_parser.h) of min..max invokes,
//        each naming one of the tools with parameters valid under its schema (strings raw with
//        string="true", everything else JSON with string="false"), then the end of the turn.
// What JSON Schema supports (everything else is a GrammarError naming the keyword): type (and type
// lists), properties/required (properties in schema order; optional ones may be left out; no others),
// additionalProperties (a schema for objects without properties), items, minItems, maxItems, enum, const,
// anyOf, oneOf (as anyOf), allOf of one schema, $ref into #/$defs or #/definitions or # (recursion unrolled
// to a bounded depth), nullable, string minLength/maxLength/pattern/format (date, time, date-time, email,
// uuid, ipv4, hostname, uri), integer and number minimum/maximum/exclusive*, annotations (title,
// description, default, examples, ...). Values are written compactly (no whitespace).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/structured/nfa.h"

namespace dsmesh::structured {

struct CompileLimits {
  int max_recursion = 3;  // expansions of one $ref on a path
  int any_depth = 3;      // nesting of free-form JSON values (json_object, schemas without a type)
};

// Builds the NFA of a spec (see above). Throws GrammarError (message names the keyword; path is a JSON
// pointer into the spec's schema) for unsupported or malformed specs, and for specs that admit no output.
Nfa CompileSpec(const nlohmann::json& spec, const CompileLimits& limits = {});

}  // namespace dsmesh::structured
