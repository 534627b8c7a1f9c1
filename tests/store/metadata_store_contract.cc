// The MetadataStore contract's scenarios of a task's life (see metadata_store_contract.h): leases
// and their expiry, failures, cancelling and finishing, who gets what, deadlines and stragglers;
// executors' reports are in report_contract.cc, what the server reads in listing_contract.cc. Each
// test tells one story; time only moves when the story says so.

#include "metadata_store_contract.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <thread>

namespace minions {
namespace {

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MetadataStoreContract);

std::vector<int64_t> Indexes(const std::vector<Lease>& leases) {
  std::vector<int64_t> indexes;
  for (const Lease& lease : leases) indexes.push_back(lease.task.index);
  return indexes;
}

// --- a task's whole life ---

TEST_P(MetadataStoreContract, AJobFromSubmissionToCompletion) {
  // A job is created in validating, with a fresh id.
  ASSERT_OK_AND_ASSIGN(Job created, store_->CreateJob(Spec(), now_));
  EXPECT_THAT(created.id, ::testing::MatchesRegex("job-[0-9a-f]{12}"));
  EXPECT_EQ(created.state, JobState::kValidating);
  EXPECT_EQ(created.spec.model, "/models/tiny.gguf");
  EXPECT_EQ(created.created_at, now_);
  const std::string job_id = created.id;

  // Validation splits it into two tasks of 10 records: queued.
  ASSERT_OK(store_->AddTasks(job_id, Shards(2), 20, now_));
  Job job = GetJob(job_id);
  EXPECT_EQ(job.state, JobState::kQueued);
  EXPECT_EQ(job.n_tasks, 2);
  EXPECT_EQ(job.counts.total, 20);
  EXPECT_EQ(job.spec.runner_options, Json({{"n_parallel", 2}}));
  ASSERT_OK_AND_ASSIGN(std::vector<Task> tasks, store_->ListTasks(job_id));
  ASSERT_THAT(tasks, SizeIs(2));
  for (const Task& task : tasks) {
    EXPECT_EQ(task.state, TaskState::kPending);
    EXPECT_EQ(task.attempt, 0);
    EXPECT_EQ(task.job_id, job_id);
  }
  EXPECT_EQ(tasks[1].first_record, 10);
  EXPECT_EQ(tasks[1].byte_begin, 1000);
  EXPECT_EQ(tasks[1].byte_end, 2000);

  RequestCounts last = job.counts;
  auto counts_only_grow = [&] {
    RequestCounts counts = GetJob(job_id).counts;
    EXPECT_EQ(counts.total, last.total);
    EXPECT_GE(counts.completed, last.completed);
    EXPECT_GE(counts.failed, last.failed);
    last = counts;
  };

  // Executor A registers and leases one task: attempt 1 of task 0, until now + ttl.
  Advance(absl::Seconds(1));
  const std::string a = Register("mac-a");
  EXPECT_THAT(a, ::testing::MatchesRegex("exe-[0-9a-f]{12}"));
  EXPECT_EQ(GetExecutor(a).state, ExecutorState::kAvailable);
  std::vector<Lease> leases = LeaseExactly(a, 1);
  const Lease lease = leases[0];
  EXPECT_EQ(lease.task.job_id, job_id);
  EXPECT_EQ(lease.task.index, 0);
  EXPECT_EQ(lease.task.attempt, 1);
  EXPECT_EQ(lease.task.state, TaskState::kRunning);
  EXPECT_EQ(lease.task.executor_id, a);
  EXPECT_EQ(lease.expires_at, now_ + kTtl);
  EXPECT_EQ(lease.job_model, "/models/tiny.gguf");
  EXPECT_EQ(lease.input_key, "inputs/in.jsonl");
  EXPECT_EQ(lease.runner_options, Json({{"n_parallel", 2}}));
  job = GetJob(job_id);
  EXPECT_EQ(job.state, JobState::kRunning);
  EXPECT_EQ(job.started_at, now_);
  EXPECT_EQ(GetExecutor(a).state, ExecutorState::kBusy);
  counts_only_grow();

  // 20 s later its heartbeat renews the lease and records its committed progress.
  Advance(absl::Seconds(20));
  ASSERT_OK_AND_ASSIGN(HeartbeatReply reply,
                       store_->Heartbeat(a, ExecutorState::kBusy, "", {Progress(lease, 5, 1)}, kTtl, now_));
  EXPECT_FALSE(reply.unknown_executor);
  EXPECT_FALSE(reply.drain);
  EXPECT_THAT(reply.cancel, IsEmpty());
  ASSERT_THAT(reply.renewed, SizeIs(1));
  Task task0 = GetTask(job_id, 0);
  EXPECT_EQ(task0.lease_expires_at, now_ + kTtl);
  EXPECT_EQ(task0.records_done, 5);
  EXPECT_EQ(task0.records_failed, 1);
  EXPECT_EQ(GetExecutor(a).last_heartbeat_at, now_);

  // Past the first lease's expiry, the renewed lease still holds.
  Advance(absl::Seconds(20));
  ASSERT_OK_AND_ASSIGN(std::vector<Task> expired, store_->ExpireLeases(now_, 100));
  EXPECT_THAT(expired, IsEmpty());

  // A completes task 0 with 1 error line among its 10 records.
  ASSERT_OK_AND_ASSIGN(Task done, store_->CompleteTask(a, job_id, 0, 1, 10, 1, now_));
  EXPECT_EQ(done.state, TaskState::kSucceeded);
  EXPECT_EQ(done.finished_at, now_);
  job = GetJob(job_id);
  EXPECT_EQ(job.state, JobState::kRunning);
  EXPECT_EQ(job.counts.completed, 9);
  EXPECT_EQ(job.counts.failed, 1);
  EXPECT_EQ(job.tasks_done, 1);
  counts_only_grow();

  // Then task 1; the last task moves the job to finalizing.
  leases = LeaseUpTo(a, 4);
  ASSERT_THAT(Indexes(leases), ElementsAre(1));
  Advance(absl::Seconds(3));
  ASSERT_OK(store_->CompleteTask(a, job_id, 1, leases[0].task.attempt, 10, 0, now_));
  job = GetJob(job_id);
  EXPECT_EQ(TallyOf(job), (JobTally{JobState::kFinalizing, 2, 2, 19, 1}));
  counts_only_grow();
  ASSERT_OK_AND_ASSIGN(std::vector<Job> to_finalize, store_->JobsToFinalize(10, now_));
  ASSERT_THAT(to_finalize, SizeIs(1));
  EXPECT_EQ(to_finalize[0].id, job_id);

  // The server merges the output and finishes the job.
  Advance(absl::Seconds(1));
  EXPECT_EQ(job.tokens, std::nullopt) << "tokens are counted when the job finishes";
  const TokenUsage tokens{
      .prompt_tokens = 1234, .completion_tokens = int64_t{5} << 32, .reasoning_tokens = int64_t{3} << 32};
  ASSERT_OK_AND_ASSIGN(Job finished, store_->FinishJob(job_id, "out/o.jsonl", "out/e.jsonl", "out/m.json", now_,
                                                       JobState::kCompleted, tokens));
  EXPECT_EQ(finished.state, JobState::kCompleted);
  EXPECT_EQ(finished.tokens, tokens);
  job = GetJob(job_id);
  EXPECT_EQ(job.tokens, tokens) << "kept with the job";
  ASSERT_OK_AND_ASSIGN(std::vector<Job> listed, store_->ListJobs(JobFilter{}));
  ASSERT_THAT(listed, SizeIs(1));
  EXPECT_EQ(listed[0].tokens, tokens) << "and listed with it";
  EXPECT_EQ(job.state, JobState::kCompleted);
  EXPECT_EQ(job.output_key, "out/o.jsonl");
  EXPECT_EQ(job.errors_key, "out/e.jsonl");
  EXPECT_EQ(job.manifest_key, "out/m.json");
  EXPECT_EQ(job.finished_at, now_);
  counts_only_grow();
  ASSERT_OK_AND_ASSIGN(to_finalize, store_->JobsToFinalize(10, now_));
  EXPECT_THAT(to_finalize, IsEmpty());
  EXPECT_EQ(GetExecutor(a).records_done, 20);
}

// --- leases run out ---

TEST_P(MetadataStoreContract, AnExpiredLeaseIsRequeuedAndTheOldAttemptIsFenced) {
  const std::string job_id = Submit(Spec(), 1);
  const auto [a, b] = RegisterAll({"a", "b"});

  // A leases task 0, then goes silent.
  ASSERT_THAT(LeaseUpTo(a, 1), SizeIs(1));
  Advance(absl::Seconds(29));
  ASSERT_OK_AND_ASSIGN(std::vector<Task> expired, store_->ExpireLeases(now_, 100));
  EXPECT_THAT(expired, IsEmpty());

  // 31 s after the lease: the watchdog requeues it, at once (a first loss fails over without
  // backoff: the executor vanished, the task did nothing wrong).
  Advance(absl::Seconds(2));
  ASSERT_OK_AND_ASSIGN(expired, store_->ExpireLeases(now_, 100));
  ASSERT_THAT(expired, SizeIs(1));
  EXPECT_EQ(expired[0].state, TaskState::kPending);
  EXPECT_EQ(expired[0].failures, 1);
  EXPECT_EQ(expired[0].not_before, std::nullopt);
  EXPECT_THAT(expired[0].last_error, HasSubstr("expired"));
  EXPECT_EQ(GetTask(job_id, 0).state, TaskState::kPending);

  // B gets attempt 2 right away.
  std::vector<Lease> leases = LeaseExactly(b, 1);
  EXPECT_EQ(leases[0].task.attempt, 2);
  EXPECT_EQ(leases[0].task.executor_id, b);

  // A comes back: its late completion of attempt 1 is refused, and its heartbeat is told to stop.
  absl::StatusOr<Task> late = store_->CompleteTask(a, job_id, 0, 1, 10, 0, now_);
  EXPECT_CODE(late, kFailedPrecondition);
  EXPECT_THAT(Message(late.status()), HasSubstr("stale attempt"));
  ASSERT_OK_AND_ASSIGN(HeartbeatReply reply,
                       store_->Heartbeat(a, ExecutorState::kAvailable, "", {{job_id, 0, 1, 10, 0}}, kTtl, now_));
  ASSERT_THAT(reply.cancel, SizeIs(1));
  EXPECT_EQ(reply.cancel[0].attempt, 1);
  EXPECT_THAT(reply.renewed, IsEmpty());

  // B's completion of attempt 2 is accepted.
  ASSERT_OK_AND_ASSIGN(Task done, store_->CompleteTask(b, job_id, 0, 2, 10, 0, now_));
  EXPECT_EQ(done.state, TaskState::kSucceeded);
  EXPECT_EQ(GetJob(job_id).state, JobState::kFinalizing);
  EXPECT_EQ(GetJob(job_id).counts.completed, 10);
}

TEST_P(MetadataStoreContract, ExpiryAtTheLastAttemptFailsTheTask) {
  const std::string job_id = Submit(Spec(/*priority=*/0, /*max_attempts=*/1), 1);
  const std::string a = Register("a");
  ASSERT_THAT(LeaseUpTo(a, 1), SizeIs(1));
  Advance(kTtl);
  ASSERT_OK_AND_ASSIGN(std::vector<Task> expired, store_->ExpireLeases(now_, 100));
  ASSERT_THAT(expired, SizeIs(1));
  EXPECT_EQ(expired[0].state, TaskState::kFailed);
  Job job = GetJob(job_id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.counts.failed, 10);
}

TEST_P(MetadataStoreContract, ExpireLeasesHonoursItsLimit) {
  Submit(Spec(), 5);
  const std::string a = Register("a");
  ASSERT_THAT(LeaseUpTo(a, 5), SizeIs(5));
  Advance(kTtl);
  ASSERT_OK_AND_ASSIGN(std::vector<Task> first, store_->ExpireLeases(now_, 3));
  EXPECT_THAT(first, SizeIs(3));
  ASSERT_OK_AND_ASSIGN(std::vector<Task> rest, store_->ExpireLeases(now_, 3));
  EXPECT_THAT(rest, SizeIs(2));
}

// --- failures ---

TEST_P(MetadataStoreContract, RetryableFailuresBackOffThenFailTheTaskAtMaxAttempts) {
  const std::string job_id = Submit(Spec(/*priority=*/0, /*max_attempts=*/3), 1);
  const std::string a = Register("a");
  absl::Duration wait = kRetry.backoff_base;
  for (int attempt = 1; attempt <= 2; ++attempt) {
    std::vector<Lease> leases = LeaseExactly(a, 1);
    EXPECT_EQ(leases[0].task.attempt, attempt);
    ASSERT_OK_AND_ASSIGN(Task task,
                         store_->FailTask(a, job_id, 0, attempt, FailureClass::kRetryable, "runner crashed", now_));
    EXPECT_EQ(task.state, TaskState::kPending);
    EXPECT_EQ(task.failures, attempt);
    EXPECT_EQ(task.not_before, now_ + wait);
    // Not leasable until the backoff is over, to the microsecond.
    EXPECT_THAT(LeaseUpTo(a, 1), IsEmpty());
    Advance(wait - absl::Microseconds(1));
    EXPECT_THAT(LeaseUpTo(a, 1), IsEmpty());
    Advance(absl::Microseconds(1));
    wait *= 2;
  }
  ASSERT_THAT(LeaseUpTo(a, 1), SizeIs(1));
  ASSERT_OK_AND_ASSIGN(Task task, store_->FailTask(a, job_id, 0, 3, FailureClass::kRetryable, "runner crashed", now_));
  EXPECT_EQ(task.state, TaskState::kFailed);
  EXPECT_EQ(task.failures, 3);
  EXPECT_THAT(task.last_error, HasSubstr("runner crashed"));
  Advance(absl::Hours(1));
  EXPECT_THAT(LeaseUpTo(a, 1), IsEmpty());
  // Its only task failed: so did the job.
  EXPECT_EQ(GetJob(job_id).state, JobState::kFailed);
}

TEST_P(MetadataStoreContract, PreemptionNeverCountsTowardMaxAttempts) {
  const std::string job_id = Submit(Spec(/*priority=*/0, /*max_attempts=*/2), 1);
  const std::string a = Register("a");
  for (int i = 1; i <= 5; ++i) {
    // The owner keeps coming back: each attempt is handed back at once and leasable at once.
    std::vector<Lease> leases = LeaseUpTo(a, 1);
    ASSERT_THAT(leases, SizeIs(1)) << "attempt " << i;
    EXPECT_EQ(leases[0].task.attempt, i);
    ASSERT_OK_AND_ASSIGN(Task task,
                         store_->FailTask(a, job_id, 0, i, FailureClass::kPreempted, "owner is back", now_));
    EXPECT_EQ(task.state, TaskState::kPending);
    EXPECT_EQ(task.failures, 0);
    EXPECT_EQ(task.preemptions, i);
  }
  std::vector<Lease> leases = LeaseExactly(a, 1);
  ASSERT_OK(store_->CompleteTask(a, job_id, 0, 6, 10, 0, now_));
  EXPECT_EQ(GetJob(job_id).state, JobState::kFinalizing);
}

TEST_P(MetadataStoreContract, PermanentFailureFailsFastAndTheJobStillFinalizes) {
  const std::string job_id = Submit(Spec(/*priority=*/0, /*max_attempts=*/4), 2);
  const std::string a = Register("a");
  std::vector<Lease> leases = LeaseUpTo(a, 2);
  ASSERT_THAT(Indexes(leases), ElementsAre(0, 1));

  ASSERT_OK_AND_ASSIGN(Task failed,
                       store_->FailTask(a, job_id, 0, 1, FailureClass::kPermanent, "unsupported endpoint", now_));
  EXPECT_EQ(failed.state, TaskState::kFailed);
  EXPECT_EQ(failed.failures, 1);
  EXPECT_EQ(failed.last_error, "unsupported endpoint");
  Job job = GetJob(job_id);
  EXPECT_EQ(job.state, JobState::kRunning);
  EXPECT_EQ(job.counts.failed, 10);

  ASSERT_OK(store_->CompleteTask(a, job_id, 1, 1, 10, 2, now_));
  job = GetJob(job_id);
  EXPECT_EQ(TallyOf(job), (JobTally{JobState::kFinalizing, 2, 1, 8, 12}));
  EXPECT_EQ(job.counts.completed + job.counts.failed, job.counts.total);
}

TEST_P(MetadataStoreContract, AJobWhoseTasksAllFailEndsFailed) {
  const std::string job_id = Submit(Spec(), 2);
  const std::string a = Register("a");
  ASSERT_THAT(LeaseUpTo(a, 2), SizeIs(2));
  ASSERT_OK(store_->FailTask(a, job_id, 0, 1, FailureClass::kPermanent, "bad model", now_));
  ASSERT_OK(store_->FailTask(a, job_id, 1, 1, FailureClass::kPermanent, "bad model", now_));
  Job job = GetJob(job_id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_THAT(job.error, HasSubstr("bad model"));
  EXPECT_EQ(job.counts.failed, 20);
  EXPECT_EQ(job.finished_at, now_);
  ASSERT_OK_AND_ASSIGN(std::vector<Job> to_finalize, store_->JobsToFinalize(10, now_));
  EXPECT_THAT(to_finalize, IsEmpty());
}

TEST_P(MetadataStoreContract, ACompletionMustAccountForEveryRecord) {
  const std::string job_id = Submit(Spec(), 1);
  const std::string a = Register("a");
  ASSERT_THAT(LeaseUpTo(a, 1), SizeIs(1));
  EXPECT_CODE(store_->CompleteTask(a, job_id, 0, 1, 9, 0, now_), kInvalidArgument);
  // Nothing changed: the right report is still accepted.
  EXPECT_EQ(GetTask(job_id, 0).state, TaskState::kRunning);
  EXPECT_OK(store_->CompleteTask(a, job_id, 0, 1, 10, 0, now_));
}

// --- cancel and fail ---

TEST_P(MetadataStoreContract, CancelWhileRunning) {
  const std::string job_id = Submit(Spec(), 3);
  const std::string a = Register("a");
  std::vector<Lease> leases = LeaseExactly(a, 1);

  Advance(absl::Seconds(5));
  ASSERT_OK_AND_ASSIGN(Job cancelled, store_->CancelJob(job_id, now_));
  EXPECT_EQ(cancelled.state, JobState::kCancelled);
  EXPECT_EQ(cancelled.finished_at, now_);
  ASSERT_OK_AND_ASSIGN(std::vector<Task> tasks, store_->ListTasks(job_id));
  for (const Task& task : tasks) EXPECT_EQ(task.state, TaskState::kCancelled) << task.index;

  // The holder learns it at its next heartbeat; its completion is refused; nothing is leasable.
  ASSERT_OK_AND_ASSIGN(HeartbeatReply reply,
                       store_->Heartbeat(a, ExecutorState::kBusy, "", {Progress(leases[0], 4)}, kTtl, now_));
  ASSERT_THAT(reply.cancel, SizeIs(1));
  EXPECT_EQ(reply.cancel[0].job_id, job_id);
  EXPECT_THAT(reply.renewed, IsEmpty());
  EXPECT_CODE(store_->CompleteTask(a, job_id, 0, 1, 10, 0, now_), kFailedPrecondition);
  EXPECT_CODE(store_->FailTask(a, job_id, 0, 1, FailureClass::kRetryable, "x", now_), kFailedPrecondition);
  EXPECT_THAT(LeaseUpTo(a, 5), IsEmpty());
  Job job = GetJob(job_id);
  EXPECT_EQ(job.state, JobState::kCancelled);
  // Nothing was committed before the cancel: nothing counts (every record never ran; each gets a
  // "batch_cancelled" error line when its results are read).
  EXPECT_EQ(job.counts.completed, 0);
  EXPECT_EQ(job.counts.failed, 0);

  // An ended job cannot be cancelled (or failed, or finished) again.
  absl::StatusOr<Job> again = store_->CancelJob(job_id, now_);
  EXPECT_CODE(again, kFailedPrecondition);
  EXPECT_THAT(Message(again.status()), HasSubstr("already cancelled"));
  EXPECT_CODE(store_->FailJob(job_id, "x", now_), kFailedPrecondition);
  EXPECT_CODE(store_->FinishJob(job_id, "o", "e", "m", now_), kFailedPrecondition);
}

TEST_P(MetadataStoreContract, ACancelledJobCountsWhatItFinished) {
  // Task 0 succeeded (10 records, 2 of them error lines); task 1 committed a checkpoint of 4
  // records (1 an error line) before the cancel; task 2 never ran.
  const std::string job_id = Submit(Spec(), 3);
  const std::string a = Register("a");
  std::vector<Lease> leases = LeaseExactly(a, 2);
  ASSERT_OK(store_->CompleteTask(a, job_id, leases[0].task.index, 1, 10, 2, now_));
  LeaseProgress beat = Progress(leases[1], 4, 1);
  beat.chunks = {Chunk{1, 0, 0, 4, 1}};
  ASSERT_OK(store_->Heartbeat(a, ExecutorState::kBusy, "", {beat}, kTtl, now_).status());
  ASSERT_OK_AND_ASSIGN(Job cancelled, store_->CancelJob(job_id, now_));
  // What ran counts: completed 8 + 3, failed 2 + 1; the 16 records that never ran do not (total -
  // completed - failed: what the cancel stopped).
  for (const Job& job : {cancelled, GetJob(job_id)}) {
    EXPECT_EQ(job.state, JobState::kCancelled);
    EXPECT_EQ(job.counts.completed, 11);
    EXPECT_EQ(job.counts.failed, 3);
    EXPECT_EQ(job.counts.total, 30);
  }
}

TEST_P(MetadataStoreContract, CancellingAFinishedJobIsRefused) {
  const std::string job_id = Submit(Spec(), 1);
  const std::string a = Register("a");
  ASSERT_THAT(LeaseUpTo(a, 1), SizeIs(1));
  ASSERT_OK(store_->CompleteTask(a, job_id, 0, 1, 10, 0, now_));
  ASSERT_OK(store_->FinishJob(job_id, "o", "e", "m", now_));
  absl::StatusOr<Job> cancel = store_->CancelJob(job_id, now_);
  EXPECT_CODE(cancel, kFailedPrecondition);
  EXPECT_THAT(Message(cancel.status()), HasSubstr("already completed"));
  EXPECT_EQ(GetJob(job_id).state, JobState::kCompleted);
}

TEST_P(MetadataStoreContract, FailJobEndsAJobWithItsReason) {
  // Validation fails before any task exists...
  ASSERT_OK_AND_ASSIGN(Job validating, store_->CreateJob(Spec(), now_));
  ASSERT_OK_AND_ASSIGN(Job failed, store_->FailJob(validating.id, "input is not JSONL", now_));
  EXPECT_EQ(failed.state, JobState::kFailed);
  EXPECT_EQ(GetJob(validating.id).error, "input is not JSONL");
  EXPECT_CODE(store_->AddTasks(validating.id, Shards(1), 10, now_), kFailedPrecondition);

  // ... or a queued job's input becomes unreadable: its tasks are cancelled.
  const std::string job_id = Submit(Spec(), 2);
  ASSERT_OK(store_->FailJob(job_id, "input deleted", now_));
  ASSERT_OK_AND_ASSIGN(std::vector<Task> tasks, store_->ListTasks(job_id));
  for (const Task& task : tasks) EXPECT_EQ(task.state, TaskState::kCancelled);
  const std::string a = Register("a");
  EXPECT_THAT(LeaseUpTo(a, 5), IsEmpty());
  EXPECT_CODE(store_->FailJob(job_id, "again", now_), kFailedPrecondition);
}

// --- finishing ---

TEST_P(MetadataStoreContract, FinishJobSucceedsOnceAndOnlyFromFinalizing) {
  const std::string job_id = Submit(Spec(), 1);
  EXPECT_CODE(store_->FinishJob(job_id, "o", "e", "m", now_), kFailedPrecondition);  // queued
  const std::string a = Register("a");
  ASSERT_THAT(LeaseUpTo(a, 1), SizeIs(1));
  EXPECT_CODE(store_->FinishJob(job_id, "o", "e", "m", now_), kFailedPrecondition);  // running
  ASSERT_OK(store_->CompleteTask(a, job_id, 0, 1, 10, 0, now_));
  ASSERT_OK(store_->FinishJob(job_id, "o1", "e1", "m1", now_));
  // A second server finishing the same job loses, and changes nothing.
  EXPECT_CODE(store_->FinishJob(job_id, "o2", "e2", "m2", now_), kFailedPrecondition);
  EXPECT_EQ(GetJob(job_id).output_key, "o1");
}

TEST_P(MetadataStoreContract, TasksAreAddedOnceAndMustHoldTheJobsRecords) {
  ASSERT_OK_AND_ASSIGN(Job job, store_->CreateJob(Spec(), now_));
  EXPECT_CODE(store_->AddTasks(job.id, Shards(2), 25, now_), kInvalidArgument);
  std::vector<Task> duplicate = Shards(2);
  duplicate[1].index = 0;
  EXPECT_CODE(store_->AddTasks(job.id, duplicate, 20, now_), kInvalidArgument);
  EXPECT_EQ(GetJob(job.id).state, JobState::kValidating);
  ASSERT_OK(store_->AddTasks(job.id, Shards(2), 20, now_));
  EXPECT_CODE(store_->AddTasks(job.id, Shards(2), 20, now_), kFailedPrecondition);
  ASSERT_OK_AND_ASSIGN(std::vector<Task> tasks, store_->ListTasks(job.id));
  EXPECT_THAT(tasks, SizeIs(2));
}

TEST_P(MetadataStoreContract, AJobWithNoRecordsGoesStraightToFinalizing) {
  ASSERT_OK_AND_ASSIGN(Job job, store_->CreateJob(Spec(), now_));
  ASSERT_OK(store_->AddTasks(job.id, {}, 0, now_));
  EXPECT_EQ(GetJob(job.id).state, JobState::kFinalizing);
  ASSERT_OK(store_->FinishJob(job.id, "o", "e", "m", now_));
}

// --- who gets what ---

TEST_P(MetadataStoreContract, RequirementsDecideWhoMayLease) {
  const std::string big_job = Submit(Spec(0, 4, /*min_memory_bytes=*/16 * kGiB), 1);
  const std::string mlx_job = Submit(Spec(0, 4, 0, /*runner=*/"mlx"), 1);

  const std::string small = Register("small", 8 * kGiB, {"llama"});
  EXPECT_THAT(LeaseUpTo(small, 5), IsEmpty());

  // No runners listed: the built-in llama runner, so still not the mlx job.
  const std::string plain = Register("plain", 64 * kGiB, {});
  std::vector<Lease> leases = LeaseUpTo(plain, 5);
  ASSERT_THAT(leases, SizeIs(1));
  EXPECT_EQ(leases[0].task.job_id, big_job);

  const std::string mac = Register("mac", 16 * kGiB, {"llama", "mlx"});
  leases = LeaseUpTo(mac, 5);
  ASSERT_THAT(leases, SizeIs(1));
  EXPECT_EQ(leases[0].task.job_id, mlx_job);
}

// 40.6a: a job that requires confinement goes only to a fully confined executor, and an
// unconfined one asking for one task is leased the next job it may run, not nothing: the lease
// query itself skips what it may not run, as it does another runner's jobs.
TEST_P(MetadataStoreContract, AJobThatRequiresConfinementGoesOnlyToAConfinedExecutor) {
  JobSpec guarded_spec = Spec(/*priority=*/5);
  guarded_spec.requirements.confined = true;
  const std::string guarded = Submit(guarded_spec, 2);  // first in line
  const std::string open = Submit(Spec(), 1);
  const std::string unconfined = Register("partial");
  std::vector<Lease> leases = LeaseUpTo(unconfined, 1);
  ASSERT_THAT(leases, SizeIs(1));
  EXPECT_EQ(leases[0].task.job_id, open);
  EXPECT_THAT(LeaseUpTo(unconfined, 4), IsEmpty());
  ExecutorInfo info = GetExecutor(unconfined).info;
  info.name = "full";
  info.confinement = kConfinementFull;
  const std::string confined = Must(store_->RegisterExecutor("", info, now_), "RegisterExecutor").id;
  leases = LeaseUpTo(confined, 4);
  ASSERT_THAT(leases, SizeIs(2));
  for (const Lease& lease : leases) EXPECT_EQ(lease.task.job_id, guarded);
}

TEST_P(MetadataStoreContract, HigherPriorityFirstThenOlderJobsThenTaskOrder) {
  const std::string old_low = Submit(Spec(/*priority=*/0), 2);
  const std::string high = Submit(Spec(/*priority=*/5), 2);
  const std::string new_low = Submit(Spec(/*priority=*/0), 1);
  const std::string a = Register("a");
  std::vector<std::pair<std::string, int64_t>> order;
  for (int i = 0; i < 6; ++i) {
    std::vector<Lease> leases = LeaseUpTo(a, 1);
    if (leases.empty()) break;
    order.emplace_back(leases[0].task.job_id, leases[0].task.index);
  }
  EXPECT_THAT(order, ElementsAre(std::pair(high, 0), std::pair(high, 1), std::pair(old_low, 0),
                                 std::pair(old_low, 1), std::pair(new_low, 0)));
}

TEST_P(MetadataStoreContract, LeaseTasksGrantsAtMostMaxTasks) {
  Submit(Spec(), 5);
  const std::string a = Register("a");
  EXPECT_THAT(LeaseUpTo(a, 0), IsEmpty());
  EXPECT_THAT(Indexes(LeaseUpTo(a, 3)), ElementsAre(0, 1, 2));
  EXPECT_THAT(Indexes(LeaseUpTo(a, 3)), ElementsAre(3, 4));
  EXPECT_THAT(LeaseUpTo(a, 3), IsEmpty());
}

TEST_P(MetadataStoreContract, DrainingAndLostExecutorsGetNoLeases) {
  const std::string job_id = Submit(Spec(), 4);
  const auto [draining, lost] = RegisterAll({"draining", "lost"});

  ASSERT_OK(store_->RequestDrain(draining, now_));
  EXPECT_TRUE(GetExecutor(draining).drain_requested);
  EXPECT_THAT(LeaseUpTo(draining, 1), IsEmpty());
  ASSERT_OK_AND_ASSIGN(HeartbeatReply reply,
                       store_->Heartbeat(draining, ExecutorState::kAvailable, "", {}, kTtl, now_));
  EXPECT_TRUE(reply.drain);
  EXPECT_EQ(GetExecutor(draining).state, ExecutorState::kDraining);
  EXPECT_THAT(LeaseUpTo(draining, 1), IsEmpty());

  // "lost" stops heartbeating; the watchdog declares it lost; it gets nothing...
  Advance(absl::Minutes(2));
  ASSERT_OK(store_->Heartbeat(draining, ExecutorState::kDraining, "", {}, kTtl, now_));
  ASSERT_OK_AND_ASSIGN(std::vector<Executor> marked, store_->MarkLostExecutors(now_ - absl::Minutes(1), now_));
  ASSERT_THAT(marked, SizeIs(1));
  EXPECT_EQ(marked[0].id, lost);
  EXPECT_THAT(LeaseUpTo(lost, 1), IsEmpty());

  // ... until it heartbeats again: available once more.
  ASSERT_OK(store_->Heartbeat(lost, ExecutorState::kAvailable, "", {}, kTtl, now_));
  EXPECT_EQ(GetExecutor(lost).state, ExecutorState::kAvailable);
  EXPECT_THAT(LeaseUpTo(lost, 1), SizeIs(1));

  // A drained executor that restarts (registers again) is back in service.
  ExecutorInfo info;
  info.memory_bytes = 8 * kGiB;
  ASSERT_OK_AND_ASSIGN(Executor again, store_->RegisterExecutor(draining, info, now_));
  EXPECT_EQ(again.id, draining);
  EXPECT_FALSE(again.drain_requested);
  EXPECT_THAT(LeaseUpTo(draining, 1), SizeIs(1));
  EXPECT_EQ(GetJob(job_id).state, JobState::kRunning);
}

TEST_P(MetadataStoreContract, MarkLostExecutorsOnlyTouchesTheSilentOnes) {
  const std::string a = Register("a");
  Advance(absl::Seconds(60));
  const std::string b = Register("b");
  Advance(absl::Seconds(10));
  ASSERT_OK_AND_ASSIGN(std::vector<Executor> lost, store_->MarkLostExecutors(now_ - absl::Seconds(30), now_));
  ASSERT_THAT(lost, SizeIs(1));
  EXPECT_EQ(lost[0].id, a);
  EXPECT_EQ(lost[0].state, ExecutorState::kLost);
  EXPECT_EQ(GetExecutor(a).state, ExecutorState::kLost);
  EXPECT_EQ(GetExecutor(b).state, ExecutorState::kAvailable);
  // Already lost: not reported twice.
  ASSERT_OK_AND_ASSIGN(lost, store_->MarkLostExecutors(now_ - absl::Seconds(30), now_));
  EXPECT_THAT(lost, IsEmpty());
}

TEST_P(MetadataStoreContract, ALostExecutorsLeasesExpireAndGoToOthers) {
  const std::string job_id = Submit(Spec(), 1);
  const auto [a, b] = RegisterAll({"a", "b"});
  ASSERT_THAT(LeaseUpTo(a, 1), SizeIs(1));
  Advance(kTtl);
  ASSERT_OK(store_->Heartbeat(b, ExecutorState::kAvailable, "", {}, kTtl, now_));
  ASSERT_OK_AND_ASSIGN(std::vector<Executor> lost, store_->MarkLostExecutors(now_ - absl::Seconds(10), now_));
  ASSERT_THAT(lost, SizeIs(1));
  ASSERT_OK(store_->ExpireLeases(now_, 10));
  Advance(kRetry.backoff_base);
  std::vector<Lease> leases = LeaseExactly(b, 1);
  EXPECT_EQ(leases[0].task.attempt, 2);
  ASSERT_OK(store_->CompleteTask(b, job_id, 0, 2, 10, 0, now_));
}

// --- concurrency ---

TEST_P(MetadataStoreContract, NoTaskIsLeasedTwiceUnderConcurrentLeasing) {
  constexpr int kTasks = 200;
  constexpr int kThreads = 4;
  const std::string job_id = Submit(Spec(), kTasks);
  std::vector<std::string> executors;
  for (int i = 0; i < kThreads; ++i) executors.push_back(Register("exe" + std::to_string(i)));

  const ConcurrentLeases leases = LeaseConcurrently(std::vector<MetadataStore*>(kThreads, store_.get()), executors,
                                                    [](int) { return 2; }, kTtl, now_);
  EXPECT_EQ(leases.errors, 0);
  const std::vector<std::vector<Lease>>& granted = leases.granted;

  std::map<int64_t, std::string> holder;
  for (int t = 0; t < kThreads; ++t) {
    for (const Lease& lease : granted[t]) {
      EXPECT_EQ(lease.task.executor_id, executors[t]);
      EXPECT_EQ(lease.task.attempt, 1);
      EXPECT_TRUE(holder.emplace(lease.task.index, executors[t]).second) << "task " << lease.task.index
                                                                       << " granted twice";
    }
  }
  EXPECT_EQ(holder.size(), static_cast<size_t>(kTasks));
  ASSERT_OK_AND_ASSIGN(std::vector<Task> tasks, store_->ListTasks(job_id));
  for (const Task& task : tasks) {
    EXPECT_EQ(task.state, TaskState::kRunning);
    EXPECT_EQ(task.attempt, 1);
    EXPECT_EQ(task.executor_id, holder[task.index]);
  }
}
// --- deadlines and stragglers ---

TEST_P(MetadataStoreContract, APassedDeadlineExpiresTheJobThroughFinalizing) {
  JobSpec spec = Spec();
  spec.completion_window = absl::Hours(1);
  const std::string job_id = Submit(spec, 3);
  const std::string a = Register("mac-a");
  std::vector<Lease> leases = LeaseExactly(a, 2);
  ASSERT_OK_AND_ASSIGN(auto outcomes, store_->CompleteTasks(a, {Progress(leases[0], 10, 0)}, now_));
  ASSERT_OK(outcomes[0]);
  LeaseProgress beat = Progress(leases[1], 5, 0);
  beat.chunks = {Chunk{1, 0, 0, 5, 0}};
  ASSERT_OK(store_->Heartbeat(a, ExecutorState::kBusy, "", {beat}, kTtl, now_).status());

  EXPECT_EQ(store_->ExpireJob(job_id, now_).status().code(), absl::StatusCode::kFailedPrecondition);
  Advance(absl::Hours(1));
  ASSERT_OK_AND_ASSIGN(Job job, store_->ExpireJob(job_id, now_));
  EXPECT_EQ(job.state, JobState::kFinalizing);
  EXPECT_THAT(job.error, HasSubstr("completion window"));
  EXPECT_EQ(job.counts.completed, 15);
  EXPECT_EQ(job.counts.failed, 15);
  EXPECT_EQ(GetTask(job_id, 1).state, TaskState::kCancelled);
  EXPECT_THAT(GetTask(job_id, 1).chunks, SizeIs(1));
  EXPECT_EQ(GetTask(job_id, 2).state, TaskState::kCancelled);
  // The attempt it stopped ran the hour (the completed one ended at once): charged, and the job
  // answered says so as the stored one does.
  EXPECT_EQ(job.device_time, absl::Hours(1));
  EXPECT_EQ(GetJob(job_id).device_time, absl::Hours(1));
  // The holder of the cut-off lease is told to stop; a second expiry is refused.
  ASSERT_OK_AND_ASSIGN(HeartbeatReply reply, store_->Heartbeat(a, ExecutorState::kBusy, "", {beat}, kTtl, now_));
  EXPECT_THAT(reply.cancel, SizeIs(1));
  EXPECT_EQ(store_->ExpireJob(job_id, now_).status().code(), absl::StatusCode::kFailedPrecondition);
  // The finaliser ends it expired, not completed.
  ASSERT_OK_AND_ASSIGN(Job ended, store_->FinishJob(job_id, "o", "e", "m", now_, JobState::kExpired));
  EXPECT_EQ(ended.state, JobState::kExpired);
  EXPECT_EQ(store_->FinishJob(job_id, "o", "e", "m", now_).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(MetadataStoreContract, AStragglersBackupRunsElsewhereAndTheFirstCompletionWins) {
  const std::string job_id = Submit(Spec(), 1);
  const std::string slow = Register("slow"), fast = Register("fast");
  std::vector<Lease> first = LeaseExactly(slow, 1);
  EXPECT_EQ(store_->RequestBackup(job_id, 0, 7, now_).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_OK_AND_ASSIGN(Task backed, store_->RequestBackup(job_id, 0, 1, now_));
  EXPECT_EQ(backed.state, TaskState::kPending);
  EXPECT_EQ(GetTask(job_id, 0).shadow, (Task::Shadow{1, slow, now_}));
  EXPECT_EQ(store_->RequestBackup(job_id, 0, 1, now_).status().code(), absl::StatusCode::kFailedPrecondition);
  // The straggler's own executor is not given its backup; another one is.
  EXPECT_THAT(LeaseUpTo(slow, 1), IsEmpty());
  std::vector<Lease> backup = LeaseExactly(fast, 1);
  EXPECT_EQ(backup[0].task.attempt, 2);
  // Both heartbeat; both are renewed.
  ASSERT_OK_AND_ASSIGN(HeartbeatReply slow_beat,
                       store_->Heartbeat(slow, ExecutorState::kBusy, "", {Progress(first[0], 3)}, kTtl, now_));
  EXPECT_THAT(slow_beat.cancel, IsEmpty());
  ASSERT_OK_AND_ASSIGN(HeartbeatReply fast_beat,
                       store_->Heartbeat(fast, ExecutorState::kBusy, "", {Progress(backup[0], 3)}, kTtl, now_));
  EXPECT_THAT(fast_beat.cancel, IsEmpty());
  // The shadow finishes first and wins; the backup is told to stop and its completion refused.
  ASSERT_OK_AND_ASSIGN(auto won, store_->CompleteTasks(slow, {Progress(first[0], 10)}, now_));
  ASSERT_OK(won[0]);
  Task task = GetTask(job_id, 0);
  EXPECT_EQ(task.state, TaskState::kSucceeded);
  EXPECT_EQ(task.attempt, 1);
  EXPECT_EQ(task.shadow, std::nullopt);
  ASSERT_OK_AND_ASSIGN(fast_beat, store_->Heartbeat(fast, ExecutorState::kBusy, "", {Progress(backup[0], 5)}, kTtl, now_));
  EXPECT_THAT(fast_beat.cancel, SizeIs(1));
  ASSERT_OK_AND_ASSIGN(auto lost, store_->CompleteTasks(fast, {Progress(backup[0], 10)}, now_));
  EXPECT_EQ(lost[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GetJob(job_id).counts.completed, 10);
  EXPECT_EQ(GetJob(job_id).state, JobState::kFinalizing);
}

// Accounting of a race: the straggler's time up to the backup request is charged then (it was
// lost before: the backup's grant took the task's started_at); the backup is charged as any
// attempt; the straggler's time after the request only if it wins (a loser may have been a dead
// machine). Each once: the loser's later reports charge nothing more. Job and team agree.
TEST_P(MetadataStoreContract, ARaceChargesTheStragglerUpToTheBackupAndTheWinnerToTheEnd) {
  for (const bool straggler_wins : {true, false}) {
    SCOPED_TRACE(straggler_wins ? "the straggler wins" : "the backup wins");
    JobSpec spec = Spec();
    spec.team = straggler_wins ? "straggler-wins" : "backup-wins";
    const std::string job_id = Submit(spec, 1);
    const std::string slow = Register(straggler_wins ? "slow-1" : "slow-2");
    const std::string fast = Register(straggler_wins ? "fast-1" : "fast-2");
    auto team_device_time = [&] {
      for (const TeamUsage& u : Must(store_->ListTeamUsage(now_), "ListTeamUsage")) {
        if (u.team == spec.team) return u.device_time;
      }
      return absl::ZeroDuration();
    };
    std::vector<Lease> first = LeaseExactly(slow, 1);
    Advance(absl::Seconds(20));
    ASSERT_OK(store_->RequestBackup(job_id, 0, first[0].task.attempt, now_));
    EXPECT_EQ(GetJob(job_id).device_time, absl::Seconds(20)) << "the straggler's time so far";
    Advance(absl::Seconds(2));  // the backup waits 2 s for an executor
    std::vector<Lease> backup = LeaseExactly(fast, 1);
    Advance(absl::Seconds(5));  // (all within the first lease's TTL)
    const Lease& winner = straggler_wins ? first[0] : backup[0];
    const Lease& loser = straggler_wins ? backup[0] : first[0];
    ASSERT_OK_AND_ASSIGN(auto won, store_->CompleteTasks(winner.task.executor_id, {Progress(winner, 10)}, now_));
    ASSERT_OK(won[0]);
    // 20 s, the backup's 5 s, and when the straggler wins its 7 s since the request.
    const absl::Duration expected = absl::Seconds(straggler_wins ? 32 : 25);
    EXPECT_EQ(GetJob(job_id).device_time, expected);
    EXPECT_EQ(team_device_time(), expected);
    Advance(absl::Seconds(1));
    ASSERT_OK_AND_ASSIGN(auto lost, store_->CompleteTasks(loser.task.executor_id, {Progress(loser, 10)}, now_));
    EXPECT_CODE(lost[0], kFailedPrecondition);
    EXPECT_EQ(GetJob(job_id).device_time, expected) << "a refused report charges nothing";
    EXPECT_EQ(team_device_time(), expected);
  }
}

}  // namespace
}  // namespace minions
