// What the OpenAI handlers do with generated text: split it into reasoning, content and tool calls.
// Chat completions use the DeepSeek-V4 streaming parser from common/chat (reasoning up to "</think>",
// DSML tool-call blocks); completions pass text through as content. One interface, so the streaming
// and non-streaming paths of both endpoints share the same code.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace dsmesh {

struct ToolCallDelta {
  int index = 0;
  std::string id;         // set on the first delta of a call
  std::string name;       // set on the first delta of a call
  std::string arguments;  // JSON text, appended across deltas
};

struct OutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class OutputSplitter {
 public:
  virtual ~OutputSplitter() = default;
  virtual OutputDelta Push(const std::string& text) = 0;
  virtual OutputDelta Finish() = 0;  // flushes anything held back
  virtual int tool_calls_seen() const = 0;
  // DSML tool-call blocks that did not parse (their text went to content; removed when tool calls are off).
  virtual int malformed_tool_call_blocks() const { return 0; }
  // Well-formed calls not returned because tool calls are off.
  virtual int suppressed_tool_calls() const { return 0; }
};

// `thinking`: the prompt opened a reasoning block, so output starts as reasoning. `tool_calls` off
// (tool_choice "none", or no tools): DSML the model writes anyway is removed, never returned
// (common/chat/deepseek_v4_output_parser.h).
std::unique_ptr<OutputSplitter> MakeChatOutputSplitter(bool thinking, const std::string& request_id,
                                                       bool tool_calls = true);
std::unique_ptr<OutputSplitter> MakePlainOutputSplitter();

}  // namespace dsmesh
