#include "watchdog/watchdog.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/even_tasks.h"
#include "testing/fake_clock.h"
#include "testing/fake_watchdog_lock.h"
#include "testing/must.h"
#include "testing/prometheus_text.h"
#include "testing/status_checks.h"

namespace minions::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr absl::Duration kTtl = absl::Seconds(10);
constexpr absl::Duration kExecutorTimeout = absl::Seconds(30);
constexpr int64_t kRecordsPerTask = 5;

class WatchdogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = Must(SqliteMetadataStore::Open(":memory:", StoreOptions{}));
    WatchdogOptions options;
    options.executor_timeout = kExecutorTimeout;
    watchdog_ = std::make_unique<Watchdog>(store_.get(), options, std::make_unique<FakeWatchdogLock>(lock_held_));
  }

  std::string Register(const std::string& name) {
    ExecutorInfo info;
    info.name = name;
    info.memory_bytes = int64_t{8} << 30;
    info.runners = {"llama"};
    info.max_tasks = 4;
    return Must(store_->RegisterExecutor("", info, clock_.Now())).id;
  }

  std::string Submit(int n_tasks, int max_attempts = 4) {
    JobSpec spec;
    spec.model = "/models/tiny.gguf";
    spec.input_key = "inputs/in.jsonl";
    spec.shard_size = kRecordsPerTask;
    spec.max_attempts = max_attempts;
    std::vector<Task> tasks = EvenTasks(n_tasks, kRecordsPerTask);
    Job job = Must(store_->CreateJob(spec, clock_.Now()));
    EXPECT_TRUE(store_->AddTasks(job.id, tasks, n_tasks * kRecordsPerTask, clock_.Now()).ok());
    return job.id;
  }

  std::vector<Lease> LeaseOne(const std::string& executor) {
    return Must(store_->LeaseTasks(executor, 1, kTtl, clock_.Now()));
  }
  // Registers executor `name` and leases it one task: its id. Where it gets none, the test fails
  // and ends there (as Must ends it).
  std::string RegisterHoldingOne(const std::string& name) {
    std::string id = Register(name);
    const size_t leased = LeaseOne(id).size();
    EXPECT_EQ(leased, 1u) << name;
    if (leased != 1) throw std::runtime_error(name + " was not leased one task");
    return id;
  }

  // A heartbeat that holds no lease: the executor is alive, its old leases are not renewed.
  void Alive(const std::string& executor) {
    HeartbeatReply reply = Must(store_->Heartbeat(executor, ExecutorState::kAvailable, "", {}, kTtl, clock_.Now()));
    EXPECT_FALSE(reply.unknown_executor);
  }

  Task GetTask(const std::string& job_id, int64_t index) {
    for (const Task& t : Must(store_->ListTasks(job_id))) {
      if (t.index == index) return t;
    }
    ADD_FAILURE() << "no task " << index;
    return Task{};
  }

  WatchdogPass Tick() { return Must(watchdog_->Tick(clock_.Now())); }

  FakeClock clock_;
  std::unique_ptr<SqliteMetadataStore> store_;
  std::shared_ptr<std::atomic<bool>> lock_held_ = std::make_shared<std::atomic<bool>>(true);
  std::unique_ptr<Watchdog> watchdog_;
};

