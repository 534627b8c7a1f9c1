// The executor's behaviours as stories on fake time: the real ExecutorAgent and the real
// control-plane services (Scenario), fake runners that can crash, stall or die. Each story runs in
// milliseconds and the same way every time.

#include <signal.h>

#include <atomic>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "executor/blob_client.h"
#include "executor/model_cache.h"
#include "scenario.h"
#include "testing/must.h"

namespace minions::testing {
namespace {

using ::testing::HasSubstr;

const Task& TaskAt(const std::vector<Task>& tasks, int64_t index) { return tasks.at(static_cast<size_t>(index)); }

TEST(ExecutorStory, TwoExecutorsServeEveryRecordOfAJobOnce) {
  Scenario s;
  s.AddExecutor("A");
  s.AddExecutor("B");
  std::string job = s.Submit(Scenario::Records(1000), 10);
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kCompleted));
  Job done = s.job(job);
  EXPECT_EQ(done.counts.completed, 1000);
  s.ExpectEachRecordOnce(job, 1000);
  // Both took part, and no record ran twice.
  EXPECT_GT(s.executor("A").runner.records_run, 0);
  EXPECT_GT(s.executor("B").runner.records_run, 0);
  EXPECT_EQ(s.executor("A").runner.records_run + s.executor("B").runner.records_run, 1000);
  for (const Task& t : s.tasks(job)) EXPECT_EQ(t.attempt, 1) << "task " << t.index;
  // A model loads once per runner, not once per task.
  EXPECT_EQ(s.executor("A").runner.loads, 1);
}

// An executor keeps its runner loaded across consecutive jobs of the same model: the second job's
// tasks run on the same runner process without loading the model again.
TEST(ExecutorStory, ConsecutiveJobsOfTheSameModelKeepTheRunnerLoaded) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutor("A");
  const std::string first = s.Submit(Scenario::Records(30), 10);
  ASSERT_TRUE(s.RunsToEndAs(first, JobState::kCompleted));
  ASSERT_EQ(a.runner.starts, 1);
  ASSERT_EQ(a.runner.loads, 1);
  s.RunFor(absl::Seconds(30));  // idle between the jobs: the runner stays
  const std::string second = s.Submit(Scenario::Records(30), 10);
  ASSERT_TRUE(s.RunsToEndAs(second, JobState::kCompleted));
  s.ExpectEachRecordOnce(second, 30);
  EXPECT_EQ(a.runner.records_run, 60);
  EXPECT_EQ(a.runner.starts, 1) << "the runner process was started again";
  EXPECT_EQ(a.runner.loads, 1) << "the model was loaded again";
}

TEST(ExecutorStory, AJobThatNamesADeclaredRunnerRunsThereAndOnlyWhereItIsOffered) {
  Scenario s;
  // A offers only the built-in runner; B offers "echo" too (its owner declared it).
  Scenario::Executor& a = s.AddExecutor("A");
  Scenario::Executor& b = s.AddExecutor("B", Scenario::DefaultOptions(), {"echo"});
  std::string echo_job = s.Submit(Scenario::Records(40), 10, 0, absl::ZeroDuration(), "echo");
  std::string llama_job = s.Submit(Scenario::Records(40), 10);
  ASSERT_TRUE(s.RunUntilJobEnds(echo_job));
  ASSERT_TRUE(s.RunUntilJobEnds(llama_job));
  ASSERT_EQ(s.job(echo_job).state, JobState::kCompleted) << s.job(echo_job).error;
  ASSERT_EQ(s.job(llama_job).state, JobState::kCompleted) << s.job(llama_job).error;
  s.ExpectEachRecordOnce(echo_job, 40);
  s.ExpectEachRecordOnce(llama_job, 40);
  // Every echo record ran on B's echo runner; A never saw one.
  const FakeRunnerScript& echo = *b.declared_scripts.at("echo");
  EXPECT_EQ(echo.records_run, 40);
  EXPECT_EQ(a.runner.records_run + b.runner.records_run, 40);
  for (const Task& t : s.tasks(echo_job)) EXPECT_EQ(t.executor_id, b.id()) << "task " << t.index;
  EXPECT_GE(echo.starts, 1);
}

TEST(ExecutorStory, CheckpointsAreCommittedAsTheRecordsFinish) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutorTaking("A", absl::Milliseconds(100));  // a checkpoint every 10 records
  std::string job = s.Submit(Scenario::Records(100), 100);  // one task
  // 3.5 s in, 35 records are done; the first three chunks are already committed by the server.
  ASSERT_TRUE(s.RunUntil([&] { return a.runner.records_run >= 35; }));
  s.RunFor(absl::Milliseconds(10));
  Task task = TaskAt(s.tasks(job), 0);
  EXPECT_EQ(CommittedRecords(task), 30);
  ASSERT_EQ(task.chunks.size(), 3u);
  EXPECT_EQ(task.chunks[2], (Chunk{1, 2, 20, 30, 0, a.id()}));  // committed, naming its producer
  EXPECT_GE(task.records_done, 30);
}

TEST(ExecutorStory, AnExecutorsSuccessorResumesAfterItsLastCheckpoint) {
  Scenario s;
  s.AddExecutorTaking("A", absl::Milliseconds(100));
  std::string job = s.Submit(Scenario::Records(100), 100);
  ASSERT_TRUE(s.RunUntil([&] { return CommittedRecords(TaskAt(s.tasks(job), 0)) >= 30; }));
  const int64_t committed = CommittedRecords(TaskAt(s.tasks(job), 0));
  s.Crash("A");  // power cut: no report, no heartbeat
  Scenario::Executor& b = s.AddExecutor("B");
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kCompleted));
  s.ExpectEachRecordOnce(job, 100);
  Task task = TaskAt(s.tasks(job), 0);
  EXPECT_EQ(task.attempt, 2);
  EXPECT_EQ(task.failures, 1) << "a lost lease is a failure";
  EXPECT_EQ(task.chunks.front().attempt, 1);
  EXPECT_EQ(task.chunks.back().attempt, 2);
  EXPECT_EQ(task.chunks.back().end, 100);
  // The successor ran only what was not committed.
  EXPECT_EQ(b.runner.records_run, 100 - committed);
}

