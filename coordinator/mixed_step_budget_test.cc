// MixedStepBudget: no cap until both costs are measured or when off; the cap keeps a mixed step within
// the ratio of a decode-only step; decayed means follow a change of costs; at least kMinTokens.
#include "coordinator/mixed_step_budget.h"

#include <gtest/gtest.h>

namespace dsmesh {
namespace {

TEST(MixedStepBudgetTest, NoCapUntilMeasuredOrWhenOff) {
  MixedStepBudget off(1.0);
  off.Observe(4, 0, 0.010);
  off.Observe(4, 100, 0.060);
  EXPECT_FALSE(off.on());
  EXPECT_EQ(off.Cap(), MixedStepBudget::kNoCap);

  MixedStepBudget b(2.0);
  EXPECT_EQ(b.Cap(), MixedStepBudget::kNoCap);
  b.Observe(4, 0, 0.010);  // decode-only step: 10 ms
  EXPECT_EQ(b.Cap(), MixedStepBudget::kNoCap) << "no prefill cost measured yet";
  b.Observe(0, 0, 1.0);  // an empty step tells nothing
  EXPECT_DOUBLE_EQ(b.decode_step_seconds(), 0.010);
}

TEST(MixedStepBudgetTest, CapKeepsTheMixedStepWithinTheRatio) {
  // (times in powers of two, so the expected caps are exact)
  MixedStepBudget b(2.0);
  b.Observe(4, 0, 8.0);          // decodes alone: 8 s
  b.Observe(4, 64, 8.0 + 16.0);  // + 64 prefill tokens at 0.25 s each
  EXPECT_DOUBLE_EQ(b.prefill_token_seconds(), 0.25);
  EXPECT_EQ(b.Cap(), 32);  // 8 s of room: a mixed step of 2 x 8 s
  MixedStepBudget wide(3.0);
  wide.Observe(1, 0, 1.0);
  wide.Observe(0, 128, 2.0);  // a prefill alone: 1/64 s per token (its fixed part charged to the tokens)
  EXPECT_EQ(wide.Cap(), 128);  // 2 x 1 s of room
  // A mixed step measured before any decode-only step charges all of its time to the prefill.
  MixedStepBudget early(2.0);
  early.Observe(2, 64, 4.0);
  early.Observe(2, 0, 2.0);
  EXPECT_EQ(early.Cap(), 32);
}

TEST(MixedStepBudgetTest, AtLeastMinTokensAndFollowsChangingCosts) {
  MixedStepBudget b(1.5);
  b.Observe(4, 0, 1.0);
  b.Observe(4, 16, 1.0 + 16.0);  // 1 s per token: 0.5 s of room holds none
  EXPECT_EQ(b.Cap(), MixedStepBudget::kMinTokens);
  for (int i = 0; i < 400; ++i) b.Observe(4, 16, 1.0 + 0.125);  // prefill got 128x cheaper
  EXPECT_NEAR(b.prefill_token_seconds(), 1.0 / 128, 1e-12);
  EXPECT_NEAR(static_cast<double>(b.Cap()), 64, 1);
}

}  // namespace
}  // namespace dsmesh
