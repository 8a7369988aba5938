#include "gateway/output_splitter.h"

#include <spdlog/spdlog.h>

#include "common/chat/deepseek_v4_output_parser.h"

namespace dsmesh {

namespace {

class ChatSplitter : public OutputSplitter {
 public:
  ChatSplitter(bool thinking, std::string request_id, bool tool_calls)
      : parser_(DeepSeekV4OutputParser::Options{thinking, nullptr, tool_calls}), request_id_(std::move(request_id)) {}

  OutputDelta Push(const std::string& text) override { return Convert(parser_.Feed(text)); }

  OutputDelta Finish() override {
    OutputDelta d = Convert(parser_.Finish());
    // Malformed DSML is returned as content by the parser; say so in the log once per request.
    for (const auto& e : parser_.errors()) spdlog::warn("request {}: model output: {}", request_id_, e);
    return d;
  }

  int tool_calls_seen() const override { return tool_calls_; }
  int malformed_tool_call_blocks() const override { return static_cast<int>(parser_.malformed_blocks()); }
  int suppressed_tool_calls() const override { return static_cast<int>(parser_.suppressed_calls()); }

 private:
  OutputDelta Convert(const std::vector<ChatOutputEvent>& events) {
    OutputDelta d;
    for (const auto& e : events) {
      switch (e.kind) {
        case ChatOutputEvent::Kind::kReasoning: d.reasoning += e.text; break;
        case ChatOutputEvent::Kind::kContent: d.content += e.text; break;
        case ChatOutputEvent::Kind::kToolCall:
          d.tool_calls.push_back(ToolCallDelta{static_cast<int>(e.tool_index), e.tool_call.id, e.tool_call.name,
                                               e.tool_call.arguments});
          ++tool_calls_;
          break;
      }
    }
    return d;
  }

  DeepSeekV4OutputParser parser_;
  std::string request_id_;
  int tool_calls_ = 0;
};

class PlainSplitter : public OutputSplitter {
 public:
  OutputDelta Push(const std::string& text) override {
    OutputDelta d;
    d.content = text;
    return d;
  }
  OutputDelta Finish() override { return {}; }
  int tool_calls_seen() const override { return 0; }
};

}  // namespace

std::unique_ptr<OutputSplitter> MakeChatOutputSplitter(bool thinking, const std::string& request_id,
                                                       bool tool_calls) {
  return std::make_unique<ChatSplitter>(thinking, request_id, tool_calls);
}

std::unique_ptr<OutputSplitter> MakePlainOutputSplitter() { return std::make_unique<PlainSplitter>(); }

}  // namespace dsmesh