TEST_F(WatchdogTest, AnExpiredLeaseIsRequeuedAndTheLateHolderIsFencedOff) {
  std::string job_id = Submit(1);
  std::string a = Register("a");
  std::string b = Register("b");
  std::vector<Lease> first = LeaseOne(a);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(first[0].task.attempt, 1);

  // Before the TTL nothing happens.
  clock_.Advance(kTtl - absl::Seconds(1));
  WatchdogPass quiet = Tick();
  EXPECT_EQ(quiet.leases_expired, 0);
  EXPECT_THAT(quiet.jobs_touched, IsEmpty());
  EXPECT_EQ(GetTask(job_id, 0).state, TaskState::kRunning);

  // a goes silent; past the TTL the lease is reaped.
  clock_.Advance(absl::Seconds(2));
  Alive(b);
  WatchdogPass pass = Tick();
  EXPECT_EQ(pass.leases_expired, 1);
  EXPECT_EQ(pass.tasks_failed, 0);
  EXPECT_EQ(pass.executors_lost, 0);  // 11 s of silence is not yet "lost"
  EXPECT_THAT(pass.jobs_touched, ElementsAre(job_id));
  Task requeued = GetTask(job_id, 0);
  EXPECT_EQ(requeued.state, TaskState::kPending);
  EXPECT_EQ(requeued.attempt, 1);  // bumped by the next lease, not by the expiry
  EXPECT_EQ(requeued.failures, 1);
  EXPECT_EQ(requeued.preemptions, 0);
  EXPECT_FALSE(requeued.lease_expires_at.has_value());
  EXPECT_THAT(requeued.last_error, HasSubstr("expired"));
  EXPECT_FALSE(requeued.not_before.has_value());  // a first loss fails over at once

  // A second pass does not reap it again.
  WatchdogPass again = Tick();
  EXPECT_EQ(again.leases_expired, 0);
  EXPECT_EQ(GetTask(job_id, 0).failures, 1);

  // b leases it as attempt 2 at once.
  Alive(b);
  std::vector<Lease> second = LeaseOne(b);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].task.index, 0);
  EXPECT_EQ(second[0].task.attempt, 2);

  // a's late completion of attempt 1 is refused, as is a claim on b's attempt.
  auto late = store_->CompleteTask(a, job_id, 0, 1, kRecordsPerTask, 0, clock_.Now());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition) << late.status();
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("stale attempt"));
  auto claim = store_->CompleteTask(a, job_id, 0, 2, kRecordsPerTask, 0, clock_.Now());
  EXPECT_EQ(claim.status().code(), absl::StatusCode::kFailedPrecondition) << claim.status();
  Task held = GetTask(job_id, 0);
  EXPECT_EQ(held.state, TaskState::kRunning);
  EXPECT_EQ(held.executor_id, b);
  EXPECT_EQ(held.attempt, 2);

  // b's completion stands.
  ASSERT_OK(store_->CompleteTask(b, job_id, 0, 2, kRecordsPerTask, 0, clock_.Now()));
  Job job = Must(store_->GetJob(job_id));
  EXPECT_EQ(job.state, JobState::kFinalizing);
  EXPECT_EQ(job.counts.completed, kRecordsPerTask);
}

TEST_F(WatchdogTest, ItsActionsAreCountedInTheRegistry) {
  metrics::Registry registry;
  watchdog_->ExportMetrics(&registry);
  std::string job_id = Submit(2, /*max_attempts=*/1);
  std::string a = RegisterHoldingOne("a");
  // a goes silent: its lease expires (its task had one attempt: it fails), then a is lost.
  clock_.Advance(kExecutorTimeout + absl::Seconds(1));
  WatchdogPass pass = Tick();
  ASSERT_EQ(pass.tasks_failed, 1);
  auto m = ParsePrometheusSamples(registry.Render());
  EXPECT_EQ(m["minions_leases_expired_total"], 1);
  EXPECT_EQ(m["minions_watchdog_actions_total{action=\"fail_task\"}"], 1);
  EXPECT_EQ(m["minions_watchdog_actions_total{action=\"requeue_task\"}"], 0);
  EXPECT_EQ(m["minions_watchdog_actions_total{action=\"mark_executor_lost\"}"], 1);
}

TEST_F(WatchdogTest, RenewedLeasesAreNotReaped) {
  std::string job_id = Submit(1);
  std::string a = Register("a");
  std::vector<Lease> leases = LeaseOne(a);
  ASSERT_EQ(leases.size(), 1u);
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(kTtl / 2);
    LeaseProgress progress{job_id, 0, 1, 0, 0};
    HeartbeatReply reply = Must(store_->Heartbeat(a, ExecutorState::kBusy, "", {progress}, kTtl, clock_.Now()));
    EXPECT_EQ(reply.renewed.size(), 1u);
    EXPECT_EQ(Tick().leases_expired, 0);
  }
  EXPECT_EQ(GetTask(job_id, 0).state, TaskState::kRunning);
  EXPECT_EQ(GetTask(job_id, 0).failures, 0);
}

