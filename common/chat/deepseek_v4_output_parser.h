// Splits generated DeepSeek-V4 text into what the OpenAI API returns: reasoning_content, content and
// tool_calls. Streaming-safe: feed text pieces as the detokenizer produces them (a marker such as
// "</think>" or "<｜DSML｜tool_calls>" may arrive split across pieces, even mid-character); events come
// out as soon as they are certain, and the concatenated deltas equal the one-shot parse.
//
// The generated text must keep special-token strings (decode without skipping special tokens).
//
//   thinking mode: the prompt ends with "<think>", so text is reasoning until "</think>", then content.
//   content ends at "<｜end▁of▁sentence｜>" (dropped) or at a DSML block ("\n\n<｜DSML｜tool_calls>"):
//     <｜DSML｜invoke name="NAME">
//     <｜DSML｜parameter name="K" string="true|false">VALUE</｜DSML｜parameter>
//     </｜DSML｜invoke>
//     </｜DSML｜tool_calls>
//   each invoke becomes one tool call as soon as it closes; its arguments are the JSON object the
//   official parser (encoding_dsv4.py's parse_message_from_completion_text) builds:
//   "{" + ", ".join(json.dumps(K) + ": " + V') + "}", V' = json.dumps(VALUE) for string="true" and
//   VALUE verbatim for string="false". Whatever the official parser accepts gives the same calls here.
// Beyond the official parser (it raises on all of these), so that a call the model clearly made is not lost:
//   - whitespace between the tags is free ("\r\n", blank lines, none), the block may follow content
//     without the blank line, text after the block is content;
//   - DeepSeek-V3.2's block name "<｜DSML｜function_calls>" (closed by "</｜DSML｜function_calls>") works
//     like "tool_calls";
//   - a value may quote "</｜DSML｜parameter>" when plain text follows it (the official parser ends the
//     value at any closing tag); a closing tag followed by a DSML tag or EOS always ends the value, so a
//     misspelt or missing tag after it makes the block malformed, never merges two parameters or calls;
//   - reasoning that never reaches "</think>" (max_tokens) is reasoning to the end;
//   - a DSML block inside the reasoning ends the reasoning (as vLLM's DeepSeek-V4 reasoning parser
//     does): its calls are tool calls, the text after the block is content, and a "</think>" there is
//     dropped;
//   - a block the model ends with EOS instead of its closing tag keeps the calls it completed.
// A malformed DSML block is never dropped and never fatal: from the first thing that does not parse
// (a tag or attribute out of place, string= not "true"/"false", a string="false" value that is not JSON,
// a repeated parameter, an empty name, a wrong closing tag, the output ending inside the block), its text
// is returned as content - the calls it completed before that point stand - and it is counted in
// malformed_blocks() and described in errors() for the gateway to log and count.
//
// With Options::tool_calls off (tool_choice "none", no tools) the model may still write DSML: blocks are
// parsed the same way but neither their calls nor their text are returned (suppressed_calls() and
// malformed_blocks() count them), and a stray DSML tag outside a block is removed, so no DSML text reaches
// the content.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace dsmesh {

struct GeneratedToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON object text
};

struct ChatOutputEvent {
  enum class Kind { kReasoning, kContent, kToolCall };
  Kind kind;
  std::string text;             // kReasoning / kContent: the delta
  GeneratedToolCall tool_call;  // kToolCall
  size_t tool_index = 0;        // kToolCall: 0, 1, ... in order of appearance
};

class DeepSeekV4OutputParser {
 public:
  struct Options {
    bool thinking = true;  // the prompt ended with "<think>" (thinking mode)
    // Makes tool call ids; default "call_" + 24 random alphanumerics.
    std::function<std::string()> make_tool_call_id;
    // Return tool calls (tool_choice "auto", "required", named); off: DSML is removed, see above.
    bool tool_calls = true;
  };

  explicit DeepSeekV4OutputParser(Options options);

  // Consumes the next piece of generated text; returns the events it completes.
  std::vector<ChatOutputEvent> Feed(std::string_view piece);
  // End of generation: flushes text held back while a marker could still be completing.
  std::vector<ChatOutputEvent> Finish();

  // "tool_calls" once any tool call was emitted (the OpenAI finish_reason), else "".
  const char* FinishReasonHint() const { return tool_calls_emitted_ > 0 ? "tool_calls" : ""; }
  bool saw_end_of_sentence() const { return state_ == State::kDone; }
  // Malformed DSML or text after the end of sentence; empty when the output was well formed.
  const std::vector<std::string>& errors() const { return errors_; }
  // DSML blocks (or their rest after the calls they completed) that did not parse; their text was returned
  // as content (removed when tool calls are off).
  size_t malformed_blocks() const { return malformed_blocks_; }
  // Well-formed calls not returned because tool calls are off.
  size_t suppressed_calls() const { return suppressed_calls_; }

 private:
  // kStrayTag, kSkipBlock: DSML removed because tool calls are off.
  enum class State { kReasoning, kContent, kToolCalls, kStrayTag, kSkipBlock, kDone };
  enum class InvokeStatus { kNeedMore, kComplete, kMalformed };

  void Process(bool final, std::vector<ChatOutputEvent>* events);
  bool StepText(bool final, std::vector<ChatOutputEvent>* events);
  bool StepToolCalls(bool final, std::vector<ChatOutputEvent>* events);
  bool StepStrayTag();
  bool StepSkipBlock(bool final);
  InvokeStatus ParseInvoke(size_t start, bool final, GeneratedToolCall* call, size_t* end, std::string* error);
  void Emit(ChatOutputEvent::Kind kind, std::string text, std::vector<ChatOutputEvent>* events);
  void AbandonToolBlock(size_t from, const std::string& error, std::vector<ChatOutputEvent>* events);

  Options options_;
  State state_;
  bool at_reasoning_start_;
  bool reasoning_cut_by_block_ = false;  // a DSML block ended the reasoning: a later "</think>" is dropped
  std::string pending_;       // text not yet emitted in the current state
  std::string block_opener_;  // the text that opened the current DSML block (for malformed fallback)
  std::string block_close_;   // the closing tag the current block needs (tool_calls or function_calls)
  State after_stray_tag_ = State::kContent;  // where a removed stray DSML tag returns to
  size_t calls_in_block_ = 0;
  size_t invoke_wait_from_ = 0;  // pending_ size when the current invoke last needed more text
  size_t tool_calls_emitted_ = 0;
  bool text_after_end_reported_ = false;
  size_t malformed_blocks_ = 0;
  size_t suppressed_calls_ = 0;
  std::vector<std::string> errors_;
};

// One-shot parse of a whole completion (Feed + Finish).
struct ParsedCompletion {
  std::string reasoning_content;
  std::string content;
  std::vector<GeneratedToolCall> tool_calls;
  std::vector<std::string> errors;
  size_t malformed_blocks = 0;
  size_t suppressed_calls = 0;
};
ParsedCompletion ParseDeepSeekV4Completion(std::string_view text, DeepSeekV4OutputParser::Options options);

}  // namespace dsmesh
