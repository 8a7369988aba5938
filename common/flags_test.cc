#include "common/flags.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace dsmesh
