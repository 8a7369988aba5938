#include "common/flags.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dsmesh {
namespace {

TEST(Flags, ParsesBothSpellingsAndRejectsUnknown) {
  Flags f({"--model", "dir", "--world=4", "--force", "pos"}, {"model", "world", "force"}, {"force"});
  EXPECT_EQ(f.Get("model"), "dir");
  EXPECT_EQ(f.GetInt("world", 1), 4);
  EXPECT_TRUE(f.GetBool("force", false));
  EXPECT_EQ(f.positional(), std::vector<std::string>{"pos"});
  EXPECT_THROW(Flags({"--modle", "x"}, {"model"}), UsageError);
  EXPECT_THROW(Flags({"--model"}, {"model"}), UsageError);
  EXPECT_THROW(Flags({"--world", "4x"}, {"world"}).GetInt("world", 0), UsageError);
  EXPECT_THROW(Flags({}, {"model"}).Require("model"), UsageError);
}

TEST(ParseIntList, CommaSeparatedNonNegativeInt32) {
  EXPECT_EQ(ParseIntList("tokens", "5,17,9", "integer token id"), (std::vector<int32_t>{5, 17, 9}));
  EXPECT_EQ(ParseIntList("tokens", "0", "integer token id"), (std::vector<int32_t>{0}));
  EXPECT_EQ(ParseIntList("tokens", "2147483647", "integer token id"), (std::vector<int32_t>{2147483647}));
}

TEST(ParseIntList, BadItemsAreUsageErrorsNamingFlagAndItem) {
  auto message = [](const std::string& text) {
    try {
      ParseIntList("tokens", text, "integer token id");
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("5,x"), "--tokens: \"x\" is not an integer token id (expected e.g. 5,17,9)");
  EXPECT_EQ(message(""), "--tokens: \"\" is not an integer token id (expected e.g. 5,17,9)");
  EXPECT_EQ(message("5,,6"), "--tokens: \"\" is not an integer token id (expected e.g. 5,17,9)");
  EXPECT_EQ(message("5 "), "--tokens: \"5 \" is not an integer token id (expected e.g. 5,17,9)");
  EXPECT_EQ(message("-1"), "--tokens: integer token id -1 is out of range");
  EXPECT_EQ(message("2147483648"), "--tokens: integer token id 2147483648 is out of range");
}

TEST(EnvInt, UnsetGivesDefaultAndBadValuesNameTheVariable) {
  unsetenv("DSMESH_TEST_ENV_INT");
  EXPECT_EQ(7, EnvInt("DSMESH_TEST_ENV_INT", 0, 10, 7));
  setenv("DSMESH_TEST_ENV_INT", "3", 1);
  EXPECT_EQ(3, EnvInt("DSMESH_TEST_ENV_INT", 0, 10, 7));
  for (const char* bad : {"", "x", "3x", "11", "-1", "99999999999999999999"}) {
    setenv("DSMESH_TEST_ENV_INT", bad, 1);
    try {
      EnvInt("DSMESH_TEST_ENV_INT", 0, 10, 7);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("DSMESH_TEST_ENV_INT='"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("0..10"), std::string::npos) << e.what();
    }
  }
  unsetenv("DSMESH_TEST_ENV_INT");
}

}  // namespace
}  // namespace dsmesh