TEST(ExecutorStory, ARecordThatCrashesTheRunnerBecomesAnErrorRecordNotAFailedTask) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutor("A");
  a.runner.crash_on = "poison-me";
  std::string job = s.Submit(Scenario::Records(60, {{37, "poison-me"}}), 20);
  ASSERT_TRUE(s.RunUntilJobEnds(job));
  s.ExpectPoisonIsolated(job, 60, "r37");
  EXPECT_GE(a.runner.crashes, 2) << "run with others, then alone, then halved";
  EXPECT_LE(a.runner.crashes, 7);
}

TEST(ExecutorStory, AMachineWhoseRunnerAlwaysCrashesGivesItsTasksBack) {
  Scenario s;
  AgentOptions options = Scenario::DefaultOptions();
  options.max_crashes_per_task = 3;
  Scenario::Executor& a = s.AddExecutor("A", options);
  a.runner.crash_on = "x";  // every record
  std::string job = s.Submit(Scenario::Records(4), 4, /*max_attempts=*/2);
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kFailed));
  Task task = TaskAt(s.tasks(job), 0);
  EXPECT_EQ(task.failures, 2);
  EXPECT_THAT(task.last_error, HasSubstr("the runner failed 4 times"));
}

TEST(ExecutorStory, ExecutorsRideOutAServerOutageAndReattachTheirLeases) {
  FakeControlPlane::Options server;
  server.lease_ttl = absl::Milliseconds(1500);
  Scenario s(server);
  for (const char* name : {"A", "B"}) s.AddExecutor(name).runner.record_time = absl::Milliseconds(25);
  std::string job = s.Submit(Scenario::Records(400), 40);
  ASSERT_TRUE(s.RunUntil([&] { return s.RunningTasksOf("A") > 0 && s.RunningTasksOf("B") > 0; }));
  // The server goes away for two TTLs; the executors carry on with what they hold.
  s.server.SetDown(true);
  const int64_t before = s.executor("A").runner.records_run;
  s.RunFor(absl::Seconds(3));
  EXPECT_GT(s.executor("A").runner.records_run, before) << "work goes on while the server is away";
  s.server.Restart();
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kCompleted));
  s.ExpectEachRecordOnce(job, 400);
  for (const Task& t : s.tasks(job)) {
    EXPECT_EQ(t.attempt, 1) << "task " << t.index << ": no lease was taken from its holder";
    EXPECT_EQ(t.failures, 0) << "task " << t.index << ": " << t.last_error;
  }
}

// The server grants a task and dies before its answer leaves (the lease is in the store, the
// executor never heard of it). The executor asks for what it may have been granted on its next
// lease, and runs it in that same attempt: the task does not wait a lease TTL for the watchdog.
TEST(ExecutorStory, ALeaseWhoseAnswerWasLostIsGrantedAgainNotLeftToExpire) {
  FakeControlPlane::Options server;
  server.lease_ttl = absl::Hours(1);  // a lost lease would hold the job for an hour
  Scenario s(server);
  Scenario::Executor& a = s.AddExecutor("A");
  ASSERT_TRUE(s.RunUntil([&] { return !a.id().empty(); }));
  s.server.LoseLeaseAnswers(1);
  std::string job = s.Submit(Scenario::Records(30), 30);  // one task
  ASSERT_TRUE(s.RunUntilJobEnds(job, absl::Minutes(1))) << "the task waited for its lease to expire";
  ASSERT_EQ(s.job(job).state, JobState::kCompleted) << s.job(job).error;
  s.ExpectEachRecordOnce(job, 30);
  EXPECT_GE(s.server.reclaims(), 1);
  Task task = TaskAt(s.tasks(job), 0);
  EXPECT_EQ(task.attempt, 1) << "granted again, not requeued";
  EXPECT_EQ(task.failures, 0) << task.last_error;
  EXPECT_EQ(a.runner.records_run, 30) << "each record ran once";
}

// A reclaim that finds nothing lost changes nothing: the executor keeps what it runs, takes
// nothing twice, and leases as before.
TEST(ExecutorStory, AFailedLeaseCallThatGrantedNothingReclaimsNothing) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutorTaking("A", absl::Milliseconds(20));
  ASSERT_TRUE(s.RunUntil([&] { return !a.id().empty(); }));
  // A while down: the idle executor's lease calls fail without reaching the server.
  s.server.SetDown(true);
  s.RunFor(absl::Seconds(2));
  s.server.SetDown(false);
  std::string job = s.Submit(Scenario::Records(200), 20);
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kCompleted));
  s.ExpectEachRecordOnce(job, 200);
  EXPECT_GE(s.server.reclaims(), 1);
  for (const Task& t : s.tasks(job)) EXPECT_EQ(t.attempt, 1) << "task " << t.index;
  EXPECT_EQ(a.runner.records_run, 200);
}