TEST_F(WatchdogTest, ExpiriesUpToMaxAttemptsFailTheTask) {
  std::string job_id = Submit(2, /*max_attempts=*/2);
  std::string a = Register("a");
  // Task 1 succeeds normally.
  std::vector<Lease> leases = Must(store_->LeaseTasks(a, 2, kTtl, clock_.Now()));
  ASSERT_EQ(leases.size(), 2u);
  ASSERT_OK(store_->CompleteTask(a, job_id, 1, 1, kRecordsPerTask, 0, clock_.Now()));

  // Task 0's lease runs out twice.
  clock_.Advance(kTtl + absl::Seconds(1));
  Alive(a);
  WatchdogPass first = Tick();
  EXPECT_EQ(first.leases_expired, 1);
  EXPECT_EQ(first.tasks_failed, 0);
  EXPECT_EQ(GetTask(job_id, 0).state, TaskState::kPending);

  clock_.Advance(absl::Seconds(3));  // past the first backoff
  Alive(a);
  std::vector<Lease> retry = LeaseOne(a);
  ASSERT_EQ(retry.size(), 1u);
  EXPECT_EQ(retry[0].task.attempt, 2);
  clock_.Advance(kTtl + absl::Seconds(1));
  Alive(a);
  WatchdogPass second = Tick();
  EXPECT_EQ(second.leases_expired, 1);
  EXPECT_EQ(second.tasks_failed, 1);
  EXPECT_THAT(second.jobs_touched, ElementsAre(job_id));

  Task failed = GetTask(job_id, 0);
  EXPECT_EQ(failed.state, TaskState::kFailed);
  EXPECT_EQ(failed.failures, 2);
  EXPECT_THAT(failed.last_error, HasSubstr("failed 2 times"));
  EXPECT_TRUE(failed.finished_at.has_value());
  // Nothing left to lease or to reap.
  clock_.Advance(absl::Minutes(10));
  Alive(a);
  EXPECT_THAT(LeaseOne(a), IsEmpty());
  EXPECT_EQ(Tick().leases_expired, 0);

  // The job is done: one task served, one failed; its records are counted as failed.
  Job job = Must(store_->GetJob(job_id));
  EXPECT_EQ(job.state, JobState::kFinalizing);
  EXPECT_EQ(job.tasks_done, 2);
  EXPECT_EQ(job.counts.completed, kRecordsPerTask);
  EXPECT_EQ(job.counts.failed, kRecordsPerTask);
}

TEST_F(WatchdogTest, AJobWhoseOnlyTaskExpiresForGoodFails) {
  std::string job_id = Submit(1, /*max_attempts=*/1);
  std::string a = RegisterHoldingOne("a");
  clock_.Advance(kTtl + absl::Seconds(1));
  WatchdogPass pass = Tick();
  EXPECT_EQ(pass.leases_expired, 1);
  EXPECT_EQ(pass.tasks_failed, 1);
  Job job = Must(store_->GetJob(job_id));
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_THAT(job.error, HasSubstr("expired"));
}

