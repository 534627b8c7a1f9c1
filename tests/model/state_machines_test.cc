#include "model/state_machines.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <utility>

namespace minions {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);

constexpr JobState kAllJobStates[] = {JobState::kValidating, JobState::kQueued,    JobState::kRunning,
                                      JobState::kFinalizing, JobState::kCompleted, JobState::kFailed,
                                      JobState::kCancelled,  JobState::kExpired};
constexpr TaskState kAllTaskStates[] = {TaskState::kPending, TaskState::kRunning, TaskState::kSucceeded,
                                        TaskState::kFailed, TaskState::kCancelled};

std::string Name(JobState s) { return std::string(JobStateName(s)); }
std::string Name(TaskState s) { return std::string(TaskStateName(s)); }

// --- names ---

TEST(StateNames, RoundTrip) {
  for (JobState s : kAllJobStates) EXPECT_EQ(ParseJobState(JobStateName(s)), s);
  for (TaskState s : kAllTaskStates) EXPECT_EQ(ParseTaskState(TaskStateName(s)), s);
  for (ExecutorState s : {ExecutorState::kAvailable, ExecutorState::kBusy, ExecutorState::kOwnerActive,
                          ExecutorState::kDraining, ExecutorState::kLost}) {
    EXPECT_EQ(ParseExecutorState(ExecutorStateName(s)), s);
  }
  for (FailureClass f : {FailureClass::kRetryable, FailureClass::kPermanent, FailureClass::kPreempted}) {
    EXPECT_EQ(ParseFailureClass(FailureClassName(f)), f);
  }
  EXPECT_EQ(ParseJobState("nope"), std::nullopt);
  EXPECT_EQ(ParseTaskState(""), std::nullopt);
}

// --- transition tables: every pair ---

TEST(JobTransitions, EveryPair) {
  using S = JobState;
  const std::set<std::pair<S, S>> allowed = {
      {S::kValidating, S::kQueued},    {S::kValidating, S::kFailed},    {S::kValidating, S::kCancelled},
      {S::kValidating, S::kExpired},   {S::kQueued, S::kRunning},       {S::kQueued, S::kFinalizing},
      {S::kQueued, S::kFailed},        {S::kQueued, S::kCancelled},     {S::kRunning, S::kFinalizing},
      {S::kRunning, S::kFailed},       {S::kRunning, S::kCancelled},    {S::kFinalizing, S::kCompleted},
      {S::kFinalizing, S::kFailed},    {S::kFinalizing, S::kCancelled}, {S::kFinalizing, S::kExpired},
  };
  for (S from : kAllJobStates) {
    for (S to : kAllJobStates) {
      EXPECT_EQ(IsAllowed(from, to), allowed.count({from, to}) == 1) << Name(from) << " -> " << Name(to);
    }
  }
}

TEST(JobTransitions, TerminalStatesAreFinal) {
  for (JobState from : kAllJobStates) {
    if (!IsTerminal(from)) continue;
    for (JobState to : kAllJobStates) EXPECT_FALSE(IsAllowed(from, to)) << Name(from) << " -> " << Name(to);
  }
}

TEST(TaskTransitions, EveryPair) {
  using S = TaskState;
  const std::set<std::pair<S, S>> allowed = {
      {S::kPending, S::kRunning},   {S::kPending, S::kCancelled}, {S::kPending, S::kFailed},
      {S::kRunning, S::kPending},   {S::kRunning, S::kSucceeded}, {S::kRunning, S::kFailed},
      {S::kRunning, S::kCancelled},
  };
  for (S from : kAllTaskStates) {
    for (S to : kAllTaskStates) {
      EXPECT_EQ(IsAllowed(from, to), allowed.count({from, to}) == 1) << Name(from) << " -> " << Name(to);
    }
  }
}

TEST(Terminal, States) {
  EXPECT_FALSE(IsTerminal(JobState::kFinalizing));
  EXPECT_TRUE(IsTerminal(JobState::kExpired));
  EXPECT_FALSE(IsTerminal(TaskState::kRunning));
  EXPECT_TRUE(IsTerminal(TaskState::kCancelled));
}

