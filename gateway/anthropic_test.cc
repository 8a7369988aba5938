// The Anthropic Messages API pieces without a server: the request translator (every block kind, the field
// mappings, the 400s Anthropic gives) feeding the chat path's own parsers, and the writer's event sequence
// and message body for thinking + text + tool_use outputs, stop reasons and error bodies.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/chat/chat_request_parser.h"
#include "gateway/anthropic_request.h"
#include "gateway/api_error.h"
#include "gateway/generation_session.h"
#include "gateway/generation_writer.h"
#include "gateway/request_options.h"
#include "gateway/structured_request.h"

namespace dsmesh {
namespace {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

AnthropicRequest Translate(const std::string& body, bool count_tokens = false) {
  return TranslateAnthropicRequest(ojson::parse(body), "served", count_tokens);
}

// The 400's message, or "" when the body translates.
std::string Refusal(const std::string& body, bool count_tokens = false) {
  try {
    Translate(body, count_tokens);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.type, "invalid_request_error");
    return e.what();
  }
  return "";
}

TEST(AnthropicRequest, ConversationWithToolRoundTripBecomesChatMessages) {
  AnthropicRequest r = Translate(R"({
    "model": "claude-sonnet-4-5", "max_tokens": 64,
    "system": [{"type": "text", "text": "Be terse."}, {"type": "text", "text": "Use tools.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
      {"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Need the tool.", "signature": ""},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo", "days": 2}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "3 C"}]},
        {"type": "text", "text": "And tomorrow?"}]}],
    "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
    "stop_sequences": ["END"], "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stream": true,
    "metadata": {"user_id": "u-1"}})");
  EXPECT_EQ(r.model, "claude-sonnet-4-5");
  const ojson& c = r.chat_body;
  EXPECT_EQ(c["model"], "served");  // a claude-* name is served by the loaded model
  EXPECT_EQ(c["max_tokens"], 64);
  EXPECT_EQ(c["stop"], ojson::array({"END"}));
  EXPECT_EQ(c["tool_choice"], "auto");
  EXPECT_EQ(c["parallel_tool_calls"], false);
  EXPECT_EQ(c["chat_template_kwargs"]["thinking"], false);  // Anthropic's default: no thinking
  ASSERT_EQ(c["messages"].size(), 5u);
  EXPECT_EQ(c["messages"][0], ojson({{"role", "system"}, {"content", "Be terse.\nUse tools."}}));
  EXPECT_EQ(c["messages"][2]["reasoning_content"], "Need the tool.");
  EXPECT_EQ(c["messages"][2]["tool_calls"][0]["function"]["arguments"], R"({"city":"Oslo","days":2})");
  EXPECT_EQ(c["messages"][3], ojson({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "3 C"}}));
  EXPECT_EQ(c["messages"][4]["role"], "user");
  EXPECT_EQ(c["tools"][0]["function"]["parameters"]["type"], "object");

  // The chat path takes it as it is: no field ignored, the conversation parses.
  RequestOptions options = ParseRequestOptions(c, /*chat=*/true);
  EXPECT_TRUE(options.ignored_fields.empty());
  EXPECT_TRUE(options.stream);
  EXPECT_EQ(options.sampling.top_k(), 40);
  ChatRequest chat = ParseChatRequest(c);
  EXPECT_FALSE(chat.thinking);
  ASSERT_EQ(chat.messages.size(), 5u);
  EXPECT_EQ(chat.messages[2].content, "Checking.");
  EXPECT_EQ(chat.messages[2].tool_calls[0].id, "toolu_1");
  EXPECT_EQ(chat.messages[3].role, ChatMessage::Role::kTool);
}

TEST(AnthropicRequest, ImagesBecomeImageUrlParts) {
  AnthropicRequest r = Translate(R"({"model": "served", "max_tokens": 8, "messages": [{"role": "user", "content": [
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}},
    {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
    {"type": "text", "text": "What is it?"}]}]})");
  const ojson& parts = r.chat_body["messages"][0]["content"];
  EXPECT_EQ(parts[0]["image_url"]["url"], "data:image/png;base64,iVBORw0K");
  EXPECT_EQ(parts[1]["image_url"]["url"], "https://example.com/a.png");
  EXPECT_EQ(ParseChatRequest(r.chat_body).messages[0].images.size(), 2u);
}

