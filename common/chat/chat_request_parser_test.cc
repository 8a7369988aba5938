#include "common/chat/chat_request_parser.h"

#include <gtest/gtest.h>

#include "common/chat/python_json.h"

namespace dsmesh {
namespace {

ChatRequest Parse(const std::string& body) { return ParseChatRequest(ParseJsonText(body, "body")); }

// The error message for `body`, or "" when it parses.
std::string ErrorOf(const std::string& body) {
  try {
    Parse(body);
  } catch (const ChatFormatError& e) {
    return e.what();
  }
  return "";
}

TEST(ChatRequestParserTest, ParsesAFullRequest) {
  ChatRequest r = Parse(R"({
    "model": "x", "temperature": 0.2,
    "messages": [
      {"role": "system", "content": "sys"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "reasoning_content": "think",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "result"},
      {"role": "assistant", "content": "done", "reasoning": "r2"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "chat_template_kwargs": {"thinking": false},
    "reasoning_effort": "max"
  })");
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0].role, ChatMessage::Role::kSystem);
  EXPECT_EQ(*r.messages[1].content, "a\nb");
  EXPECT_FALSE(r.messages[2].content.has_value());
  EXPECT_EQ(*r.messages[2].reasoning_content, "think");
  ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].tool_calls[0].id, "c1");
  EXPECT_EQ(r.messages[2].tool_calls[0].name, "f");
  EXPECT_EQ(r.messages[2].tool_calls[0].arguments, "{\"x\": 1}");
  EXPECT_EQ(r.messages[3].tool_call_id, "c1");
  EXPECT_EQ(*r.messages[4].reasoning_content, "r2");
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0]["function"]["name"], "f");
  EXPECT_FALSE(r.thinking);
  EXPECT_EQ(r.reasoning_effort, ReasoningEffort::kMax);
  EXPECT_TRUE(r.add_generation_prompt);
}