TEST(ExecutorStory, AnExecutorWaitsForAServerThatIsNotUpYet) {
  Scenario s;
  s.server.SetDown(true);
  Scenario::Executor& a = s.AddExecutor("A");
  s.RunFor(absl::Seconds(30));
  EXPECT_EQ(a.id(), "");
  EXPECT_FALSE(a.agent->finished());
  const int calls = s.server.calls();
  EXPECT_LT(calls, 15) << "registration backs off (up to 5 s between tries)";
  s.server.SetDown(false);
  std::string job = s.Submit(Scenario::Records(20), 10);
  ASSERT_TRUE(s.RunUntilJobEnds(job, absl::Seconds(30)));
  EXPECT_NE(a.id(), "");
  EXPECT_EQ(s.job(job).state, JobState::kCompleted);
}

// An idle executor that was never taken for lost: work brings its next beat forward and holds
// it to every third of the TTL; the leases are renewed and a job of two 20 s tasks runs on it,
// each task once.
void AvailableThenBeatsEveryThirdOfTheTtlWhileItWorks(Scenario& s, const std::string& executor_id) {
  absl::StatusOr<Executor> seen = s.server.store().GetExecutor(executor_id);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_EQ(seen->state, ExecutorState::kAvailable) << "the watchdog never marked it lost: " << seen->state_reason;
  std::string job = s.Submit(Scenario::Records(40), 20);
  const int before_work = s.server.heartbeats();
  const absl::Time submitted = s.clock.Now();
  ASSERT_TRUE(s.RunUntilJobEnds(job));
  const double seconds = absl::ToDoubleSeconds(s.clock.Now() - submitted);
  EXPECT_GE(s.server.heartbeats() - before_work, static_cast<int>(seconds / 3) - 1) << "every 3 s while it works";
  EXPECT_EQ(s.job(job).state, JobState::kCompleted);
  for (const Task& t : s.tasks(job)) EXPECT_EQ(t.attempt, 1) << "task " << t.index << " ran once";
}

TEST(ExecutorStory, AnIdleExecutorBeatsAtTheServersIdlePaceAndIsNeverTakenForLost) {
  // Lease TTL 9 s: the watchdog waits 27 s, the server asks idle executors for a beat each 13.5 s;
  // a server that does not keep idle executors alive from their polls (an older one).
  FakeControlPlane::Options server;
  server.idle_polls_renew = false;
  Scenario s(server);
  Scenario::Executor& a = s.AddExecutorTaking("A", absl::Seconds(1));
  ASSERT_TRUE(s.RunUntil([&] { return !a.id().empty() && s.server.heartbeats() > 0; }));
  const int first = s.server.heartbeats();
  s.RunFor(absl::Minutes(10));
  const int idle_beats = s.server.heartbeats() - first;
  // 600 s / 13.5 s = 44 beats (two thirds of a TTL would be 100).
  EXPECT_GE(idle_beats, 43);
  EXPECT_LE(idle_beats, 46);
  AvailableThenBeatsEveryThirdOfTheTtlWhileItWorks(s, a.id());
}

// A server that keeps idle executors alive from their long polls: an idle executor sends no idle
// beat for ten minutes (its polls stand for them), is never taken for lost, hears a drain through
// its poll, and until then runs work as before, renewing its leases every third of the TTL.
TEST(ExecutorStory, AnIdleExecutorWhosePollsKeepItAliveSendsNoIdleBeatsAndIsNeverTakenForLost) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutorTaking("A", absl::Seconds(1));
  ASSERT_TRUE(s.RunUntil([&] { return !a.id().empty() && s.server.heartbeats() > 0; }));
  const int first = s.server.heartbeats();
  const int64_t renewals = s.server.idle_renewals();
  s.RunFor(absl::Minutes(10));
  EXPECT_EQ(s.server.heartbeats() - first, 0) << "an idle beat was sent while its polls stood for it";
  // A renewal every idle beat less a scan period (13.5 - 3 = 10.5 s; the fake server answers a
  // poll at once, so one comes every 200 ms): 600 s / 10.5-10.7 s = 56-57, made by the server.
  EXPECT_GE(s.server.idle_renewals() - renewals, 55);
  EXPECT_LE(s.server.idle_renewals() - renewals, 58);
  AvailableThenBeatsEveryThirdOfTheTtlWhileItWorks(s, a.id());

  // Idle again: a drain reaches it through its polls, and it ends.
  s.RunFor(absl::Minutes(1));
  const int before_drain = s.server.heartbeats();
  ASSERT_TRUE(s.server.Drain(a.id()).ok());
  ASSERT_TRUE(s.RunUntilFinished("A", absl::Seconds(30)));
  EXPECT_LE(s.server.heartbeats() - before_drain, 1) << "it heard the drain from a poll, not from a beat";
}