TEST(AnthropicRequest, ThinkingAndToolChoiceMappings) {
  auto body = [](const std::string& extra) {
    return R"({"model": "m", "max_tokens": 2048, "messages": [{"role": "user", "content": "hi"}],
               "tools": [{"name": "f", "input_schema": {"type": "object"}}])" + extra + "}";
  };
  EXPECT_EQ(Translate(body(R"(, "thinking": {"type": "enabled", "budget_tokens": 1024})")).chat_body["chat_template_kwargs"]["thinking"], true);
  EXPECT_EQ(Translate(body(R"(, "thinking": {"type": "adaptive"})")).chat_body["chat_template_kwargs"]["thinking"], true);
  EXPECT_EQ(Translate(body(R"(, "thinking": {"type": "disabled"})")).chat_body["chat_template_kwargs"]["thinking"], false);
  EXPECT_EQ(Translate(body(R"(, "tool_choice": {"type": "any"})")).chat_body["tool_choice"], "required");
  EXPECT_EQ(Translate(body(R"(, "tool_choice": {"type": "none"})")).chat_body["tool_choice"], "none");
  ojson named = Translate(body(R"(, "tool_choice": {"type": "tool", "name": "f"})")).chat_body;
  EXPECT_EQ(named["tool_choice"]["function"]["name"], "f");
  // A forced call is constrained decoding (the schema of the named tool).
  EXPECT_TRUE(ParseStructuredRequest(named, true).forced_tool_call);
  ojson effort = Translate(body(R"(, "output_config": {"effort": "max", "format": {"type": "json_schema", "schema": {"type": "object"}}})")).chat_body;
  EXPECT_EQ(effort["reasoning_effort"], "max");
  EXPECT_FALSE(ParseStructuredRequest(effort, true).spec.empty());
}

TEST(AnthropicRequest, RefusalsNameTheField) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  EXPECT_NE(Refusal(R"({"model": "m", )" + msgs + "}").find("max_tokens: Field required"), std::string::npos);
  EXPECT_EQ(Refusal(R"({"model": "m", )" + msgs + "}", /*count_tokens=*/true), "");  // count_tokens needs none
  EXPECT_NE(Refusal(R"({"max_tokens": 5, )" + msgs + "}").find("model: Field required"), std::string::npos);
  EXPECT_NE(Refusal(R"({"model": "m", "max_tokens": 0, )" + msgs + "}").find("max_tokens"), std::string::npos);
  EXPECT_NE(Refusal(R"({"model": "m", "max_tokens": 5, "messages": []})").find("messages: must not be empty"), std::string::npos);
  EXPECT_NE(Refusal(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})").find("messages.0.role"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]})")
                .find("messages.0.content.0.type: 'document' is not supported"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]})")
                .find("allowed in assistant turns only"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": "x"}]}]})")
                .find("messages.0.content.0.input: must be an object"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"model": "m", "max_tokens": 5, )" + msgs + R"(, "thinking": {"type": "enabled", "budget_tokens": 100}})")
                .find("thinking.budget_tokens: must be greater than or equal to 1024"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"model": "m", "max_tokens": 5, )" + msgs +
                    R"(, "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "any"}, "thinking": {"type": "enabled", "budget_tokens": 1024}})")
                .find("tool_choice forces tool use"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"model": "m", "max_tokens": 5, )" + msgs + R"(, "tools": [{"type": "web_search_20250305", "name": "web_search"}]})")
                .find("only custom tools"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"model": "m", "max_tokens": 5, )" + msgs + R"(, "stop_sequences": ["a", ""]})").find("stop_sequences.1"),
            std::string::npos);
}

