// RestartPolicy: backoff 0.5, 1, 2, 2 s; the 5th failure within 60 s gives up; old failures age out;
// children are counted apart. ClassifyExit: what counts as a failure.
#include "cli/launcher/restart_policy.h"

#include <gtest/gtest.h>
#include <signal.h>

namespace dsmesh {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(RestartPolicy, BacksOffThenGivesUpOnTheFifthFailureWithinTheWindow) {
  RestartPolicy p{RestartLimits{}};
  const auto t0 = RestartPolicy::Clock::time_point{} + seconds(1000);
  EXPECT_EQ(p.OnFailure("worker0", t0), milliseconds(500));
  EXPECT_EQ(p.OnFailure("worker0", t0 + seconds(1)), milliseconds(1000));
  EXPECT_EQ(p.OnFailure("worker0", t0 + seconds(2)), milliseconds(2000));
  EXPECT_EQ(p.OnFailure("worker0", t0 + seconds(3)), milliseconds(2000));
  EXPECT_EQ(p.RecentFailures("worker0", t0 + seconds(3)), 4);
  EXPECT_EQ(p.OnFailure("worker0", t0 + seconds(59)), std::nullopt);
}

TEST(RestartPolicy, FailuresOlderThanTheWindowAreForgotten) {
  RestartPolicy p{RestartLimits{}};
  const auto t0 = RestartPolicy::Clock::time_point{} + seconds(1000);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(p.OnFailure("gateway", t0 + seconds(i)).has_value());
  // 61 s after the first: three failures remain in the window, so this is the 4th, not the 5th.
  EXPECT_EQ(p.OnFailure("gateway", t0 + seconds(61)), milliseconds(2000));
  EXPECT_EQ(p.RecentFailures("gateway", t0 + seconds(200)), 0);
  EXPECT_EQ(p.OnFailure("gateway", t0 + seconds(200)), milliseconds(500));
}

TEST(RestartPolicy, ChildrenAreCountedSeparately) {
  RestartPolicy p{RestartLimits{}};
  const auto t0 = RestartPolicy::Clock::time_point{} + seconds(1000);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(p.OnFailure("worker1", t0).has_value());
  EXPECT_EQ(p.OnFailure("worker0", t0), milliseconds(500));
  EXPECT_EQ(p.OnFailure("coordinator", t0), milliseconds(500));
  EXPECT_EQ(p.OnFailure("worker1", t0), std::nullopt);
}

TEST(RestartPolicy, ClassifiesExitStatuses) {
  auto exited = [](int code) { return code << 8; };  // the waitpid() encoding
  EXPECT_EQ(ClassifyExit(exited(0)), ExitKind::kClean);
  EXPECT_EQ(ClassifyExit(exited(1)), ExitKind::kFailure);
  EXPECT_EQ(ClassifyExit(exited(2)), ExitKind::kUsageError);
  EXPECT_EQ(ClassifyExit(exited(127)), ExitKind::kFailure);
  EXPECT_EQ(ClassifyExit(SIGKILL), ExitKind::kFailure);
  EXPECT_EQ(ClassifyExit(SIGSEGV), ExitKind::kFailure);
  EXPECT_EQ(ClassifyExit(SIGABRT), ExitKind::kFailure);
  EXPECT_EQ(ClassifyExit(SIGTERM), ExitKind::kClean);
  EXPECT_EQ(ClassifyExit(SIGINT), ExitKind::kClean);
}

}  // namespace
}  // namespace dsmesh