// Its polls stop speaking for it: the owner comes back (it polls no more), or its polls reach a
// server that does not renew from them (one of the previous version behind the same address). In
// both, a beat says so within a third of the TTL, and it is never taken for lost.
TEST(ExecutorStory, AnIdleExecutorWhosePollsStopKeepingItAliveBeatsAgainAtOnce) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutor("A");
  ASSERT_TRUE(s.RunUntil([&] { return !a.id().empty() && s.server.heartbeats() > 0; }));
  s.RunFor(absl::Minutes(1));
  const int idle = s.server.heartbeats();
  auto state = [&] {
    absl::StatusOr<Executor> seen = s.server.store().GetExecutor(a.id());
    EXPECT_TRUE(seen.ok()) << seen.status();
    return seen.ok() ? seen->state : ExecutorState::kLost;
  };

  a.gate->Set(WorkMode::kPause);  // the owner is back
  const absl::Time back = s.clock.Now();
  ASSERT_TRUE(s.RunUntil([&] { return state() == ExecutorState::kOwnerActive; }));
  EXPECT_LE(s.clock.Now() - back, absl::Seconds(3) + absl::Seconds(1)) << "a third of the TTL, and a pass";
  s.RunFor(absl::Minutes(2));
  EXPECT_EQ(state(), ExecutorState::kOwnerActive) << "never taken for lost while its owner works";
  // 120 s / 13.5 s: it beats at the idle pace again.
  EXPECT_GE(s.server.heartbeats() - idle, 9);
  EXPECT_LE(s.server.heartbeats() - idle, 12);

  a.gate->Set(WorkMode::kRun);  // gone again: its polls speak for it once more
  ASSERT_TRUE(s.RunUntil([&] { return state() == ExecutorState::kAvailable; }));
  s.RunFor(absl::Minutes(1));
  const int polling = s.server.heartbeats();
  s.RunFor(absl::Minutes(1));
  EXPECT_EQ(s.server.heartbeats(), polling);

  s.server.AnswerLeasesAsAnOlderServer(true);
  const absl::Time older = s.clock.Now();
  ASSERT_TRUE(s.RunUntil([&] { return s.server.heartbeats() > polling; }));
  EXPECT_LE(s.clock.Now() - older, absl::Seconds(1)) << "the first poll answered without a renewal";
  s.RunFor(absl::Minutes(10));
  // 600 s / 13.5 s = 44 beats: the idle pace, for as long as it runs.
  EXPECT_GE(s.server.heartbeats() - polling, 44);
  EXPECT_LE(s.server.heartbeats() - polling, 47);
  EXPECT_EQ(state(), ExecutorState::kAvailable) << "never taken for lost";
}

TEST(ExecutorStory, ACancelledJobStopsItsExecutorsWithinAHeartbeat) {
  Scenario s;  // lease TTL 9 s: a heartbeat every 3 s
  for (const char* name : {"A", "B"}) s.AddExecutor(name).runner.record_time = absl::Seconds(1);
  std::string job = s.Submit(Scenario::Records(400), 50);
  ASSERT_TRUE(s.RunUntil([&] { return s.RunningTasksOf("A") > 0 && s.RunningTasksOf("B") > 0; }));
  ASSERT_TRUE(s.server.Cancel(job).ok());
  const absl::Time cancelled_at = s.clock.Now();
  auto idle = [&](const char* name) {
    FakeRunner* runner = s.executor(name).runners->live();
    return runner == nullptr || runner->idle();
  };
  ASSERT_TRUE(s.RunUntil([&] { return idle("A") && idle("B"); }));
  EXPECT_LE(s.clock.Now() - cancelled_at, absl::Seconds(3) + absl::Seconds(1)) << "a heartbeat, and a record's time";
  const int64_t run = s.executor("A").runner.records_run + s.executor("B").runner.records_run;
  s.RunFor(absl::Minutes(1));
  EXPECT_EQ(s.executor("A").runner.records_run + s.executor("B").runner.records_run, run) << "nothing more runs";
  EXPECT_EQ(s.job(job).state, JobState::kCancelled);
  // Cancelled work is not reported as failed.
  for (const Task& t : s.tasks(job)) EXPECT_EQ(t.failures, 0) << "task " << t.index;
}

TEST(ExecutorStory, ADrainedExecutorFinishesItsTasksTakesNoMoreAndExits) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutorTaking("A", absl::Milliseconds(200));
  std::string job = s.Submit(Scenario::Records(200), 10);
  ASSERT_TRUE(s.RunUntil([&] { return s.RunningTasksOf("A") > 0; }));
  ASSERT_TRUE(s.server.Drain(a.id()).ok());
  ASSERT_TRUE(s.RunUntilFinished("A", absl::Minutes(1)));
  // What it held it finished; the rest waits for someone else.
  std::vector<Task> tasks = s.tasks(job);
  int succeeded = 0, pending = 0;
  for (const Task& t : tasks) {
    succeeded += t.state == TaskState::kSucceeded;
    pending += t.state == TaskState::kPending;
    EXPECT_EQ(t.failures, 0);
    EXPECT_EQ(t.preemptions, 0);
  }
  EXPECT_GT(succeeded, 0);
  EXPECT_EQ(succeeded + pending, 20);
  EXPECT_GT(pending, 0);
  EXPECT_EQ(a.runner.records_run, succeeded * 10);
  EXPECT_EQ(s.executor("A").runners->live(), nullptr) << "the runner was shut down";
  s.AddExecutor("B");
  ASSERT_TRUE(s.RunUntilJobEnds(job));
  s.ExpectEachRecordOnce(job, 200);
}

TEST(ExecutorStory, AStoppedExecutorHandsItsTasksBackAtOnceAsPreempted) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutorTaking("A", absl::Milliseconds(100));
  std::string job = s.Submit(Scenario::Records(100), 50);
  ASSERT_TRUE(s.RunUntil([&] { return CommittedRecords(TaskAt(s.tasks(job), 0)) >= 20; }));
  a.agent->Stop();
  ASSERT_TRUE(s.RunUntilFinished("A", absl::Milliseconds(1)));
  for (const Task& t : s.tasks(job)) {
    EXPECT_EQ(t.state, TaskState::kPending) << "task " << t.index;
    EXPECT_EQ(t.failures, 0) << "task " << t.index;
  }
  Task first = TaskAt(s.tasks(job), 0);
  EXPECT_EQ(first.preemptions, 1);
  EXPECT_GE(CommittedRecords(first), 20) << "its checkpoints stay";
}

// The most tasks one executor (max_prefetch 8) holds at once while it runs a job of `records`
// records, `shard_size` per task, `record_time` each.
int MostHeld(absl::Duration record_time, int records, int64_t shard_size) {
  Scenario s;
  AgentOptions options = Scenario::DefaultOptions();
  options.max_prefetch = 8;
  s.AddExecutor("A", options).runner.record_time = record_time;
  std::string job = s.Submit(Scenario::Records(records), shard_size);
  int most = 0;
  EXPECT_TRUE(s.RunUntil([&] {
    most = std::max(most, s.RunningTasksOf("A"));
    return s.job(job).state == JobState::kCompleted;
  }));
  return most;
}