// --- tasks ---

Task PendingTask(int64_t n_records = 10) {
  Task task;
  task.job_id = "job-1";
  task.index = 3;
  task.n_records = n_records;
  return task;
}

Task RunningTask(const std::string& executor = "exe-a", absl::Duration ttl = absl::Seconds(30)) {
  Task task = PendingTask();
  EXPECT_TRUE(GrantTask(task, executor, ttl, kNow).ok());
  return task;
}

TEST(GrantTask, BumpsAttemptAndSetsExpiry) {
  Task task = PendingTask();
  task.records_done = 4;  // left over from a preempted attempt
  ASSERT_TRUE(GrantTask(task, "exe-a", absl::Seconds(30), kNow).ok());
  EXPECT_EQ(task.state, TaskState::kRunning);
  EXPECT_EQ(task.attempt, 1);
  EXPECT_EQ(task.executor_id, "exe-a");
  EXPECT_EQ(task.lease_expires_at, kNow + absl::Seconds(30));
  EXPECT_EQ(task.started_at, kNow);
  EXPECT_EQ(task.records_done, 0);

  // Back to pending and granted again: the next attempt, the new holder.
  ASSERT_TRUE(FailTask(task, FailureClass::kPreempted, "owner back", 4, RetryPolicy{}, kNow).ok());
  ASSERT_TRUE(GrantTask(task, "exe-b", absl::Seconds(10), kNow + absl::Seconds(1)).ok());
  EXPECT_EQ(task.attempt, 2);
  EXPECT_EQ(task.executor_id, "exe-b");
  EXPECT_EQ(task.lease_expires_at, kNow + absl::Seconds(11));
}

TEST(GrantTask, RefusesTasksNotPending) {
  for (TaskState state : {TaskState::kRunning, TaskState::kSucceeded, TaskState::kFailed, TaskState::kCancelled}) {
    Task task = PendingTask();
    task.state = state;
    absl::Status status = GrantTask(task, "exe-a", absl::Seconds(30), kNow);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << Name(state);
    EXPECT_EQ(task.attempt, 0);
  }
}

TEST(GrantTask, RespectsBackoff) {
  Task task = PendingTask();
  task.not_before = kNow + absl::Seconds(5);
  EXPECT_EQ(GrantTask(task, "exe-a", absl::Seconds(30), kNow).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(task.state, TaskState::kPending);
  ASSERT_TRUE(GrantTask(task, "exe-a", absl::Seconds(30), kNow + absl::Seconds(5)).ok());
  EXPECT_EQ(task.not_before, std::nullopt);
}

TEST(CheckFence, Cases) {
  Task task = RunningTask("exe-a");
  EXPECT_TRUE(CheckFence(task, "exe-a", 1).ok());

  absl::Status stale = CheckFence(task, "exe-a", 0);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stale.message()), HasSubstr("stale attempt"));

  absl::Status other = CheckFence(task, "exe-b", 1);
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(other.message()), HasSubstr("held by exe-a"));

  EXPECT_EQ(CheckFence(task, "exe-a", 2).code(), absl::StatusCode::kFailedPrecondition);

  for (TaskState state : {TaskState::kPending, TaskState::kSucceeded, TaskState::kFailed, TaskState::kCancelled}) {
    Task ended = task;
    ended.state = state;
    absl::Status status = CheckFence(ended, "exe-a", 1);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << Name(state);
    EXPECT_THAT(std::string(status.message()), HasSubstr("no longer holds a lease"));
  }
}

TEST(CompleteTask, RecordsFinalCounts) {
  Task task = RunningTask();
  ASSERT_TRUE(CompleteTask(task, 10, 2, kNow + absl::Seconds(3)).ok());
  EXPECT_EQ(task.state, TaskState::kSucceeded);
  EXPECT_EQ(task.records_done, 10);
  EXPECT_EQ(task.records_failed, 2);
  EXPECT_EQ(task.lease_expires_at, std::nullopt);
  EXPECT_EQ(task.finished_at, kNow + absl::Seconds(3));
}

