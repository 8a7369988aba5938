// Generated DeepSeek-V4 outputs with DSML tool-call blocks, each with the split the API must return for it,
// written from the generator's own description of the shape (never from the parser under test).
//
//   kOfficial: text DeepSeek's parse_message_from_completion_text (encoding_dsv4.py) accepts; the expected
//              calls are what it returns: arguments "{" + ", ".join(json.dumps(K) + ": " + V') + "}", V' the
//              JSON-quoted value (string="true") or the value verbatim (string="false"). Spellings: one and
//              several invokes, empty parameter lists, strings of every kind (quotes, control characters,
//              CJK, emoji, markup, DSML-looking text), JSON values of every type and layout, parameters
//              named `arguments`, `name`, `string`, whitespace in the invoke tag, after reasoning / content.
//   kLenient:  text the official parser rejects but whose calls are unambiguous (V3.2's "function_calls"
//              block, free whitespace between tags, no blank line before the block, text after it, the
//              block inside unterminated reasoning, EOS instead of the closing tag, "</｜DSML｜parameter>"
//              inside a value): the same calls as the well-formed spelling.
//   kBroken:   blocks that do not parse (unterminated, wrong closing tag, bad JSON in a string="false"
//              value, garbage or missing attributes, duplicate parameters, a call cut off inside
//              unterminated reasoning): the calls completed before the break stand, everything from the
//              break to the end of sentence is content, and one malformed block is counted.
//
// testdata/tools/check_dsml_shapes.py runs the official parser over the kOfficial shapes (dumped by the
// test when DSMESH_DSML_SHAPES_OUT names a file) and checks these expectations against it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dsmesh::dsml_shapes {

struct ExpectedCall {
  std::string name;
  std::string arguments;
};

struct Shape {
  enum class Kind { kOfficial, kLenient, kBroken };
  Kind kind;
  std::string description;
  bool thinking = false;  // the prompt opened a reasoning block
  std::string text;       // the generated text
  // What the API returns for it.
  std::string reasoning;
  std::string content;
  std::vector<ExpectedCall> calls;
  size_t malformed_blocks = 0;
  // The content when tool calls are off (tool_choice "none"): the text around the block, no DSML.
  std::string content_without_tools;
};

// `official`, `lenient` and `broken` shapes of each kind, from `seed` (the same shapes on every run and
// platform: the generator uses its own random numbers, not <random>'s distributions).
std::vector<Shape> Generate(uint64_t seed, size_t official, size_t lenient, size_t broken);

const char* KindName(Shape::Kind kind);

}  // namespace dsmesh::dsml_shapes