TEST(ExecutorStory, TinyTasksFillThePrefetchWindow) { EXPECT_EQ(MostHeld(absl::Milliseconds(1), 400, 1), 8); }

TEST(ExecutorStory, LongTasksKeepOneRunningAndOneQueued) { EXPECT_EQ(MostHeld(absl::Seconds(1), 100, 10), 2); }

TEST(ExecutorStory, ARunnerThatStopsAnsweringIsKilledAsHungAndItsTaskRetried) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutor("A");  // hung after 30 s of silence at the least
  a.runner.stall_on = "stall-me";
  std::string job = s.Submit(Scenario::Records(40, {{25, "stall-me"}}), 20);
  ASSERT_TRUE(s.RunUntil([&] { return a.runner.kills > 0; }));
  a.runner.stall_on.clear();  // a passing fault: the next runner answers
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kCompleted));
  s.ExpectEachRecordOnce(job, 40);
  Task stalled = TaskAt(s.tasks(job), 1);
  EXPECT_EQ(stalled.attempt, 2);
  EXPECT_EQ(stalled.failures, 1);
  EXPECT_THAT(stalled.last_error, HasSubstr("killed as hung"));
  EXPECT_EQ(a.runner.starts, 2);
}

TEST(ExecutorStory, AHungRunnerIsGivenTimeInProportionToItsRecords) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutorTaking("A", absl::Seconds(20));  // slow, but moving: 10 x 20 s before it counts as hung
  std::string job = s.Submit(Scenario::Records(10), 10);
  ASSERT_TRUE(s.RunUntilJobEnds(job, absl::Hours(1)));
  EXPECT_EQ(s.job(job).state, JobState::kCompleted);
  EXPECT_EQ(a.runner.kills, 0);
}

TEST(ExecutorStory, AMainLoopStuckInACallStopsRenewingItsLeases) {
  FakeControlPlane::Options server;
  server.lease_ttl = absl::Seconds(3);
  Scenario s(server);
  AgentOptions options = Scenario::DefaultOptions();
  options.stuck_after = absl::Seconds(10);
  Scenario::Executor& a = s.AddExecutor("A", options);
  a.runner.record_time = absl::Milliseconds(100);
  std::string job = s.Submit(Scenario::Records(100), 100);
  ASSERT_TRUE(s.RunUntil([&] { return a.runner.records_run >= 15; }));
  // The next upload never returns in time: the main loop is inside one call for a minute, while
  // its heartbeat beats on (its own thread) and the server's watchdog sweeps.
  bool hung_once = false;
  a.blobs->OnPut([&] {
    if (hung_once) return;
    hung_once = true;
    for (int i = 0; i < 60; ++i) {
      s.clock.Advance(absl::Seconds(1));
      if (a.agent->NextBeat() <= s.clock.Now()) a.agent->Beat();
      s.server.Tick(s.clock.Now());
    }
  });
  ASSERT_TRUE(s.RunUntil([&] { return hung_once; }));
  Task task = TaskAt(s.tasks(job), 0);
  EXPECT_GE(task.attempt, 2) << "the watchdog took the lease back";
  EXPECT_EQ(task.failures, 1);
  // The stuck attempt's late work is refused; the task finishes once, under a later attempt.
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kCompleted));
  s.ExpectEachRecordOnce(job, 100);
}

// The owner of executor `a` comes back (its gate says pause), and a second of fake time passes.
void OwnerBackForASecond(Scenario& s, Scenario::Executor& a) {
  a.gate->Set(WorkMode::kPause);
  s.RunFor(absl::Seconds(1));
}

TEST(ExecutorStory, TheOwnerComingBackPausesTheRunnerThenReleasesItThenHandsTheTasksBack) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutorTaking("A", absl::Milliseconds(100));
  std::string job = s.Submit(Scenario::Records(100), 50);
  ASSERT_TRUE(s.RunUntil([&] { return a.runner.records_run >= 5; }));

  // Pause: nothing more is fed, and the batches in the runner are cancelled: it stops at its next
  // step, idle (not SIGSTOPped: it obeyed), with its model loaded.
  OwnerBackForASecond(s, a);
  ASSERT_TRUE(a.runners->live());
  EXPECT_TRUE(a.runners->live()->idle());
  EXPECT_FALSE(a.runners->live()->stopped());
  EXPECT_FALSE(a.runner.cancels.empty());
  const int64_t paused_at = a.runner.records_run;
  s.RunFor(absl::Seconds(20));
  EXPECT_EQ(a.runner.records_run, paused_at);
  EXPECT_EQ(s.RunningTasksOf("A"), 2) << "its leases are still renewed";

  // Release: the runner goes (its memory back to the owner); the tasks wait.
  a.gate->Set(WorkMode::kRelease);
  s.RunFor(absl::Seconds(1));
  EXPECT_EQ(a.runners->live(), nullptr);
  EXPECT_EQ(a.runner.kills, 1);
  EXPECT_EQ(s.RunningTasksOf("A"), 2);

  // Back to work: a new runner picks up where the old one stopped.
  a.gate->Set(WorkMode::kRun);
  ASSERT_TRUE(s.RunUntil([&] { return a.runner.records_run >= paused_at + 5; }));
  EXPECT_EQ(a.runner.starts, 2);

  // Stop: every task not finished goes back, preempted, not failed.
  a.gate->Set(WorkMode::kStop);
  s.RunFor(absl::Seconds(1));
  EXPECT_EQ(s.RunningTasksOf("A"), 0);
  int preemptions = 0;
  for (const Task& t : s.tasks(job)) {
    preemptions += t.preemptions;
    EXPECT_EQ(t.failures, 0);
  }
  EXPECT_GE(preemptions, 1);

  a.gate->Set(WorkMode::kRun);
  ASSERT_TRUE(s.RunUntilJobEnds(job));
  s.ExpectEachRecordOnce(job, 100);
}