TEST(CompleteTask, MustAccountForEveryRecord) {
  struct Case {
    int64_t done, failed;
  };
  for (Case c : {Case{9, 0}, Case{11, 0}, Case{10, 11}, Case{10, -1}}) {
    Task task = RunningTask();
    EXPECT_EQ(CompleteTask(task, c.done, c.failed, kNow).code(), absl::StatusCode::kInvalidArgument)
        << c.done << "/" << c.failed;
    EXPECT_EQ(task.state, TaskState::kRunning);
  }
}

TEST(CompleteTask, OnlyARunningTask) {
  for (TaskState state : {TaskState::kPending, TaskState::kSucceeded, TaskState::kFailed, TaskState::kCancelled}) {
    Task task = PendingTask();
    task.state = state;
    EXPECT_EQ(CompleteTask(task, 10, 0, kNow).code(), absl::StatusCode::kFailedPrecondition) << Name(state);
    EXPECT_EQ(task.state, state);
  }
}

TEST(FailTask, RetryableBacksOffDoublingUpToTheCap) {
  RetryPolicy policy{absl::Seconds(1), absl::Seconds(10)};
  // failures after this one -> expected wait
  const std::pair<int, absl::Duration> table[] = {
      {1, absl::Seconds(1)}, {2, absl::Seconds(2)},  {3, absl::Seconds(4)},  {4, absl::Seconds(8)},
      {5, absl::Seconds(10)}, {6, absl::Seconds(10)}, {40, absl::Seconds(10)},
  };
  for (auto [failures, wait] : table) {
    Task task = RunningTask();
    task.failures = failures - 1;
    ASSERT_TRUE(FailTask(task, FailureClass::kRetryable, "oom", 100, policy, kNow).ok());
    EXPECT_EQ(task.state, TaskState::kPending) << failures;
    EXPECT_EQ(task.failures, failures);
    EXPECT_EQ(task.not_before, kNow + wait) << failures;
    EXPECT_EQ(task.lease_expires_at, std::nullopt);
    EXPECT_EQ(task.last_error, "oom");
  }
}

TEST(FailTask, RetryableFailsAtMaxAttempts) {
  Task task = RunningTask();
  task.failures = 2;
  ASSERT_TRUE(FailTask(task, FailureClass::kRetryable, "oom", 3, RetryPolicy{}, kNow).ok());
  EXPECT_EQ(task.state, TaskState::kFailed);
  EXPECT_EQ(task.failures, 3);
  EXPECT_EQ(task.finished_at, kNow);
  EXPECT_EQ(task.last_error, "failed 3 times; last: oom");
}

TEST(FailTask, PermanentFailsAtOnce) {
  Task task = RunningTask();
  ASSERT_TRUE(FailTask(task, FailureClass::kPermanent, "model not found", 4, RetryPolicy{}, kNow).ok());
  EXPECT_EQ(task.state, TaskState::kFailed);
  EXPECT_EQ(task.failures, 1);
  EXPECT_EQ(task.last_error, "model not found");
  EXPECT_EQ(task.finished_at, kNow);
}

TEST(FailTask, PreemptionNeverCounts) {
  Task task = PendingTask();
  task.failures = 3;  // one real failure from the limit
  for (int i = 1; i <= 10; ++i) {
    ASSERT_TRUE(GrantTask(task, "exe-a", absl::Seconds(30), kNow).ok());
    task.records_done = 5;
    ASSERT_TRUE(FailTask(task, FailureClass::kPreempted, "owner back", 4, RetryPolicy{}, kNow).ok());
    EXPECT_EQ(task.state, TaskState::kPending);
    EXPECT_EQ(task.preemptions, i);
    EXPECT_EQ(task.failures, 3);
    EXPECT_EQ(task.not_before, std::nullopt);  // leasable again at once
    EXPECT_EQ(task.records_done, 0);
  }
  EXPECT_EQ(task.attempt, 10);
}

