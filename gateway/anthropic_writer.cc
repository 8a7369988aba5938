// /v1/messages framing (Anthropic's Messages API): the model's output as content blocks -- a `thinking`
// block while V4 reasons, a `text` block for the answer, one `tool_use` block per tool call (its input
// the call's arguments as a JSON object) -- inside a `message` object whose stop_reason says why it ended
// (end_turn, max_tokens, stop_sequence, tool_use). Streaming emits Anthropic's event sequence:
// message_start, ping, then per block content_block_start, content_block_delta (text_delta,
// thinking_delta, input_json_delta) ..., content_block_stop, and finally message_delta (stop_reason,
// usage) and message_stop; a failure mid-stream is an `error` event. One block builder serves both
// modes: non-streaming feeds it the whole output with no one listening.
#include <nlohmann/json.hpp>

#include "gateway/anthropic_request.h"
#include "gateway/generation_session.h"
#include "gateway/generation_writer.h"

namespace dsmesh {

namespace {

using json = nlohmann::json;

class AnthropicWriter : public GenerationWriter {
 public:
  explicit AnthropicWriter(const GenerationJob& job) : job_(job) {}

  void Start(const Send& send) override {
    UsageCounts usage;
    usage.prompt_tokens = static_cast<int>(job_.prompt_ids.size());
    Emit(&send, "message_start", {{"message", Message(nullptr, usage)}});
    Emit(&send, "ping", json::object());
  }

  void Delta(const Send& send, int index, const OutputDelta& delta, const json&, const UsageCounts&) override {
    if (index == 0) Feed(&send, delta);
  }

  void ChoiceEnd(const Send&, const ChoiceOutput&, const UsageCounts&) override {}

  void End(const Send& send, const std::vector<ChoiceOutput>& choices, const UsageCounts& usage) override {
    Close(&send);
    const ChoiceOutput& c = choices.front();
    Emit(&send, "message_delta",
         {{"delta", {{"stop_reason", StopReason(c)}, {"stop_sequence", StopSequence(c)}}}, {"usage", Usage(usage)}});
    Emit(&send, "message_stop", json::object());
  }

  void Error(const Send& send, const ApiError& error) override {
    send("event: error\ndata: " + AnthropicErrorBody(error.status, error.what(), "") + "\n\n");
  }

  std::string ErrorResponseBody(const ApiError& error) override {
    return AnthropicErrorBody(error.status, error.what(), "req_" + job_.request_id);
  }

  std::string Body(const std::vector<ChoiceOutput>& choices, const UsageCounts& usage) override {
    const ChoiceOutput& c = choices.front();
    Feed(nullptr, c.total);
    Close(nullptr);
    return DumpJson(Message(&c, usage));
  }

 private:
  enum class Kind { kNone, kThinking, kText, kToolUse };

  std::string Model() const {
    auto m = job_.echo.find("model");
    return m != job_.echo.end() && m->is_string() ? m->get<std::string>() : job_.model_name;
  }

  // Anthropic counts cached prompt tokens apart: input_tokens + cache_read_input_tokens is the prompt.
  static json Usage(const UsageCounts& u) {
    return {{"input_tokens", u.prompt_tokens - u.cached_tokens},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", u.cached_tokens},
            {"output_tokens", u.completion_tokens},
            {"output_tokens_details", {{"thinking_tokens", u.reasoning_tokens}}},
            {"service_tier", "standard"}};
  }

  static json StopReason(const ChoiceOutput& c) {
    if (c.finish_reason == "tool_calls") return "tool_use";
    if (c.finish_reason == "length") return "max_tokens";
    if (c.stop_reason.is_string()) return "stop_sequence";
    return "end_turn";
  }

  static json StopSequence(const ChoiceOutput& c) { return c.stop_reason.is_string() ? c.stop_reason : json(nullptr); }

  // `choice` null: the message_start shape (no content yet, no stop reason).
  json Message(const ChoiceOutput* choice, const UsageCounts& usage) const {
    return {{"id", "msg_" + job_.request_id},
            {"type", "message"},
            {"role", "assistant"},
            {"model", Model()},
            {"content", choice ? blocks_ : json::array()},
            {"stop_reason", choice ? StopReason(*choice) : json(nullptr)},
            {"stop_sequence", choice ? StopSequence(*choice) : json(nullptr)},
            {"usage", Usage(usage)}};
  }

  void Emit(const Send* send, const std::string& type, json event) {
    if (!send) return;
    json framed = {{"type", type}};
    for (auto& [key, value] : event.items()) framed[key] = value;
    (*send)("event: " + type + "\ndata: " + DumpJson(framed) + "\n\n");
  }

  int index() const { return static_cast<int>(blocks_.size()) - 1; }

  void Open(const Send* send, Kind kind, const ToolCallDelta* call) {
    Close(send);
    open_ = kind;
    if (kind == Kind::kThinking) {
      blocks_.push_back({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    } else if (kind == Kind::kText) {
      blocks_.push_back({{"type", "text"}, {"text", ""}});
    } else {
      open_call_ = call->index;
      arguments_.clear();
      blocks_.push_back({{"type", "tool_use"}, {"id", call->id}, {"name", call->name}, {"input", json::object()}});
    }
    Emit(send, "content_block_start", {{"index", index()}, {"content_block", blocks_.back()}});
  }

  void Close(const Send* send) {
    if (open_ == Kind::kNone) return;
    if (open_ == Kind::kToolUse) {
      // The arguments the decoder assembled are a JSON object; anything else (never expected) stays
      // visible as a string rather than being dropped.
      json input = json::parse(arguments_.empty() ? "{}" : arguments_, nullptr, false);
      blocks_.back()["input"] = input.is_object() ? input : json{{"arguments", arguments_}};
    }
    open_ = Kind::kNone;
    Emit(send, "content_block_stop", {{"index", index()}});
  }

  void Text(const Send* send, Kind kind, const std::string& text) {
    if (text.empty()) return;
    if (open_ != kind) Open(send, kind, nullptr);
    const char* field = kind == Kind::kThinking ? "thinking" : "text";
    blocks_.back()[field] = blocks_.back()[field].get<std::string>() + text;
    Emit(send, "content_block_delta",
         {{"index", index()},
          {"delta", {{"type", kind == Kind::kThinking ? "thinking_delta" : "text_delta"}, {field, text}}}});
  }

  void Feed(const Send* send, const OutputDelta& d) {
    Text(send, Kind::kThinking, d.reasoning);
    Text(send, Kind::kText, d.content);
    for (const auto& tc : d.tool_calls) {
      if (open_ != Kind::kToolUse || open_call_ != tc.index) Open(send, Kind::kToolUse, &tc);
      if (tc.arguments.empty()) continue;
      arguments_ += tc.arguments;
      Emit(send, "content_block_delta",
           {{"index", index()}, {"delta", {{"type", "input_json_delta"}, {"partial_json", tc.arguments}}}});
    }
  }

  const GenerationJob& job_;
  json blocks_ = json::array();
  Kind open_ = Kind::kNone;
  int open_call_ = -1;
  std::string arguments_;  // the open tool_use block's argument text so far
};

}  // namespace

std::unique_ptr<GenerationWriter> MakeAnthropicWriter(const GenerationJob& job) {
  return std::make_unique<AnthropicWriter>(job);
}

}  // namespace dsmesh