// Owner first on a device (issue 41, point 6): the owner's return stops the runner at its next
// step rather than at the end of its batch, so no work of ours stays queued on the machine. What
// it finished is kept and checkpointed; the rest waits, leased, and runs when the owner leaves on
// the same runner (no reload), each record computed once.
TEST(ExecutorStory, TheOwnerComingBackStopsTheBatchAtItsNextStepAndLosesNothing) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutorTaking("A", absl::Milliseconds(40));  // its step: well within the grace (100 ms)
  std::string job = s.Submit(Scenario::Records(60), 60);  // one task: a batch of 60 records
  ASSERT_TRUE(s.RunUntil([&] { return a.runner.records_run >= 13; }));

  a.gate->Set(WorkMode::kPause);
  // Its next step: the record under way ends (at most one record_time), then nothing more.
  ASSERT_TRUE(s.RunUntil([&] { return a.runners->live() && a.runners->live()->idle(); }, absl::Milliseconds(90)));
  const int64_t paused_at = a.runner.records_run;
  EXPECT_LT(paused_at, 60) << "the batch did not run to its end";
  EXPECT_EQ(a.runner.cancels.size(), 1u);
  EXPECT_TRUE(a.runner.signals.empty()) << "a runner that obeys the cancel is not SIGSTOPped";
  s.RunFor(absl::Seconds(30));
  EXPECT_EQ(a.runner.records_run, paused_at);
  EXPECT_EQ(s.RunningTasksOf("A"), 1) << "its lease is kept";
  // What it finished is committed (checkpointed at once): a stop now would lose none of it.
  Task held = TaskAt(s.tasks(job), 0);
  EXPECT_EQ(CommittedRecords(held), paused_at);
  EXPECT_EQ(held.records_failed, 0) << "a record stopped for the owner is no error";

  a.gate->Set(WorkMode::kRun);
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kCompleted));
  s.ExpectEachRecordOnce(job, 60);
  EXPECT_EQ(a.runner.records_run, 60) << "no finished record ran again";
  EXPECT_EQ(a.runner.starts, 1);
  EXPECT_EQ(a.runner.loads, 1) << "the model stayed loaded over the pause";
  Task task = TaskAt(s.tasks(job), 0);
  EXPECT_EQ(task.failures, 0);
  EXPECT_EQ(task.preemptions, 0);
}

// A runner that does not obey `cancel` (one a team brought) is stopped past the grace, and its
// batch goes on where it was once the owner leaves.
TEST(ExecutorStory, ARunnerThatIgnoresTheCancelIsStoppedPastTheGrace) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutorTaking("A", absl::Milliseconds(100));
  a.runner.ignores_cancel = true;
  std::string job = s.Submit(Scenario::Records(60), 60);
  ASSERT_TRUE(s.RunUntil([&] { return a.runner.records_run >= 5; }));

  OwnerBackForASecond(s, a);
  ASSERT_TRUE(a.runners->live());
  EXPECT_TRUE(a.runners->live()->stopped());
  EXPECT_EQ(a.runner.cancels.size(), 1u) << "asked once, then stopped";
  const int64_t paused_at = a.runner.records_run;
  s.RunFor(absl::Seconds(20));
  EXPECT_EQ(a.runner.records_run, paused_at);
  EXPECT_EQ(CommittedRecords(TaskAt(s.tasks(job), 0)), paused_at) << "what it finished is checkpointed at the stop";

  a.gate->Set(WorkMode::kRun);
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kCompleted));
  s.ExpectEachRecordOnce(job, 60);
  EXPECT_EQ(a.runner.records_run, 60);
}

// The bytes of a registry model as the executor's model cache fetches them: the real client
// underneath; the first ranged GET holds until the test lets it go (so the test can bring the
// owner back mid-download, at a point set by progress, not by time); every byte served counted.
// Called on the agent's fetch thread; the test waits for it without moving the clock.
class HeldFirstRange : public BlobClient {
 public:
  absl::StatusOr<std::string> GetRange(const std::string& url, int64_t begin, int64_t end) override {
    if (calls_.fetch_add(1) == 0) {
      entered_.Notify();
      release_.WaitForNotification();
    }
    absl::StatusOr<std::string> bytes = real_.GetRange(url, begin, end);
    if (bytes.ok()) served_ += static_cast<int64_t>(bytes->size());
    return bytes;
  }
  absl::Status Put(const std::string& url, std::string_view data) override { return real_.Put(url, data); }
  void WaitUntilEntered() { entered_.WaitForNotification(); }
  void Release() { release_.Notify(); }
  int64_t served() const { return served_.load(); }

 private:
  UrlBlobClient real_;
  std::atomic<int> calls_{0};
  std::atomic<int64_t> served_{0};
  absl::Notification entered_, release_;
};