TEST_F(WatchdogTest, SilentExecutorsAreMarkedLostOnce) {
  std::string a = Register("a");
  std::string b = Register("b");
  clock_.Advance(absl::Seconds(20));
  Alive(b);
  clock_.Advance(absl::Seconds(15));  // a silent for 35 s, b for 15 s

  WatchdogPass pass = Tick();
  EXPECT_EQ(pass.executors_lost, 1);
  EXPECT_EQ(Must(store_->GetExecutor(a)).state, ExecutorState::kLost);
  EXPECT_EQ(Must(store_->GetExecutor(b)).state, ExecutorState::kAvailable);
  EXPECT_EQ(Tick().executors_lost, 0);  // not counted again
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(Tick().executors_lost, 0);

  // A lost executor gets no work.
  Submit(1);
  EXPECT_THAT(LeaseOne(a), IsEmpty());

  // b goes silent too: lost once.
  clock_.Advance(absl::Seconds(20));
  WatchdogPass later = Tick();
  EXPECT_EQ(later.executors_lost, 1);
  EXPECT_EQ(Must(store_->GetExecutor(b)).state, ExecutorState::kLost);

  // a comes back: alive again, and it can be lost again later (counted once more).
  Alive(a);
  EXPECT_EQ(Must(store_->GetExecutor(a)).state, ExecutorState::kAvailable);
  EXPECT_EQ(Tick().executors_lost, 0);
  clock_.Advance(kExecutorTimeout + absl::Seconds(1));
  EXPECT_EQ(Tick().executors_lost, 1);
  EXPECT_EQ(Tick().executors_lost, 0);
}

TEST_F(WatchdogTest, ALostExecutorsLeaseIsStillReapedByItsTtl) {
  std::string job_id = Submit(1);
  std::string a = RegisterHoldingOne("a");
  clock_.Advance(kExecutorTimeout + absl::Seconds(1));
  WatchdogPass pass = Tick();
  EXPECT_EQ(pass.executors_lost, 1);
  EXPECT_EQ(pass.leases_expired, 1);
  EXPECT_EQ(GetTask(job_id, 0).state, TaskState::kPending);
}

// ------------------------------------------------------------------ the lock

TEST_F(WatchdogTest, ALostLockStopsTheWatchdogUntilItHasANewOne) {
  std::string job_id = Submit(1);
  std::string a = RegisterHoldingOne("a");
  // The lock goes (its database session ended): the next pass does nothing, however late the
  // lease, and says why; so does every pass after it.
  *lock_held_ = false;
  clock_.Advance(kExecutorTimeout * 2);
  absl::StatusOr<WatchdogPass> lost = watchdog_->Tick(clock_.Now());
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kFailedPrecondition) << lost.status();
  EXPECT_THAT(std::string(lost.status().message()), HasSubstr("lost the watchdog lock"));
  EXPECT_FALSE(watchdog_->active());
  *lock_held_ = true;  // even if the old lock looked good again, it is gone for good
  EXPECT_EQ(watchdog_->Tick(clock_.Now()).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GetTask(job_id, 0).state, TaskState::kRunning);
  EXPECT_EQ(Must(store_->GetExecutor(a)).state, ExecutorState::kBusy);

  // A new lock: it acts again.
  watchdog_->Resume(std::make_unique<FakeWatchdogLock>());
  EXPECT_TRUE(watchdog_->active());
  WatchdogPass pass = Tick();
  EXPECT_EQ(pass.leases_expired, 1);
  EXPECT_EQ(pass.executors_lost, 1);
  EXPECT_EQ(GetTask(job_id, 0).state, TaskState::kPending);
}

TEST_F(WatchdogTest, AResumedWatchdogGivesExecutorsItsTakeoverGraceAgain) {
  WatchdogOptions options;
  options.executor_timeout = kExecutorTimeout;
  options.takeover_grace = kTtl;
  auto held = std::make_shared<std::atomic<bool>>(true);
  Watchdog watchdog(store_.get(), options, std::make_unique<FakeWatchdogLock>(held));
  EXPECT_TRUE(Must(watchdog.Tick(clock_.Now())).in_grace);
  clock_.Advance(kTtl);
  EXPECT_FALSE(Must(watchdog.Tick(clock_.Now())).in_grace);
  *held = false;
  EXPECT_FALSE(watchdog.Tick(clock_.Now()).ok());
  clock_.Advance(kExecutorTimeout);  // down a while: executors could not heartbeat to it
  watchdog.Resume(std::make_unique<FakeWatchdogLock>());
  EXPECT_TRUE(Must(watchdog.Tick(clock_.Now())).in_grace);
}

