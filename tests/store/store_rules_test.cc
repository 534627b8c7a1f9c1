// store_rules' accounting rule (EndedAttemptTime, DeviceTime), on tasks moved by the model's own
// state machine, with a fixed clock. The stores' contract tests check the same through both
// backends; these name each case.

#include "store/common/store_rules.h"

#include "gtest/gtest.h"
#include "model/state_machines.h"

namespace minions {
namespace {

namespace rules = store_rules;

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);
const absl::Duration kTtl = absl::Hours(1);

LeaseProgress Report(int attempt, int64_t records_done) {
  LeaseProgress report;
  report.job_id = "job";
  report.attempt = attempt;
  report.records_done = records_done;
  return report;
}

Task Running(const std::string& executor, absl::Time at) {
  Task task;
  task.job_id = "job";
  task.n_records = 10;
  EXPECT_TRUE(GrantTask(task, executor, kTtl, at).ok());
  return task;
}

TEST(EndedAttemptTime, AnAttemptThatLeavesRunningIsChargedFromItsStart) {
  Task before = Running("a", kStart);
  Task after = before;
  ASSERT_TRUE(CompleteTask(after, 10, 0, kStart + absl::Seconds(30)).ok());
  EXPECT_EQ(rules::EndedAttemptTime(before, after, kStart + absl::Seconds(30)), absl::Seconds(30));
  // A renewal, or a change of a task that was not running, charges nothing.
  Task renewed = before;
  ASSERT_TRUE(RenewLease(renewed, Report(1, 3), kTtl, kStart + absl::Seconds(5)).ok());
  EXPECT_EQ(rules::EndedAttemptTime(before, renewed, kStart + absl::Seconds(5)), absl::ZeroDuration());
  Task pending;
  Task granted = Running("a", kStart);
  EXPECT_EQ(rules::EndedAttemptTime(pending, granted, kStart), absl::ZeroDuration());
}

TEST(EndedAttemptTime, ARaceChargesTheStragglerToTheBackupRequestAndAgainOnlyIfItWins) {
  const Task straggling = Running("slow", kStart);
  Task backed = straggling;
  ASSERT_TRUE(RequestBackup(backed, kStart + absl::Seconds(20)).ok());
  EXPECT_EQ(rules::EndedAttemptTime(straggling, backed, kStart + absl::Seconds(20)), absl::Seconds(20));
  Task raced = backed;
  ASSERT_TRUE(GrantTask(raced, "fast", kTtl, kStart + absl::Seconds(22)).ok());
  EXPECT_EQ(rules::EndedAttemptTime(backed, raced, kStart + absl::Seconds(22)), absl::ZeroDuration());
  const absl::Time end = kStart + absl::Seconds(27);

  // The straggler wins: its 7 s since the request, and the backup's 5 s.
  Task shadow_won = raced;
  ASSERT_TRUE(CompleteTask(shadow_won, Report(1, 10), end).ok());
  ASSERT_EQ(shadow_won.attempt, 1);
  EXPECT_EQ(rules::EndedAttemptTime(raced, shadow_won, end), absl::Seconds(12));
  // The backup wins: its 5 s only.
  Task backup_won = raced;
  ASSERT_TRUE(CompleteTask(backup_won, Report(2, 10), end).ok());
  EXPECT_EQ(rules::EndedAttemptTime(raced, backup_won, end), absl::Seconds(5));
  // The straggler fails (dropped, as a hand-back drops it): nothing more.
  Task dropped = raced;
  ASSERT_TRUE(FailAttempt(dropped, 1, {}, FailureClass::kRetryable, "boom", 4, RetryPolicy{}, end).ok());
  ASSERT_FALSE(dropped.shadow.has_value());
  EXPECT_EQ(rules::EndedAttemptTime(raced, dropped, end), absl::ZeroDuration());
  // A shadow from before the start of a shadow was kept is charged nothing after the request.
  Task old_row = raced;
  old_row.shadow->since.reset();
  Task old_won = old_row;
  ASSERT_TRUE(CompleteTask(old_won, Report(1, 10), end).ok());
  EXPECT_EQ(rules::EndedAttemptTime(old_row, old_won, end), absl::Seconds(5));
}

// An executor holds a queued task beside the one it runs, both leased at once: charged where its
// time was last charged, its attempts never add up to more than its wall time (issue 41, point 2).
TEST(EndedAttemptTime, AnExecutorsQueuedAttemptIsChargedFromWhereItsLastChargeEnded) {
  const Task ran = Running("a", kStart), queued = Running("a", kStart);
  rules::ChargedUntil charged;
  Task done = ran;
  ASSERT_TRUE(CompleteTask(done, 10, 0, kStart + absl::Seconds(30)).ok());
  EXPECT_EQ(rules::EndedAttemptTime(ran, done, kStart + absl::Seconds(30), &charged), absl::Seconds(30));
  EXPECT_EQ(charged.at("a"), kStart + absl::Seconds(30));
  Task next = queued;
  ASSERT_TRUE(CompleteTask(next, 10, 0, kStart + absl::Seconds(45)).ok());
  EXPECT_EQ(rules::EndedAttemptTime(queued, next, kStart + absl::Seconds(45), &charged), absl::Seconds(15))
      << "30 s + 15 s: the 45 s the executor was held, not 75 s";
  EXPECT_EQ(charged.at("a"), kStart + absl::Seconds(45));

  // Both ending at one moment (one batch of reports, or an expiry): one span for the two.
  rules::ChargedUntil once;
  Task failed = queued;
  ASSERT_TRUE(FailAttempt(failed, 1, {}, FailureClass::kRetryable, "boom", 4, RetryPolicy{},
                          kStart + absl::Seconds(20)).ok());
  EXPECT_EQ(rules::EndedAttemptTime(ran, done, kStart + absl::Seconds(20), &once), absl::Seconds(20));
  EXPECT_EQ(rules::EndedAttemptTime(queued, failed, kStart + absl::Seconds(20), &once), absl::ZeroDuration());

  // A charge that ended after the lease bounds it; one before it does not stretch it; another
  // executor's does not touch it; and a report stamped before the stored point never moves it back.
  rules::ChargedUntil stored{{"a", kStart + absl::Seconds(10)}, {"b", kStart + absl::Seconds(40)}};
  EXPECT_EQ(rules::EndedAttemptTime(ran, done, kStart + absl::Seconds(30), &stored), absl::Seconds(20));
  rules::ChargedUntil early{{"a", kStart - absl::Hours(1)}};
  EXPECT_EQ(rules::EndedAttemptTime(ran, done, kStart + absl::Seconds(30), &early), absl::Seconds(30));
  rules::ChargedUntil later{{"a", kStart + absl::Seconds(50)}};
  EXPECT_EQ(rules::EndedAttemptTime(ran, done, kStart + absl::Seconds(30), &later), absl::ZeroDuration());
  EXPECT_EQ(later.at("a"), kStart + absl::Seconds(50));
}

// A shadow that wins is bounded by its own executor's charges, not the backup's.
TEST(EndedAttemptTime, AWinningShadowIsBoundedByItsOwnExecutor) {
  Task raced = Running("slow", kStart);
  ASSERT_TRUE(RequestBackup(raced, kStart + absl::Seconds(20)).ok());
  ASSERT_TRUE(GrantTask(raced, "fast", kTtl, kStart + absl::Seconds(22)).ok());
  Task won = raced;
  ASSERT_TRUE(CompleteTask(won, Report(1, 10), kStart + absl::Seconds(27)).ok());
  rules::ChargedUntil charged{{"slow", kStart + absl::Seconds(25)}};
  EXPECT_EQ(rules::EndedAttemptTime(raced, won, kStart + absl::Seconds(27), &charged), absl::Seconds(2 + 5));
  EXPECT_EQ(charged.at("slow"), kStart + absl::Seconds(27));
  EXPECT_EQ(charged.at("fast"), kStart + absl::Seconds(27));
}

TEST(DeviceTime, IsTheWallTimeInWholeMicrosecondsTimesTheGang) {
  JobSpec single, gang;
  gang.gang_size = 3;
  const absl::Duration wall = absl::Seconds(10) + absl::Nanoseconds(999);
  EXPECT_EQ(rules::DeviceTime(wall, single), absl::Seconds(10));
  EXPECT_EQ(rules::DeviceTime(wall, gang), absl::Seconds(30)) << "as the PostgreSQL statement: micros, then times 3";
  EXPECT_EQ(rules::DevicesPerAttempt(single), 1);
  EXPECT_EQ(rules::DevicesPerAttempt(gang), 3);
}

}  // namespace
}  // namespace minions