// The owner comes back while the executor downloads a task's model: the download stops, and the
// attempt goes back as preempted (the owner's return is no failure of the task); once the owner is
// away again the download resumes by range from where it stopped (no byte fetched twice) and the
// job completes.
TEST(ExecutorStory, ADownloadPausedForTheOwnerIsNoFailedAttemptAndResumesByRange) {
  Scenario s;
  std::string bytes(20'000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>('a' + i % 23);
  absl::StatusOr<std::string> digest = s.server.AddModel("tiny", bytes);
  ASSERT_TRUE(digest.ok()) << digest.status();
  HeldFirstRange blobs;
  ModelCacheOptions cache_options;
  cache_options.dir = s.server.models_dir() + "/../cache";
  cache_options.free_disk_floor_bytes = 0;
  cache_options.range_bytes = 4'000;  // five ranges
  absl::StatusOr<std::unique_ptr<ModelCache>> cache =
      ModelCache::Open(cache_options, &blobs, &s.clock,
                       [](const std::string&) -> absl::StatusOr<int64_t> { return int64_t{1} << 40; });
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::shared_ptr<ModelCache> shared_cache(std::move(*cache));
  AgentOptions options = Scenario::DefaultOptions();
  options.model_cache = shared_cache;
  Scenario::Executor& a = s.AddExecutor("A", options);
  const std::string job = s.Submit(Scenario::Records(10), 10, 0, absl::ZeroDuration(), "", "tiny");
  ASSERT_FALSE(job.empty());

  // The executor leases the task and starts the download; its first range is held.
  ASSERT_TRUE(s.RunUntil([&] { return s.RunningTasksOf("A") == 1; }, absl::Hours(24)));
  a.agent->Step();  // feeds the runner: the download starts
  blobs.WaitUntilEntered();
  // The owner comes back; the range in flight completes, and the download stops there.
  a.gate->Set(WorkMode::kPause);
  blobs.Release();
  // Wait, without moving the clock, until the executor's download has stopped: the cache runs one
  // fetch at a time, so one of ours (that may not go on) returns only after it.
  EXPECT_FALSE(shared_cache->Fetch(*digest, static_cast<int64_t>(bytes.size()), "http://127.0.0.1:1/unused",
                                   [] { return false; })
                   .ok());
  EXPECT_EQ(blobs.served(), 4'000);  // one range, then the stop
  s.RunFor(absl::Seconds(30));
  // The owner leaves again.
  a.gate->Set(WorkMode::kRun);
  ASSERT_TRUE(s.RunUntilJobEnds(job, absl::Hours(24)));
  ASSERT_EQ(s.job(job).state, JobState::kCompleted) << s.job(job).error;
  s.ExpectEachRecordOnce(job, 10);
  const Task task = s.tasks(job).at(0);
  EXPECT_EQ(task.failures, 0) << "the paused download counted as a failed attempt";
  EXPECT_EQ(task.preemptions, 1);
  EXPECT_EQ(task.attempt, 2);
  EXPECT_EQ(blobs.served(), static_cast<int64_t>(bytes.size())) << "resumed by range: no byte twice";
  EXPECT_EQ(a.runner.loads, 1);
}

TEST(ExecutorStory, AModelThatDoesNotLoadFailsItsTasksForGood) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutor("A");
  a.runner.bad_model = s.server.model_path();
  std::string job = s.Submit(Scenario::Records(20), 10);
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kFailed));
  for (const Task& t : s.tasks(job)) {
    EXPECT_EQ(t.state, TaskState::kFailed);
    EXPECT_EQ(t.attempt, 1) << "permanent: not retried";
    EXPECT_THAT(t.last_error, HasSubstr("cannot load the model"));
  }
}

// The job's first task ran again once (a second attempt), its first having ended with `error`.
void ExpectRetriedOnce(Scenario& s, const std::string& job, const std::string& error) {
  Task task = TaskAt(s.tasks(job), 0);
  EXPECT_EQ(task.attempt, 2);
  EXPECT_THAT(task.last_error, HasSubstr(error));
}

TEST(ExecutorStory, AFailedCheckpointIsRetriedAndAFailedOutputRetriesTheTask) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutorTaking("A", absl::Milliseconds(100));
  std::string job = s.Submit(Scenario::Records(30), 30);
  a.blobs->FailPuts(1);  // the first checkpoint's upload fails; the next one carries its records
  ASSERT_TRUE(s.RunUntil([&] { return CommittedRecords(TaskAt(s.tasks(job), 0)) > 0; }));
  EXPECT_EQ(CommittedRecords(TaskAt(s.tasks(job), 0)), 11) << "tried again with the next record";
  ASSERT_TRUE(s.RunUntil([&] { return a.runner.records_run >= 29; }));
  a.blobs->FailPuts(1);  // and the last chunk's
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kCompleted));
  s.ExpectEachRecordOnce(job, 30);
  ExpectRetriedOnce(s, job, "cannot upload the output");
  EXPECT_EQ(a.runner.records_run, 30 + 9) << "the retry resumed after the committed 21";
}

TEST(ExecutorStory, AnInputThatCannotBeReadIsRetried) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutor("A");
  a.blobs->FailGets(1);
  std::string job = s.Submit(Scenario::Records(10), 10);
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kCompleted));
  ExpectRetriedOnce(s, job, "cannot read the input");
}

TEST(ExecutorStory, AStragglerGetsABackupAndTheFirstToFinishWins) {
  FakeControlPlane::Options server;
  server.watchdog.stragglers.min_runtime = absl::Milliseconds(500);
  Scenario s(server);
  Scenario::Executor& slow = s.AddExecutorTaking("slow", absl::Milliseconds(400));  // 2 s a task
  std::string job = s.Submit(Scenario::Records(40), 5);
  ASSERT_TRUE(s.RunUntil([&] { return s.RunningTasksOf("slow") > 0; }));
  s.AddExecutorTaking("fast", absl::Milliseconds(10));
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kCompleted));
  s.ExpectEachRecordOnce(job, 40);
  int backed_up = 0;
  for (const Task& t : s.tasks(job)) {
    EXPECT_EQ(t.failures, 0) << "task " << t.index << ": a lost race is not a failure";
    backed_up += t.attempt > 1;
  }
  EXPECT_GE(backed_up, 1) << "no task finished under a backup attempt";
  // The losing attempts are cancelled by the next heartbeat: the slow one stops running them.
  ASSERT_TRUE(s.RunUntil([&] { return slow.runners->live() == nullptr || slow.runners->live()->idle(); },
                         absl::Seconds(5)));
}

