#include "common/constant_time.h"

#include <gtest/gtest.h>

namespace dsmesh {
namespace {

TEST(ConstantTimeEquals, EqualOnlyForTheSameBytes) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("sk-abc", "sk-abc"));
  EXPECT_FALSE(ConstantTimeEquals("sk-abc", "sk-abd"));
  EXPECT_FALSE(ConstantTimeEquals("sk-ab", "sk-abc"));
  EXPECT_FALSE(ConstantTimeEquals("sk-abc", "sk-ab"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_FALSE(ConstantTimeEquals("x", ""));
  EXPECT_FALSE(ConstantTimeEquals(std::string_view("a\0b", 3), std::string_view("a\0c", 3)));
}

}  // namespace
}  // namespace dsmesh
