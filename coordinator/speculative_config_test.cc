// --speculative-config parsing: defaults, draft_vocab_size, and the errors a user sees for bad values.
#include "coordinator/speculative_config.h"

#include <gtest/gtest.h>

#include "common/flags.h"

namespace dsmesh {
namespace {

std::string ErrorOf(const std::string& text, int64_t vocab = 0) {
  try {
    ParseSpeculativeConfig(text, vocab);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(SpeculativeConfig, DefaultsAndValues) {
  SpeculativeConfig c = ParseSpeculativeConfig(R"({"method":"mtp"})");
  EXPECT_EQ(c.num_speculative_tokens, 3);
  EXPECT_EQ(c.draft_vocab_size, 0);  // the whole vocabulary
  c = ParseSpeculativeConfig(R"({"method":"deepseek_mtp","num_speculative_tokens":2,"draft_vocab_size":32768})", 129280);
  EXPECT_EQ(c.num_speculative_tokens, 2);
  EXPECT_EQ(c.draft_vocab_size, 32768);
  EXPECT_EQ(ParseSpeculativeConfig(R"({"method":"mtp","draft_vocab_size":129280})", 129280).draft_vocab_size, 129280);
  EXPECT_EQ(ParseSpeculativeConfig(R"({"method":"mtp","draft_vocab_size":0})").draft_vocab_size, 0);
  EXPECT_EQ(ParseSpeculativeConfig(R"({"method":"mtp","draft_vocab_size":null})").draft_vocab_size, 0);
  // The vocabulary unknown (0): any non-negative size passes here; the worker checks it against its model.
  EXPECT_EQ(ParseSpeculativeConfig(R"({"method":"mtp","draft_vocab_size":1000000})").draft_vocab_size, 1000000);
}

TEST(SpeculativeConfig, BadValuesAreUsageErrors) {
  EXPECT_NE(ErrorOf(R"({"method":"mtp","draft_vocab_size":-1})").find("draft_vocab_size must be >= 0"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"method":"mtp","draft_vocab_size":1.5})").find("draft_vocab_size must be an integer"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"method":"mtp","draft_vocab_size":"32768"})").find("draft_vocab_size must be an integer"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"method":"mtp","draft_vocab_size":18446744073709551615})").find("must be >= 0"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"method":"mtp","draft_vocab_size":129281})", 129280)
                .find("draft_vocab_size 129281 is larger than the model's vocabulary (129280 ids)"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"method":"mtp","num_speculative_tokens":0})").find("1..16"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"method":"eagle"})").find("not supported"), std::string::npos);
  EXPECT_NE(ErrorOf("{").find("invalid JSON"), std::string::npos);
  EXPECT_NE(ErrorOf("[1]").find("expected a JSON object"), std::string::npos);
}

}  // namespace
}  // namespace dsmesh