TEST(ExecutorStory, AJobPastItsCompletionWindowExpiresWithWhatItFinished) {
  Scenario s;
  AgentOptions options = Scenario::DefaultOptions();
  options.checkpoint_records = 5;
  s.AddExecutor("A", options).runner.record_time = absl::Milliseconds(50);
  // 200 records at 20 a second need 10 s; the job may take 2.5.
  std::string job = s.Submit(Scenario::Records(200), 20, 0, absl::Milliseconds(2500));
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kExpired));
  Job expired = s.job(job);
  EXPECT_THAT(expired.error, HasSubstr("completion window"));
  std::vector<Json> output = s.server.Results(job, false);
  EXPECT_GT(output.size(), 10u);
  EXPECT_LT(output.size(), 150u);
  for (const Json& e : s.server.Results(job, true)) EXPECT_EQ(e["error"]["code"], "batch_expired");
  EXPECT_EQ(expired.counts.completed, static_cast<int64_t>(output.size()));
  s.ExpectEachRecordOnce(job, 200);
}

// The production loop on its threads: Run() under a fake clock that never moves still obeys
// Stop() at once, with a runner that answers nothing.
TEST(ExecutorStory, StopEndsRunWhateverTheRunnerDoes) {
  Scenario s;
  Scenario::Executor& a = s.AddExecutor("A");
  a.runner.load_time = absl::Hours(1);  // the runner never gets anywhere
  std::string job = s.Submit(Scenario::Records(10), 10);
  absl::Status status = absl::UnknownError("Run() did not return");
  std::thread run([&] { status = a.agent->Run(); });
  // The test waits for both loops to wait on the clock (the main loop does only once it holds
  // its task and has asked the runner for the model); time never moves.
  EXPECT_TRUE(s.clock.AwaitWaiters(2));
  EXPECT_EQ(s.RunningTasksOf("A"), 1);
  a.agent->Stop();
  run.join();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(TaskAt(s.tasks(job), 0).state, TaskState::kPending);
  EXPECT_EQ(TaskAt(s.tasks(job), 0).preemptions, 1);
}

}  // namespace
}  // namespace minions::testing

// Spot checks end to end on the real control plane (server.spot_checks on): each executor's
// chunks are re-scored by the other while it is idle, and the job publishes once the verdicts are
// in (docs/verification.md, "Spot checks").
namespace minions::testing {
namespace {

FakeControlPlane::Options SpotChecksOn() {
  FakeControlPlane::Options options;
  options.spot_checks = true;
  return options;
}

TEST(SpotCheckStory, AJobPublishesWithItsRecordsVerifiedByAnotherExecutor) {
  Scenario s(SpotChecksOn());
  s.AddExecutor("A");
  s.AddExecutor("B");
  std::string job = s.Submit(Scenario::Records(60), 10);
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kCompleted));
  s.ExpectEachRecordOnce(job, 60);
  auto verdicts = s.server.store().ListVerifications(job);
  ASSERT_TRUE(verdicts.ok()) << verdicts.status();
  // An executor's first records are all drawn: each one checked once, by the other executor.
  EXPECT_EQ(verdicts->size(), 60u);
  for (const Verification& v : *verdicts) {
    EXPECT_TRUE(v.passed) << v.custom_id << ": " << v.reason;
    EXPECT_NE(v.verifier_id, v.producer_id) << v.custom_id;
  }
  EXPECT_GT(s.executor("A").agent->verifications_reported() + s.executor("B").agent->verifications_reported(), 0);
}

TEST(SpotCheckStory, AForgingExecutorIsQuarantinedAndItsRecordsAreRedoneBeforeTheJobPublishes) {
  Scenario s(SpotChecksOn());
  s.AddExecutor("A");
  s.AddExecutor("B");
  Scenario::Executor& forger = s.AddExecutor("F");
  forger.runner.answer = "a forged answer";
  std::string job = s.Submit(Scenario::Records(60), 10);
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kCompleted));
  s.ExpectEachRecordOnce(job, 60);
  ASSERT_GT(forger.runner.records_run, 0);  // it did take work, which was caught
  auto state = s.server.store().GetExecutor(forger.id());
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->state, ExecutorState::kQuarantined);
  for (const Json& line : s.server.Results(job, /*errors=*/false)) {
    EXPECT_EQ(DumpJson(line).find("forged"), std::string::npos) << DumpJson(line);
  }
}

// No other executor exists to judge its spot checks: the job does not wait for ever. It publishes
// once the server's verify wait has passed after its last task, its checks counted open.
TEST(SpotCheckStory, AOneExecutorPoolPublishesAfterTheVerifyWaitWithItsChecksOpen) {
  FakeControlPlane::Options options = SpotChecksOn();
  options.verify_wait = absl::Minutes(2);
  Scenario s(options);
  s.AddExecutor("A");
  std::string job = s.Submit(Scenario::Records(30), 10);
  ASSERT_TRUE(s.RunUntil([&] { return s.job(job).state == JobState::kFinalizing; }));
  s.RunFor(absl::Minutes(1));
  EXPECT_EQ(s.job(job).state, JobState::kFinalizing);  // waiting for a verifier
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kCompleted));
  s.ExpectEachRecordOnce(job, 30);
  EXPECT_GT(Must(s.server.store().CountOpenVerifications(job)), 0);
  EXPECT_THAT(Must(s.server.store().ListVerifications(job)), ::testing::IsEmpty());
}

}  // namespace
}  // namespace minions::testing
