// DeepSeek-V4 prompts against the official encoder: testdata/v4_expected/ holds what encoding_dsv4.py
// produced for every conversation in testdata/conversations/, in thinking and chat mode
// (testdata/README.md says how). Byte for byte.
#include "common/chat/deepseek_v4_prompt.h"

#include <gtest/gtest.h>

#include "common/chat/chat_request_parser.h"
#include "common/chat/chat_test_util.h"
#include "common/chat/python_json.h"

namespace dsmesh {
namespace {

using chat_test::kTestdata;

// Where the first difference is, with some context, so a failure is readable.
std::string FirstDifference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  size_t from = i > 60 ? i - 60 : 0;
  return "first difference at byte " + std::to_string(i) + "\n  want: ..." + want.substr(from, 120) +
         "\n  got:  ..." + got.substr(from, 120);
}

TEST(DeepSeekV4PromptTest, MatchesOfficialEncoderOnEveryConversation) {
  std::vector<std::string> files = chat_test::ListFiles(std::string(kTestdata) + "/conversations", ".json");
  ASSERT_GE(files.size(), 30u);
  int compared = 0;
  for (const std::string& file : files) {
    std::string name = chat_test::Basename(file);
    name.resize(name.size() - 5);
    ChatRequest request = chat_test::LoadConversation(file);
    for (bool thinking : {true, false}) {
      SCOPED_TRACE(name + (thinking ? " (thinking)" : " (chat)"));
      request.thinking = thinking;
      if (!request.add_generation_prompt) {
        EXPECT_THROW(RenderDeepSeekV4Prompt(request), ChatFormatError);
        continue;
      }
      std::string expected = chat_test::ReadFile(std::string(kTestdata) + "/v4_expected/" + name + "." +
                                                 (thinking ? "thinking" : "chat") + ".txt");
      std::string got = RenderDeepSeekV4Prompt(request);
      EXPECT_EQ(got, expected) << FirstDifference(expected, got);
      ++compared;
    }
  }
  EXPECT_GE(compared, 60);
}

TEST(DeepSeekV4PromptTest, MinimalPromptsFromTheModelCard) {
  ChatRequest request;
  request.messages.push_back({ChatMessage::Role::kUser, "Hello"});
  EXPECT_EQ(RenderDeepSeekV4Prompt(request), "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜><think>");
  request.thinking = false;
  EXPECT_EQ(RenderDeepSeekV4Prompt(request), "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜></think>");
}

ChatRequest OneToolCall(const std::string& arguments) {
  ChatRequest request;
  request.messages.push_back({ChatMessage::Role::kUser, "go"});
  ChatMessage call{ChatMessage::Role::kAssistant};
  call.tool_calls.push_back({"c1", "function", "f", arguments});
  request.messages.push_back(call);
  return request;
}

TEST(DeepSeekV4PromptTest, RejectsArgumentsTheEncoderCannotRender) {
  // Valid JSON that is not an object: the official encoder crashes on it (.items()); we refuse clearly.
  for (const char* args : {"[1, 2]", "5", "\"text\"", "null"}) {
    try {
      RenderDeepSeekV4Prompt(OneToolCall(args));
      ADD_FAILURE() << "accepted " << args;
    } catch (const ChatFormatError& e) {
      EXPECT_NE(std::string(e.what()).find("messages[1].tool_calls[0].function.arguments"), std::string::npos)
          << e.what();
    }
  }
  // Python reads these exactly; we cannot, so we refuse rather than render something else.
  EXPECT_THROW(RenderDeepSeekV4Prompt(OneToolCall("{\"n\": 123456789012345678901234567890}")), ChatFormatError);
  EXPECT_THROW(RenderDeepSeekV4Prompt(OneToolCall("{\"n\": 1e999}")), ChatFormatError);
  // Not JSON at all: rendered as one string parameter named "arguments", like the encoder.
  EXPECT_NE(RenderDeepSeekV4Prompt(OneToolCall("a=b")).find(
                "<｜DSML｜parameter name=\"arguments\" string=\"true\">a=b</｜DSML｜parameter>"),
            std::string::npos);
}

TEST(DeepSeekV4PromptTest, RejectsAddGenerationPromptFalse) {
  ChatRequest request;
  request.messages.push_back({ChatMessage::Role::kUser, "Hello"});
  request.add_generation_prompt = false;
  EXPECT_THROW(RenderDeepSeekV4Prompt(request), ChatFormatError);
}

}  // namespace
}  // namespace dsmesh