// Image parts stay undecoded, named by their path; the text gets one placeholder per image before it
// (vLLM's default placement).
TEST(ChatRequestParserTest, ImageParts) {
  ChatRequest r = Parse(R"({"messages": [
      {"role": "user", "content": [{"type": "text", "text": "what is"},
                                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                                   {"type": "text", "text": "this?"},
                                   {"type": "image_url", "image_url": {"url": "file:///x.jpg", "detail": "high"}}]},
      {"role": "assistant", "content": "a cat"},
      {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://e.com/a.png"}}]}]})");
  ASSERT_TRUE(r.has_images());
  ASSERT_EQ(r.messages[0].images.size(), 2u);
  EXPECT_EQ(r.messages[0].images[0].url, "data:image/png;base64,AAAA");
  EXPECT_EQ(r.messages[0].images[0].param, "messages[0].content[1].image_url");
  EXPECT_EQ(r.messages[0].images[1].url, "file:///x.jpg");
  EXPECT_EQ(r.messages[0].images[1].param, "messages[0].content[3].image_url");
  EXPECT_EQ(*r.messages[0].content, "<｜deepseek_image｜>\n<｜deepseek_image｜>\nwhat is\nthis?");
  EXPECT_TRUE(r.messages[1].images.empty());
  ASSERT_EQ(r.messages[2].images.size(), 1u);
  EXPECT_EQ(r.messages[2].images[0].param, "messages[2].content[0].image_url");
  EXPECT_EQ(*r.messages[2].content, "<｜deepseek_image｜>");
  EXPECT_FALSE(Parse(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]})").has_images());
}

TEST(ChatRequestParserTest, ThinkingSwitch) {
  const std::string m = R"("messages": [{"role": "user", "content": "hi"}])";
  EXPECT_TRUE(Parse("{" + m + "}").thinking);  // on by default, as in the reference deployment (vLLM)
  EXPECT_TRUE(Parse("{" + m + R"(, "chat_template_kwargs": {"thinking": true}})").thinking);
  EXPECT_FALSE(Parse("{" + m + R"(, "chat_template_kwargs": {"thinking": false}})").thinking);
  EXPECT_FALSE(Parse("{" + m + R"(, "chat_template_kwargs": {"enable_thinking": false}})").thinking);
  EXPECT_TRUE(Parse("{" + m + R"(, "chat_template_kwargs": {"thinking": false, "enable_thinking": true}})").thinking);
  EXPECT_TRUE(Parse("{" + m + R"(, "chat_template_kwargs": {"other": 1}})").thinking);
  EXPECT_FALSE(Parse("{" + m + R"(, "reasoning_effort": "none"})").thinking);
  EXPECT_EQ(Parse("{" + m + R"(, "reasoning_effort": "high"})").reasoning_effort, ReasoningEffort::kHigh);
  EXPECT_FALSE(Parse("{" + m + R"(, "add_generation_prompt": false})").add_generation_prompt);
}

TEST(ChatRequestParserTest, ErrorsNameTheField) {
  struct Case {
    std::string body;
    std::string error_contains;
  };
  const std::vector<Case> cases = {
      {R"([])", "request body must be a JSON object"},
      {R"({})", "messages is required"},
      {R"({"messages": {}})", "messages must be an array"},
      {R"({"messages": []})", "messages must not be empty"},
      {R"({"messages": ["hi"]})", "messages[0] must be an object"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role must be a string"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})", "messages[0].role 'robot' is not one of"},
      {R"({"messages": [{"role": "developer", "content": "x"}]})", "messages[0].role 'developer' is not supported"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content is required for role 'user'"},
      {R"({"messages": [{"role": "user", "content": null}]})", "messages[0].content is required"},
      {R"({"messages": [{"role": "system", "content": 5}]})", "messages[0].content must be a string, null or an array"},
      {R"({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]})",
       "messages[0].content[0].type 'input_audio' is not supported (text and image_url parts only)"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content[0].image_url must be an object {\"url\": ...}"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "data:x"}]}]})",
       "messages[0].content[0].image_url must be an object"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}]}]})",
       "messages[0].content[1].image_url.url must be a string"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x", "detail": "max"}}]}]})",
       "messages[0].content[0].image_url.detail must be one of auto, low, high"},
      {R"({"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})",
       "messages[0].content[0]: image parts are only allowed in user messages, not 'system'"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", "messages[0].content[0].text must be a string"},
      {R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})",
       "messages[0].tool_calls is only allowed on assistant messages"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": {}}]})",
       "messages[1].tool_calls must be an array"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]})",
       "messages[0].tool_calls[0].function.name must be a non-empty string"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]})",
       "messages[0].tool_calls[0].function.arguments must be a string holding JSON"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f", "arguments": ""}}]}]})",
       "messages[0].tool_calls[0].type must be \"function\""},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"id": 7, "function": {"name": "f", "arguments": ""}}]}]})",
       "messages[0].tool_calls[0].id must be a string"},
      {R"({"messages": [{"role": "assistant", "content": "a", "reasoning_content": 3}]})",
       "messages[0].reasoning_content must be a string"},
      {R"({"messages": [{"role": "assistant", "content": "a", "reasoning_content": "x", "reasoning": "y"}]})",
       "disagree"},
      {R"({"messages": [{"role": "tool", "content": "r", "tool_call_id": 1}]})", "messages[0].tool_call_id must be a string"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})", "tools must be an array"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})",
       "tools[0].function must be an object"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "f"}}]})",
       "tools[0].type must be \"function\""},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": ""}}]})",
       "tools[0].function.name must be a non-empty string"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"thinking": "yes"}})",
       "chat_template_kwargs.thinking must be a boolean"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": []})",
       "chat_template_kwargs must be an object"},
      {R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"})",
       "reasoning_effort 'extreme' is not one of"},
      {R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": 1})",
       "add_generation_prompt must be a boolean"},
  };
  for (const Case& c : cases) {
    std::string error = ErrorOf(c.body);
    EXPECT_NE(error.find(c.error_contains), std::string::npos) << c.body << "\n  error: " << error;
  }
}

}  // namespace
}  // namespace dsmesh