TEST_F(WatchdogTest, ATakeoverGraceLetsExecutorsReattachAfterAnOutage) {
  // The control plane was down for longer than a TTL: every lease looks expired and every
  // executor silent when the new watchdog starts.
  std::string job_id = Submit(1);
  std::string a = Register("a");
  std::vector<Lease> leases = LeaseOne(a);
  ASSERT_EQ(leases.size(), 1u);
  clock_.Advance(kExecutorTimeout * 2);
  WatchdogOptions options;
  options.executor_timeout = kExecutorTimeout;
  options.takeover_grace = kTtl;
  Watchdog fresh(store_.get(), options, std::make_unique<FakeWatchdogLock>());
  WatchdogPass first = Must(fresh.Tick(clock_.Now()));
  EXPECT_TRUE(first.in_grace);
  EXPECT_EQ(first.leases_expired, 0);
  EXPECT_EQ(first.executors_lost, 0);
  // The executor's heartbeat gets through within the grace: its lease is its own again.
  clock_.Advance(kTtl / 3);
  LeaseProgress held{job_id, 0, leases[0].task.attempt, 0, 0, {}};
  HeartbeatReply reply = Must(store_->Heartbeat(a, ExecutorState::kBusy, "", {held}, kTtl, clock_.Now()));
  EXPECT_THAT(reply.cancel, IsEmpty());
  clock_.Advance(kTtl * 2 / 3 + absl::Seconds(1));
  WatchdogPass after = Must(fresh.Tick(clock_.Now()));
  EXPECT_FALSE(after.in_grace);
  EXPECT_EQ(after.leases_expired, 0);
  EXPECT_EQ(after.executors_lost, 0);
  EXPECT_EQ(GetTask(job_id, 0).attempt, 1);
  EXPECT_EQ(GetTask(job_id, 0).state, TaskState::kRunning);
}

// Issue 17: a server that crashed while validating an input left its job `validating` for ever.
// The watchdog fails such a job, with the reason, once validation_timeout has passed; a job still
// within it (a large input being validated now) is left alone, and other jobs are untouched.
TEST_F(WatchdogTest, AJobOrphanedInValidationIsFailedWithItsReason) {
  metrics::Registry registry;
  watchdog_->ExportMetrics(&registry);
  JobSpec spec;
  spec.model = "/models/tiny.gguf";
  spec.input_key = "inputs/in.jsonl";
  Job orphan = Must(store_->CreateJob(spec, clock_.Now()));  // its server died before AddTasks
  std::string healthy = Submit(1);
  clock_.Advance(absl::Minutes(29));
  Job newer = Must(store_->CreateJob(spec, clock_.Now()));   // validating now, legitimately
  Tick();
  EXPECT_EQ(Must(store_->GetJob(orphan.id)).state, JobState::kValidating);  // not yet
  clock_.Advance(absl::Minutes(1) + absl::Seconds(5));
  WatchdogPass pass = Tick();
  EXPECT_EQ(pass.jobs_orphaned, 1);
  Job failed = Must(store_->GetJob(orphan.id));
  EXPECT_EQ(failed.state, JobState::kFailed);
  EXPECT_THAT(failed.error, HasSubstr("validation did not finish within 30m"));
  EXPECT_THAT(failed.error, HasSubstr("submit the job again"));
  EXPECT_EQ(Must(store_->GetJob(newer.id)).state, JobState::kValidating);
  EXPECT_EQ(Must(store_->GetJob(healthy)).state, JobState::kQueued);
  auto m = ParsePrometheusSamples(registry.Render());
  EXPECT_EQ(m["minions_watchdog_actions_total{action=\"fail_orphaned_validation\"}"], 1);
  // Once failed it is not failed again.
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(Tick().jobs_orphaned, 0);
}

}  // namespace
}  // namespace minions::testing
