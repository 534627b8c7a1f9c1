// IdleRenewals alone: an idle executor's polls renew it at most once an idle beat (a scan early),
// a written liveness counts as a renewal, a failed one does not, and silent executors are
// forgotten unless a poll of theirs is held. Times are values: no clock, no thread.

#include "server/idle_renewals.h"

#include <set>

#include "gtest/gtest.h"

namespace minions {
namespace {

constexpr absl::Duration kIdleBeat = absl::Seconds(12);
constexpr absl::Duration kScan = absl::Seconds(3);
const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

bool NonePolling(const std::string&) { return false; }

TEST(IdleRenewalsTest, APollRenewsAtOnceThenOnceAnIdleBeatAScanEarly) {
  IdleRenewals renewals(kIdleBeat, kScan);
  EXPECT_TRUE(renewals.Due("e1", kStart));
  EXPECT_FALSE(renewals.Due("e1", kStart + absl::Seconds(1)));
  EXPECT_FALSE(renewals.Due("e1", kStart + kIdleBeat - kScan - absl::Milliseconds(1)));
  EXPECT_TRUE(renewals.Due("e1", kStart + kIdleBeat - kScan));
  // Counted from the last renewal.
  EXPECT_FALSE(renewals.Due("e1", kStart + kIdleBeat));
}

TEST(IdleRenewalsTest, AWrittenLivenessCountsAndAFailedOneDoesNot) {
  IdleRenewals renewals(kIdleBeat, kScan);
  renewals.Written("e1", kStart, NonePolling);  // it registered, or its heartbeat was written
  EXPECT_FALSE(renewals.Due("e1", kStart + absl::Seconds(1)));
  renewals.NotWritten("e1");  // ... and then was not after all
  EXPECT_TRUE(renewals.Due("e1", kStart + absl::Seconds(2)));
}

TEST(IdleRenewalsTest, SilentExecutorsAreForgottenUnlessTheirPollIsHeld) {
  IdleRenewals renewals(kIdleBeat, kScan);
  ASSERT_TRUE(renewals.Due("gone", kStart));
  ASSERT_TRUE(renewals.Due("waiting", kStart));
  ASSERT_TRUE(renewals.Due("recent", kStart + kIdleBeat));
  renewals.ForgetSilent(kStart + kIdleBeat * 2 + absl::Seconds(1),
                        [](const std::string& id) { return id == "waiting"; });
  EXPECT_EQ(renewals.size(), 2u);  // "waiting" (its poll is held) and "recent"
  // Forgotten, its next poll renews it at once.
  EXPECT_TRUE(renewals.Due("gone", kStart + kIdleBeat * 2 + absl::Seconds(2)));
}

TEST(IdleRenewalsTest, WritesSweepSilentExecutorsOnceTheMapHasDoubled) {
  IdleRenewals renewals(kIdleBeat, kScan);
  for (int i = 0; i < 1023; ++i) renewals.Written("old" + std::to_string(i), kStart, NonePolling);
  EXPECT_EQ(renewals.size(), 1023u);
  // The 1,024th write, long after: the old ones are swept.
  renewals.Written("new", kStart + kIdleBeat * 3, NonePolling);
  EXPECT_EQ(renewals.size(), 1u);
}

TEST(IdleRenewalsTest, ItCountsRenewalsAndWaitsForTheirAnswers) {
  IdleRenewals renewals(kIdleBeat, kScan);
  renewals.Counted(3, /*in_flight=*/true);
  renewals.Counted(1, /*in_flight=*/false);
  EXPECT_EQ(renewals.count(), 4);
  for (int i = 0; i < 3; ++i) renewals.Answered();
  renewals.AwaitAnswered();  // returns: none left in flight
}

}  // namespace
}  // namespace minions