TEST(FailTask, OnlyARunningTask) {
  for (TaskState state : {TaskState::kPending, TaskState::kSucceeded, TaskState::kFailed, TaskState::kCancelled}) {
    for (FailureClass f : {FailureClass::kRetryable, FailureClass::kPermanent, FailureClass::kPreempted}) {
      Task task = PendingTask();
      task.state = state;
      EXPECT_EQ(FailTask(task, f, "x", 4, RetryPolicy{}, kNow).code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_EQ(task.state, state);
    }
  }
}

TEST(ExpireLease, OnlyOnceTheLeaseHasRunOut) {
  Task task = RunningTask("exe-a", absl::Seconds(30));
  EXPECT_EQ(ExpireLease(task, 4, RetryPolicy{}, kNow + absl::Seconds(29)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(task.state, TaskState::kRunning);

  ASSERT_TRUE(ExpireLease(task, 4, RetryPolicy{}, kNow + absl::Seconds(30)).ok());
  EXPECT_EQ(task.state, TaskState::kPending);
  EXPECT_EQ(task.failures, 1);
  EXPECT_EQ(task.not_before, std::nullopt);  // the first loss fails over at once
  EXPECT_THAT(task.last_error, HasSubstr("attempt 1"));
  EXPECT_THAT(task.last_error, HasSubstr("exe-a"));

  // Not running any more: nothing to expire.
  EXPECT_EQ(ExpireLease(task, 4, RetryPolicy{}, kNow + absl::Hours(1)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ExpireLease, RepeatedLossesBackOff) {
  Task task = RunningTask();
  task.failures = 1;
  ASSERT_TRUE(ExpireLease(task, 4, RetryPolicy{}, kNow + absl::Minutes(1)).ok());
  EXPECT_EQ(task.state, TaskState::kPending);
  EXPECT_EQ(task.not_before, kNow + absl::Minutes(1) + 2 * RetryPolicy{}.backoff_base);
}

TEST(ExpireLease, TheLastAttemptFailsTheTask) {
  Task task = RunningTask();
  task.failures = 3;
  ASSERT_TRUE(ExpireLease(task, 4, RetryPolicy{}, kNow + absl::Minutes(1)).ok());
  EXPECT_EQ(task.state, TaskState::kFailed);
  EXPECT_EQ(task.failures, 4);
}

TEST(CancelTask, PendingAndRunningAreCancelledTerminalStay) {
  Task pending = PendingTask();
  CancelTask(pending, kNow);
  EXPECT_EQ(pending.state, TaskState::kCancelled);
  EXPECT_EQ(pending.finished_at, kNow);

  Task running = RunningTask();
  CancelTask(running, kNow);
  EXPECT_EQ(running.state, TaskState::kCancelled);
  EXPECT_EQ(running.lease_expires_at, std::nullopt);

  Task done = RunningTask();
  ASSERT_TRUE(CompleteTask(done, 10, 0, kNow).ok());
  CancelTask(done, kNow + absl::Seconds(1));
  EXPECT_EQ(done.state, TaskState::kSucceeded);
  EXPECT_EQ(done.finished_at, kNow);
}

// --- jobs ---

Job RunningJob(int64_t n_tasks) {
  Job job;
  job.id = "job-1";
  job.state = JobState::kRunning;
  job.n_tasks = n_tasks;
  job.counts.total = n_tasks * 10;
  return job;
}

Task Ended(TaskState state, int64_t records_failed = 0) {
  Task task = PendingTask(10);
  task.state = state;
  if (state == TaskState::kSucceeded) {
    task.records_done = 10;
    task.records_failed = records_failed;
  }
  task.last_error = state == TaskState::kFailed ? "boom" : "";
  return task;
}

TEST(AccountTerminalTask, CountsRecordsOfEachOutcome) {
  Job job = RunningJob(4);
  AccountTerminalTask(job, Ended(TaskState::kSucceeded, 3), kNow);
  EXPECT_EQ(job.counts.completed, 7);
  EXPECT_EQ(job.counts.failed, 3);
  AccountTerminalTask(job, Ended(TaskState::kFailed), kNow);
  EXPECT_EQ(job.counts.completed, 7);
  EXPECT_EQ(job.counts.failed, 13);
  AccountTerminalTask(job, Ended(TaskState::kCancelled), kNow);
  EXPECT_EQ(job.counts.completed, 7);
  EXPECT_EQ(job.counts.failed, 13);
  EXPECT_EQ(job.tasks_done, 3);
  EXPECT_EQ(job.tasks_succeeded, 1);
  EXPECT_EQ(job.state, JobState::kRunning);
  EXPECT_EQ(job.updated_at, kNow);
}

TEST(AccountTerminalTask, TheLastTaskFinalizesTheJob) {
  struct Case {
    std::vector<TaskState> tasks;
    JobState expected;
  };
  const Case cases[] = {
      {{TaskState::kSucceeded}, JobState::kFinalizing},
      {{TaskState::kSucceeded, TaskState::kSucceeded}, JobState::kFinalizing},
      {{TaskState::kFailed, TaskState::kSucceeded}, JobState::kFinalizing},  // partial failure completes
      {{TaskState::kSucceeded, TaskState::kFailed}, JobState::kFinalizing},
      {{TaskState::kFailed}, JobState::kFailed},
      {{TaskState::kFailed, TaskState::kFailed, TaskState::kFailed}, JobState::kFailed},
  };
  for (const Case& c : cases) {
    Job job = RunningJob(static_cast<int64_t>(c.tasks.size()));
    for (size_t i = 0; i < c.tasks.size(); ++i) {
      EXPECT_EQ(job.state, JobState::kRunning);
      AccountTerminalTask(job, Ended(c.tasks[i]), kNow + absl::Seconds(i));
    }
    EXPECT_EQ(job.state, c.expected) << ::testing::PrintToString(c.tasks.size());
    EXPECT_EQ(job.counts.completed + job.counts.failed, job.counts.total);
    if (c.expected == JobState::kFailed) {
      EXPECT_THAT(job.error, HasSubstr("every task failed"));
      EXPECT_THAT(job.error, HasSubstr("boom"));
      EXPECT_TRUE(job.finished_at.has_value());
    } else {
      EXPECT_EQ(job.error, "");
      EXPECT_FALSE(job.finished_at.has_value());
    }
  }
}

TEST(AccountTerminalTask, AnEndedJobKeepsItsState) {
  Job job = RunningJob(2);
  job.state = JobState::kCancelled;
  AccountTerminalTask(job, Ended(TaskState::kCancelled), kNow);
  AccountTerminalTask(job, Ended(TaskState::kCancelled), kNow);
  EXPECT_EQ(job.state, JobState::kCancelled);
  EXPECT_EQ(job.tasks_done, 2);
  EXPECT_EQ(job.error, "");
}

TEST(MarkJobStarted, QueuedBecomesRunningOnce) {
  Job job = RunningJob(1);
  job.state = JobState::kQueued;
  EXPECT_TRUE(MarkJobStarted(job, kNow));
  EXPECT_EQ(job.state, JobState::kRunning);
  EXPECT_EQ(job.started_at, kNow);
  EXPECT_EQ(job.updated_at, kNow);
  // Later leases change nothing, so the store need not write the job row again.
  EXPECT_FALSE(MarkJobStarted(job, kNow + absl::Seconds(5)));
  EXPECT_EQ(job.state, JobState::kRunning);
  EXPECT_EQ(job.started_at, kNow);
  EXPECT_EQ(job.updated_at, kNow);
}

// --- checkpoints ---

Chunk MakeChunk(int attempt, int seq, int64_t begin, int64_t end, int64_t failed = 0) {
  return Chunk{attempt, seq, begin, end, failed};
}

TEST(CommitChunks, ExtendsTheCommittedPrefixInOrderAndSkipsRepeats) {
  Task task = RunningTask();
  ASSERT_EQ(*CommitChunks(task, {MakeChunk(1, 0, 0, 3, 1)}), 1);
  EXPECT_EQ(CommittedRecords(task), 3);
  // The executor lists every chunk in every heartbeat: repeats change nothing.
  ASSERT_EQ(*CommitChunks(task, {MakeChunk(1, 0, 0, 3, 1), MakeChunk(1, 1, 3, 5)}), 1);
  EXPECT_EQ(CommittedRecords(task), 5);
  EXPECT_EQ(CommittedFailed(task), 1);
  EXPECT_EQ(NextChunkSeq(task), 2);
}

TEST(CommitChunks, RefusesGapsOverlapsOverrunsAndOtherAttempts) {
  for (const Chunk& bad : {MakeChunk(1, 1, 4, 6), MakeChunk(1, 1, 2, 6), MakeChunk(1, 1, 3, 11),
                           MakeChunk(1, 1, 3, 3), MakeChunk(2, 1, 3, 6), MakeChunk(1, 1, 3, 5, 3)}) {
    Task task = RunningTask();
    ASSERT_TRUE(CommitChunks(task, {MakeChunk(1, 0, 0, 3)}).ok());
    auto result = CommitChunks(task, {bad});
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
        << "[" << bad.begin << ", " << bad.end << ") attempt " << bad.attempt;
    EXPECT_EQ(CommittedRecords(task), 3);
  }
}

TEST(Checkpoints, TheNextAttemptResumesAfterTheCommittedChunks) {
  Task task = RunningTask("exe-a");
  LeaseProgress beat{task.job_id, task.index, 1, 6, 0, {MakeChunk(1, 0, 0, 4, 1)}};
  ASSERT_TRUE(RenewLease(task, beat, absl::Seconds(30), kNow + absl::Seconds(1)).ok());
  EXPECT_EQ(task.lease_expires_at, kNow + absl::Seconds(31));
  EXPECT_EQ(task.records_done, 6);
  // The executor vanishes: the lease expires, the chunk stays, and the next attempt starts at 4.
  ASSERT_TRUE(ExpireLease(task, 4, RetryPolicy{}, kNow + absl::Minutes(1)).ok());
  EXPECT_EQ(task.records_done, 4);
  ASSERT_TRUE(GrantTask(task, "exe-b", absl::Seconds(30), kNow + absl::Minutes(10)).ok());
  EXPECT_EQ(task.attempt, 2);
  EXPECT_EQ(task.records_done, 4);
  EXPECT_EQ(task.records_failed, 1);
  EXPECT_EQ(NextChunkSeq(task), 0);
  // It completes without listing chunks: the rest is its chunk 0.
  ASSERT_TRUE(CompleteTask(task, 10, 2, kNow + absl::Minutes(11)).ok());
  EXPECT_THAT(task.chunks, ElementsAre(MakeChunk(1, 0, 0, 4, 1), MakeChunk(2, 0, 4, 10, 1)));
  EXPECT_EQ(task.records_failed, 2);
}

TEST(Checkpoints, AHeartbeatWithABadChunkStillRenewsTheLease) {
  Task task = RunningTask();
  LeaseProgress beat{task.job_id, task.index, 1, 3, 0, {MakeChunk(1, 0, 2, 3)}};
  EXPECT_EQ(RenewLease(task, beat, absl::Seconds(30), kNow + absl::Seconds(5)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(task.lease_expires_at, kNow + absl::Seconds(35));
  EXPECT_TRUE(task.chunks.empty());
}

TEST(Checkpoints, ACompletionWhoseChunksDisagreeChangesNothing) {
  Task task = RunningTask();
  LeaseProgress report{task.job_id, task.index, 1, 10, 0, {MakeChunk(1, 0, 0, 4), MakeChunk(1, 1, 5, 10)}};
  EXPECT_EQ(CompleteTask(task, report, kNow).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(task.state, TaskState::kRunning);
  EXPECT_TRUE(task.chunks.empty());
  report.chunks = {MakeChunk(1, 0, 0, 4, 2), MakeChunk(1, 1, 4, 10, 1)};
  ASSERT_TRUE(CompleteTask(task, report, kNow).ok());
  EXPECT_EQ(task.records_failed, 3);  // the chunks' count, whatever the report said
}

TEST(Checkpoints, FailuresOfEveryClassKeepTheCommittedChunks) {
  for (FailureClass failure : {FailureClass::kRetryable, FailureClass::kPermanent, FailureClass::kPreempted}) {
    Task task = RunningTask();
    ASSERT_TRUE(CommitChunks(task, {MakeChunk(1, 0, 0, 5)}).ok());
    ASSERT_TRUE(FailTask(task, failure, "x", 4, RetryPolicy{}, kNow).ok());
    EXPECT_EQ(CommittedRecords(task), 5) << FailureClassName(failure);
    EXPECT_EQ(task.records_done, 5);
  }
}

TEST(AccountTerminalTask, AFailedTasksCommittedChunksCountAsServed) {
  Job job = RunningJob(2);
  Task failed = Ended(TaskState::kFailed);
  failed.chunks = {MakeChunk(1, 0, 0, 4, 1)};
  AccountTerminalTask(job, failed, kNow);
  EXPECT_EQ(job.counts.completed, 3);
  EXPECT_EQ(job.counts.failed, 7);
}

// --- deadlines ---

TEST(ExpireJob, OnlyOnceTheWindowHasPassed) {
  Job job = RunningJob(1);
  job.created_at = kNow;
  std::vector<Task> tasks = {RunningTask()};
  EXPECT_EQ(ExpireJob(job, tasks, kNow + absl::Hours(100)).code(), absl::StatusCode::kFailedPrecondition);  // no window
  job.spec.completion_window = absl::Hours(1);
  EXPECT_FALSE(DeadlinePassed(job, kNow + absl::Minutes(59)));
  EXPECT_EQ(ExpireJob(job, tasks, kNow + absl::Minutes(59)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(DeadlinePassed(job, kNow + absl::Hours(1)));
  job.state = JobState::kCompleted;
  EXPECT_FALSE(DeadlinePassed(job, kNow + absl::Hours(2)));
}

TEST(ExpireJob, CancelsUnfinishedTasksKeepsTheirChunksAndFinalizes) {
  Job job = RunningJob(3);
  job.created_at = kNow;
  job.spec.completion_window = absl::Hours(1);
  Task done = Ended(TaskState::kSucceeded, 1);
  AccountTerminalTask(job, done, kNow);
  Task running = RunningTask();
  ASSERT_TRUE(CommitChunks(running, {MakeChunk(1, 0, 0, 6, 2)}).ok());
  std::vector<Task> unfinished = {running, PendingTask()};
  ASSERT_TRUE(ExpireJob(job, unfinished, kNow + absl::Hours(2)).ok());
  EXPECT_EQ(job.state, JobState::kFinalizing);
  EXPECT_THAT(job.error, HasSubstr("completion window of 1h"));
  for (const Task& t : unfinished) EXPECT_EQ(t.state, TaskState::kCancelled);
  EXPECT_EQ(unfinished[0].chunks.size(), 1u);
  EXPECT_EQ(job.tasks_done, 3);
  EXPECT_EQ(job.counts.completed, 9 + 4);      // the finished task, and the running one's chunk
  EXPECT_EQ(job.counts.failed, 1 + 6 + 10);    // everything else has an error line
  EXPECT_TRUE(IsAllowed(job.state, JobState::kExpired));
}

TEST(ExpireJob, AJobStillValidatingExpiresAtOnce) {
  Job job = RunningJob(0);
  job.state = JobState::kValidating;
  job.created_at = kNow;
  job.spec.completion_window = absl::Minutes(5);
  std::vector<Task> none;
  ASSERT_TRUE(ExpireJob(job, none, kNow + absl::Minutes(5)).ok());
  EXPECT_EQ(job.state, JobState::kExpired);
  EXPECT_EQ(job.finished_at, kNow + absl::Minutes(5));
}

// --- stragglers ---

TEST(Backups, TheStragglerBecomesAShadowAndTheTaskIsLeasedElsewhere) {
  Task task = RunningTask("exe-slow");
  ASSERT_TRUE(CommitChunks(task, {MakeChunk(1, 0, 0, 4)}).ok());
  ASSERT_TRUE(RequestBackup(task, kNow).ok());
  EXPECT_EQ(task.state, TaskState::kPending);
  EXPECT_EQ(task.shadow, (Task::Shadow{1, "exe-slow", kNow})) << "it keeps when it became a shadow";
  EXPECT_EQ(RequestBackup(task, kNow).code(), absl::StatusCode::kFailedPrecondition);
  // Never to the straggler's own executor.
  EXPECT_EQ(GrantTask(task, "exe-slow", absl::Seconds(30), kNow).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(GrantTask(task, "exe-fast", absl::Seconds(30), kNow).ok());
  EXPECT_EQ(task.attempt, 2);
  EXPECT_EQ(task.records_done, 4);  // the backup resumes after the committed chunk
  // Both attempts pass the fence; a third does not.
  EXPECT_TRUE(CheckFence(task, "exe-slow", 1).ok());
  EXPECT_TRUE(CheckFence(task, "exe-fast", 2).ok());
  EXPECT_FALSE(CheckFence(task, "exe-slow", 2).ok());
  EXPECT_FALSE(CheckFence(task, "exe-fast", 1).ok());
}

TEST(Backups, WhileTwoAttemptsRaceNoChunkIsCommitted) {
  Task task = RunningTask("exe-slow");
  ASSERT_TRUE(RequestBackup(task, kNow).ok());
  ASSERT_TRUE(GrantTask(task, "exe-fast", absl::Seconds(30), kNow).ok());
  ASSERT_TRUE(RenewLease(task, {task.job_id, task.index, 1, 5, 0, {MakeChunk(1, 0, 0, 5)}}, absl::Seconds(30), kNow).ok());
  ASSERT_TRUE(RenewLease(task, {task.job_id, task.index, 2, 3, 0, {MakeChunk(2, 0, 0, 3)}}, absl::Seconds(30), kNow).ok());
  EXPECT_TRUE(task.chunks.empty());
}

TEST(Backups, TheShadowFinishingFirstWinsAndTheBackupIsFencedOff) {
  Task task = RunningTask("exe-slow");
  ASSERT_TRUE(RequestBackup(task, kNow).ok());
  ASSERT_TRUE(GrantTask(task, "exe-fast", absl::Seconds(30), kNow).ok());
  LeaseProgress shadow_done{task.job_id, task.index, 1, 10, 0, {MakeChunk(1, 0, 0, 10)}};
  ASSERT_TRUE(CompleteTask(task, shadow_done, kNow).ok());
  EXPECT_EQ(task.state, TaskState::kSucceeded);
  EXPECT_EQ(task.attempt, 1);
  EXPECT_EQ(task.executor_id, "exe-slow");
  EXPECT_EQ(task.shadow, std::nullopt);
  EXPECT_EQ(CheckFence(task, "exe-fast", 2).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Backups, TheBackupFinishingFirstWinsAndTheShadowIsFencedOff) {
  Task task = RunningTask("exe-slow");
  ASSERT_TRUE(RequestBackup(task, kNow).ok());
  // The shadow may even finish before any backup was granted.
  Task early = task;
  ASSERT_TRUE(CompleteTask(early, {task.job_id, task.index, 1, 10, 0, {}}, kNow).ok());
  EXPECT_EQ(early.state, TaskState::kSucceeded);

  ASSERT_TRUE(GrantTask(task, "exe-fast", absl::Seconds(30), kNow).ok());
  ASSERT_TRUE(CompleteTask(task, {task.job_id, task.index, 2, 10, 0, {MakeChunk(2, 0, 0, 10)}}, kNow).ok());
  EXPECT_EQ(task.attempt, 2);
  EXPECT_EQ(task.shadow, std::nullopt);
  EXPECT_EQ(CheckFence(task, "exe-slow", 1).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Backups, AFailingShadowIsDroppedWithoutCounting) {
  Task task = RunningTask("exe-slow");
  ASSERT_TRUE(RequestBackup(task, kNow).ok());
  ASSERT_TRUE(GrantTask(task, "exe-fast", absl::Seconds(30), kNow).ok());
  EXPECT_FALSE(DropShadow(task, 2));
  EXPECT_TRUE(DropShadow(task, 1));
  EXPECT_EQ(task.shadow, std::nullopt);
  EXPECT_EQ(task.failures, 0);
  EXPECT_EQ(task.state, TaskState::kRunning);
}

}  // namespace
}  // namespace minions
