// The committed DeepSeek-V4 tokenizer: the ids documented in docs/chat-encoding.md section 1, the shape
// of the added-token table, and that the committed files are exactly what the generator makes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/tokenizer/testing/reference_runner.h"
#include "common/tokenizer/tokenizer.h"

namespace dsmesh {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(DeepSeekV4Tokenizer, HasTheDocumentedIds) {
  const auto tok = Tokenizer::Load(testing::DeepSeekV4TokenizerDir());
  const std::vector<std::pair<std::string, int32_t>> ids = {
      {"<｜begin▁of▁sentence｜>", 0}, {"<｜end▁of▁sentence｜>", 1}, {"<｜▁pad▁｜>", 2},
      {"<｜User｜>", 128803},          {"<｜Assistant｜>", 128804},    {"<think>", 128821},
      {"</think>", 128822},            {"｜DSML｜", 128825},           {"<｜latest_reminder｜>", 128828},
      {"<｜action｜>", 128829},        {"<｜query｜>", 128830},         {"<｜authority｜>", 128831},
      {"<｜domain｜>", 128832},        {"<｜title｜>", 128836},         {"<｜read_url｜>", 128845},
      {"<｜image｜>", 129279}};
  for (const auto& [token, id] : ids) {
    EXPECT_EQ(tok->TokenToId(token), id) << token;
    EXPECT_EQ(tok->Encode(token), std::vector<int32_t>{id}) << token;
  }
  EXPECT_EQ(tok->vocab_size(), 129280);  // the model's embedding rows
  for (int32_t id = 128815; id < 129280; ++id) EXPECT_TRUE(tok->IsAdded(id)) << id;
  // V3.1 put <think> at 128798; in V4 that id is a placeholder again.
  EXPECT_EQ(tok->IdToToken(128798), "<｜place▁holder▁no▁798｜>");
  EXPECT_EQ(tok->bos_id(), 0);
  EXPECT_EQ(tok->eos_id(), 1);
}

TEST(DeepSeekV4Tokenizer, CommittedFilesMatchTheGenerator) {
  const std::string root = testing::RepoRoot();
  const std::string out = testing::ScratchDir("deepseek_v4_generated");
  const std::string cmd = "python3 '" + root + "/common/tokenizer/data/make_deepseek_v4_tokenizer.py' --v3 '" +
                          testing::DeepSeekV3TokenizerDir() + "' --out '" + out + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(Slurp(out + "/" + name) == Slurp(testing::DeepSeekV4TokenizerDir() + "/" + name))
        << name << " differs from the generator's output: rerun common/tokenizer/data/make_deepseek_v4_tokenizer.py";
}

}  // namespace
}  // namespace dsmesh