TEST(AnthropicError, BodyShapeAndTypes) {
  json body = json::parse(AnthropicErrorBody(400, "max_tokens: Field required", "req_1"));
  EXPECT_EQ(body, json({{"type", "error"},
                        {"error", {{"type", "invalid_request_error"}, {"message", "max_tokens: Field required"}}},
                        {"request_id", "req_1"}}));
  EXPECT_EQ(AnthropicErrorType(401), "authentication_error");
  EXPECT_EQ(AnthropicErrorType(404), "not_found_error");
  EXPECT_EQ(AnthropicErrorType(413), "request_too_large");
  EXPECT_EQ(AnthropicErrorType(429), "rate_limit_error");
  EXPECT_EQ(AnthropicErrorType(503), "overloaded_error");
  EXPECT_EQ(AnthropicErrorType(500), "api_error");
}

// ---- the writer ------------------------------------------------------------------------------

struct Events {
  std::vector<std::string> types;
  std::vector<json> data;
};

Events Parse(const std::string& sse) {
  Events e;
  size_t at = 0;
  while (at < sse.size()) {
    size_t end = sse.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "unterminated event";
    const std::string frame = sse.substr(at, end - at);
    at = end + 2;
    const size_t nl = frame.find('\n');
    EXPECT_EQ(frame.rfind("event: ", 0), 0u) << frame;
    const std::string type = frame.substr(7, nl - 7);
    json data = json::parse(frame.substr(nl + 7));  // "\ndata: "
    EXPECT_EQ(data["type"], type) << frame;
    e.types.push_back(type);
    e.data.push_back(data);
  }
  return e;
}

GenerationJob Job() {
  GenerationJob job;
  job.api = GenerationApi::kAnthropic;
  job.request_id = "abc";
  job.model_name = "served";
  job.prompt_ids = {1, 2, 3, 4, 5};
  job.echo = {{"model", "claude-haiku-4-5"}};
  return job;
}

OutputDelta Delta(std::string reasoning, std::string content, std::vector<ToolCallDelta> calls = {}) {
  OutputDelta d;
  d.reasoning = std::move(reasoning);
  d.content = std::move(content);
  d.tool_calls = std::move(calls);
  return d;
}

