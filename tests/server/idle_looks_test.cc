// IdleLooks alone: an executor that found nothing is not looked up in the store again until work
// is announced or its recheck is due; one look asks whether any task is pending, and while none is
// every executor's look is spared; a warm-executor wait's end brings a recheck forward. Times are
// values: no clock, no thread.

#include "server/idle_looks.h"

#include "gtest/gtest.h"

namespace minions {
namespace {

constexpr absl::Duration kRecheck = absl::Seconds(10);
const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

TEST(IdleLooksTest, NothingFoundIsRememberedUntilAnAnnouncementOrTheRecheck) {
  IdleLooks looks(kRecheck);
  EXPECT_FALSE(looks.Spared("e1", 0, kStart));  // first look: the store's
  looks.FoundNothing("e1", 0, kStart, /*asked=*/false, /*none_pending=*/false);
  EXPECT_EQ(looks.RecheckAt("e1"), kStart + kRecheck);
  EXPECT_TRUE(looks.Spared("e1", 0, kStart + absl::Seconds(1)));
  EXPECT_FALSE(looks.Spared("e1", 1, kStart + absl::Seconds(1)));  // work was announced
  EXPECT_FALSE(looks.Spared("e1", 0, kStart + kRecheck));           // its recheck is due
  EXPECT_EQ(looks.lookups(), 3);
  EXPECT_EQ(looks.spared(), 0);  // its own mark is not "none pending"
}

TEST(IdleLooksTest, WhileNoTaskIsPendingEveryLookIsSpared) {
  IdleLooks looks(kRecheck);
  ASSERT_FALSE(looks.Spared("e1", 4, kStart));
  ASSERT_TRUE(looks.StartPendingCheck(4, 4, kStart));
  // One look asks at a time.
  EXPECT_FALSE(looks.StartPendingCheck(4, 4, kStart));
  looks.FoundNothing("e1", 4, kStart, /*asked=*/true, /*none_pending=*/true);
  EXPECT_EQ(looks.pending_checks(), 1);
  // Other executors' looks find nothing without the store, and are marked so.
  EXPECT_TRUE(looks.Spared("e2", 4, kStart + absl::Seconds(1)));
  EXPECT_TRUE(looks.Spared("e3", 4, kStart + absl::Seconds(1)));
  EXPECT_EQ(looks.spared(), 2);
  EXPECT_EQ(looks.RecheckAt("e2"), kStart + kRecheck);
  // Answered for this announcement: no look asks again until the next, or its recheck.
  EXPECT_FALSE(looks.StartPendingCheck(4, 4, kStart + absl::Seconds(2)));
  EXPECT_TRUE(looks.StartPendingCheck(4, 4, kStart + kRecheck));
  looks.FoundNothing("e2", 4, kStart + kRecheck, true, false);
  // A new announcement: looks go to the store again.
  EXPECT_FALSE(looks.Spared("e4", 5, kStart + kRecheck));
}

TEST(IdleLooksTest, ALookAsOfAnOldAnnouncementDoesNotAsk) {
  IdleLooks looks(kRecheck);
  EXPECT_FALSE(looks.StartPendingCheck(3, 4, kStart));  // work announced since it looked
  EXPECT_EQ(looks.pending_checks(), 0);
}

TEST(IdleLooksTest, AWarmWaitsEndBringsTheRecheckForward) {
  IdleLooks looks(kRecheck);
  looks.Announced(kStart, absl::Milliseconds(2'050));
  looks.FoundNothing("e1", 1, kStart, false, false);
  // Rounded up to 100 ms: never early.
  EXPECT_EQ(looks.RecheckAt("e1"), kStart + absl::Milliseconds(2'100));
  // Once it has passed, the idle recheck again.
  looks.FoundNothing("e1", 1, kStart + absl::Seconds(3), false, false);
  EXPECT_EQ(looks.RecheckAt("e1"), kStart + absl::Seconds(3) + kRecheck);
  // No wait: nothing kept.
  looks.Announced(kStart + absl::Seconds(3), absl::ZeroDuration());
  looks.FoundNothing("e2", 2, kStart + absl::Seconds(3), false, false);
  EXPECT_EQ(looks.RecheckAt("e2"), kStart + absl::Seconds(3) + kRecheck);
}

TEST(IdleLooksTest, AChangedStateOrAForgetSendsTheNextLookToTheStore) {
  IdleLooks looks(kRecheck);
  looks.FoundNothing("e1", 0, kStart, false, false);
  looks.Reported("e1", ExecutorState::kOwnerActive);
  looks.Reported("e1", ExecutorState::kOwnerActive);  // unchanged: still spared
  EXPECT_TRUE(looks.Spared("e1", 0, kStart));
  looks.Reported("e1", ExecutorState::kAvailable);  // its owner left
  EXPECT_FALSE(looks.RecheckAt("e1").has_value());
  EXPECT_FALSE(looks.Spared("e1", 0, kStart));
  looks.FoundNothing("e1", 0, kStart, false, false);
  looks.Forget("e1");  // it finished a task
  EXPECT_FALSE(looks.Spared("e1", 0, kStart));
}

}  // namespace
}  // namespace minions