TEST(AnthropicWriter, StreamedEventSequenceMatchesTheBody) {
  const std::vector<OutputDelta> deltas = {
      Delta("Let me ", ""), Delta("check.", ""), Delta("", "Calling."),
      Delta("", "", {{0, "call_1", "get_weather", "{\"city\":"}}), Delta("", "", {{0, "", "", "\"Oslo\"}"}}),
      Delta("", "", {{1, "call_2", "get_time", ""}}), Delta("", "", {{1, "", "", "{}"}})};
  ChoiceOutput out;
  for (const auto& d : deltas) AppendDelta(d, &out.total);
  out.finish_reason = "tool_calls";
  UsageCounts usage;
  usage.prompt_tokens = 5;
  usage.cached_tokens = 2;
  usage.completion_tokens = 9;
  usage.reasoning_tokens = 3;

  GenerationJob job = Job();
  std::string sse;
  GenerationWriter::Send send = [&](const std::string& bytes) { sse += bytes; };
  auto writer = MakeAnthropicWriter(job);
  writer->Start(send);
  for (const auto& d : deltas) writer->Delta(send, 0, d, json::array(), usage);
  writer->ChoiceEnd(send, out, usage);
  writer->End(send, {out}, usage);
  Events e = Parse(sse);
  const std::vector<std::string> expected = {
      "message_start", "ping",
      "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",  // thinking
      "content_block_start", "content_block_delta", "content_block_stop",                         // text
      "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",  // tool_use 0
      "content_block_start", "content_block_delta", "content_block_stop",                         // tool_use 1
      "message_delta", "message_stop"};
  EXPECT_EQ(e.types, expected);
  EXPECT_EQ(e.data[0]["message"]["model"], "claude-haiku-4-5");
  EXPECT_EQ(e.data[0]["message"]["id"], "msg_abc");
  EXPECT_EQ(e.data[0]["message"]["stop_reason"], nullptr);
  EXPECT_EQ(e.data[0]["message"]["usage"]["input_tokens"], 5);
  EXPECT_EQ(e.data[2]["content_block"], json({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}));
  EXPECT_EQ(e.data[3]["delta"], json({{"type", "thinking_delta"}, {"thinking", "Let me "}}));
  EXPECT_EQ(e.data[7]["delta"], json({{"type", "text_delta"}, {"text", "Calling."}}));
  EXPECT_EQ(e.data[9]["content_block"],
            json({{"type", "tool_use"}, {"id", "call_1"}, {"name", "get_weather"}, {"input", json::object()}}));
  EXPECT_EQ(e.data[10]["delta"], json({{"type", "input_json_delta"}, {"partial_json", "{\"city\":"}}));
  for (size_t i = 2; i < 16; ++i) EXPECT_EQ(e.data[i]["index"], i < 6 ? 0 : i < 9 ? 1 : i < 13 ? 2 : 3) << i;
  EXPECT_EQ(e.data[16]["delta"], json({{"stop_reason", "tool_use"}, {"stop_sequence", nullptr}}));
  EXPECT_EQ(e.data[16]["usage"]["output_tokens"], 9);
  EXPECT_EQ(e.data[16]["usage"]["input_tokens"], 3);
  EXPECT_EQ(e.data[16]["usage"]["cache_read_input_tokens"], 2);

  json body = json::parse(MakeAnthropicWriter(job)->Body({out}, usage));
  EXPECT_EQ(body["type"], "message");
  EXPECT_EQ(body["role"], "assistant");
  EXPECT_EQ(body["stop_reason"], "tool_use");
  ASSERT_EQ(body["content"].size(), 4u);
  EXPECT_EQ(body["content"][0], json({{"type", "thinking"}, {"thinking", "Let me check."}, {"signature", ""}}));
  EXPECT_EQ(body["content"][1], json({{"type", "text"}, {"text", "Calling."}}));
  EXPECT_EQ(body["content"][2]["input"], json({{"city", "Oslo"}}));
  EXPECT_EQ(body["content"][3]["input"], json::object());
  EXPECT_EQ(body["usage"]["output_tokens_details"]["thinking_tokens"], 3);
}

TEST(AnthropicWriter, StopReasonsAndErrors) {
  GenerationJob job = Job();
  auto stop_of = [&](const std::string& finish, json stop_reason) {
    ChoiceOutput out;
    out.total.content = "x";
    out.finish_reason = finish;
    out.stop_reason = stop_reason;
    json body = json::parse(MakeAnthropicWriter(job)->Body({out}, UsageCounts{}));
    return std::make_pair(body["stop_reason"], body["stop_sequence"]);
  };
  EXPECT_EQ(stop_of("stop", nullptr), std::make_pair(json("end_turn"), json(nullptr)));
  EXPECT_EQ(stop_of("stop", 1), std::make_pair(json("end_turn"), json(nullptr)));  // the EOS id
  EXPECT_EQ(stop_of("stop", "END"), std::make_pair(json("stop_sequence"), json("END")));
  EXPECT_EQ(stop_of("length", nullptr), std::make_pair(json("max_tokens"), json(nullptr)));

  auto writer = MakeAnthropicWriter(job);
  json refused = json::parse(writer->ErrorResponseBody(ApiError(429, "queue full", "rate_limit_error")));
  EXPECT_EQ(refused["error"]["type"], "rate_limit_error");
  EXPECT_EQ(refused["request_id"], "req_abc");
  std::string sse;
  writer->Error([&](const std::string& b) { sse += b; }, ApiError(503, "mesh lost", "unavailable_error"));
  Events e = Parse(sse);
  ASSERT_EQ(e.types, std::vector<std::string>{"error"});
  EXPECT_EQ(e.data[0]["error"], json({{"type", "overloaded_error"}, {"message", "mesh lost"}}));
}

}  // namespace
}  // namespace dsmesh
