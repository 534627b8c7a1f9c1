// The MetadataStore contract's scenarios of executors' reports (see metadata_store_contract.h):
// fencing, heartbeats and completions in batches, and the chunks a heartbeat commits. Each test
// tells one story; time only moves when the story says so.

#include "metadata_store_contract.h"

#include <algorithm>
#include <map>
#include <set>
#include <thread>

namespace minions {
namespace {

// --- fencing and unknown ids ---

TEST_P(MetadataStoreContract, AReportForAnotherExecutorsLeaseIsRefused) {
  const std::string job_id = Submit(Spec(), 1);
  const auto [a, b] = RegisterAll({"a", "b"});
  std::vector<Lease> leases = LeaseExactly(a, 1);

  EXPECT_CODE(store_->CompleteTask(b, job_id, 0, 1, 10, 0, now_), kFailedPrecondition);
  EXPECT_CODE(store_->FailTask(b, job_id, 0, 1, FailureClass::kPermanent, "x", now_), kFailedPrecondition);
  ASSERT_OK_AND_ASSIGN(HeartbeatReply reply,
                       store_->Heartbeat(b, ExecutorState::kBusy, "", {Progress(leases[0], 7)}, kTtl, now_));
  EXPECT_THAT(reply.cancel, SizeIs(1));
  EXPECT_THAT(reply.renewed, IsEmpty());
  Task task = GetTask(job_id, 0);
  EXPECT_EQ(task.executor_id, a);
  EXPECT_EQ(task.records_done, 0);  // b's progress was not recorded

  EXPECT_OK(store_->CompleteTask(a, job_id, 0, 1, 10, 0, now_));
}

TEST_P(MetadataStoreContract, UnknownIdsAreNotFound) {
  const std::string job_id = Submit(Spec(), 1);
  const std::string a = Register("a");
  ASSERT_THAT(LeaseUpTo(a, 1), SizeIs(1));

  EXPECT_CODE(store_->GetJob("job-000000000000"), kNotFound);
  EXPECT_CODE(store_->ListTasks("job-000000000000"), kNotFound);
  EXPECT_CODE(store_->AddTasks("job-000000000000", Shards(1), 10, now_), kNotFound);
  EXPECT_CODE(store_->CancelJob("job-000000000000", now_), kNotFound);
  EXPECT_CODE(store_->FailJob("job-000000000000", "x", now_), kNotFound);
  EXPECT_CODE(store_->FinishJob("job-000000000000", "o", "e", "m", now_), kNotFound);
  EXPECT_CODE(store_->GetExecutor("exe-000000000000"), kNotFound);
  EXPECT_CODE(store_->RequestDrain("exe-000000000000", now_), kNotFound);
  EXPECT_CODE(store_->LeaseTasks("exe-000000000000", 1, kTtl, now_), kNotFound);
  EXPECT_CODE(store_->CompleteTask("exe-000000000000", job_id, 0, 1, 10, 0, now_), kNotFound);
  EXPECT_CODE(store_->CompleteTask(a, "job-000000000000", 0, 1, 10, 0, now_), kNotFound);
  EXPECT_CODE(store_->CompleteTask(a, job_id, 7, 1, 10, 0, now_), kNotFound);
  EXPECT_CODE(store_->FailTask(a, job_id, 7, 1, FailureClass::kRetryable, "x", now_), kNotFound);

  // A heartbeat from an executor the store does not know asks it to register again.
  ASSERT_OK_AND_ASSIGN(HeartbeatReply reply,
                       store_->Heartbeat("exe-000000000000", ExecutorState::kAvailable, "", {}, kTtl, now_));
  EXPECT_TRUE(reply.unknown_executor);
  // A heartbeat about a task that does not exist: stop it.
  ASSERT_OK_AND_ASSIGN(reply, store_->Heartbeat(a, ExecutorState::kBusy, "", {{job_id, 7, 1, 0, 0}}, kTtl, now_));
  EXPECT_THAT(reply.cancel, SizeIs(1));
}

// --- heartbeats in batches (group commit) ---

TEST_P(MetadataStoreContract, ABatchOfHeartbeatsIsAnsweredAsEachWouldBeAlone) {
  const std::string job_id = Submit(Spec(), 3);
  const auto [a, b, c] = RegisterAll({"a", "b", "c"});
  std::vector<Lease> of_a = LeaseExactly(a, 1);
  std::vector<Lease> of_b = LeaseExactly(b, 1);
  ASSERT_OK(store_->RequestDrain(c, now_));
  Advance(absl::Seconds(5));

  std::vector<HeartbeatCall> calls = {
      // a renews its own lease with progress.
      {a, ExecutorState::kBusy, "", {Progress(of_a[0], 4, 1)}, std::nullopt},
      // b reports its own lease, and a's (fenced: not b's, told to stop at once, not recorded).
      {b, ExecutorState::kBusy, "", {Progress(of_b[0], 2), Progress(of_a[0], 9)}, std::nullopt},
      // An executor the store does not know: register again; its leases are left alone.
      {"exe-000000000000", ExecutorState::kAvailable, "", {Progress(of_b[0], 8)}, std::nullopt},
      // c was asked to drain: told so.
      {c, ExecutorState::kAvailable, "", {}, std::nullopt},
      // A task that does not exist: stop it.
      {a, ExecutorState::kBusy, "", {{job_id, 7, 1, 0, 0}}, std::nullopt},
  };
  ASSERT_OK_AND_ASSIGN(std::vector<HeartbeatReply> replies, store_->Heartbeats(calls, kTtl, now_));
  ASSERT_THAT(replies, SizeIs(5));
  EXPECT_THAT(replies[0].renewed, SizeIs(1));
  EXPECT_THAT(replies[0].cancel, IsEmpty());
  ASSERT_THAT(replies[1].renewed, SizeIs(1));
  EXPECT_EQ(replies[1].renewed[0].task_index, of_b[0].task.index);
  ASSERT_THAT(replies[1].cancel, SizeIs(1));
  EXPECT_EQ(replies[1].cancel[0].task_index, of_a[0].task.index);
  EXPECT_TRUE(replies[2].unknown_executor);
  EXPECT_THAT(replies[2].renewed, IsEmpty());
  EXPECT_TRUE(replies[3].drain);
  EXPECT_FALSE(replies[0].drain);
  EXPECT_THAT(replies[4].cancel, SizeIs(1));

  // Written as one: both leases renewed from now, a's progress kept (not b's claim on it), every
  // known executor heard from now.
  Task task_a = GetTask(job_id, of_a[0].task.index);
  EXPECT_EQ(task_a.lease_expires_at, now_ + kTtl);
  EXPECT_EQ(task_a.records_done, 4);
  EXPECT_EQ(task_a.records_failed, 1);
  EXPECT_EQ(task_a.executor_id, a);
  Task task_b = GetTask(job_id, of_b[0].task.index);
  EXPECT_EQ(task_b.lease_expires_at, now_ + kTtl);
  EXPECT_EQ(task_b.records_done, 2);
  EXPECT_EQ(GetExecutor(a).last_heartbeat_at, now_);
  EXPECT_EQ(GetExecutor(b).last_heartbeat_at, now_);
  EXPECT_EQ(GetExecutor(c).last_heartbeat_at, now_);

  // A lease that expired and was requeued is not renewed by a late batch: the attempt is fenced.
  Advance(kTtl + absl::Seconds(1));
  ASSERT_OK_AND_ASSIGN(std::vector<Task> expired, store_->ExpireLeases(now_, 10));
  ASSERT_THAT(expired, SizeIs(2));
  ASSERT_OK_AND_ASSIGN(replies, store_->Heartbeats({{a, ExecutorState::kBusy, "", {Progress(of_a[0], 6)}, std::nullopt},
                                                    {b, ExecutorState::kBusy, "", {Progress(of_b[0], 6)}, std::nullopt}},
                                                   kTtl, now_));
  ASSERT_THAT(replies, SizeIs(2));
  EXPECT_THAT(replies[0].cancel, SizeIs(1));
  EXPECT_THAT(replies[0].renewed, IsEmpty());
  EXPECT_THAT(replies[1].cancel, SizeIs(1));
  EXPECT_NE(GetTask(job_id, of_a[0].task.index).state, TaskState::kRunning);

  // An empty batch writes nothing and answers nothing.
  ASSERT_OK_AND_ASSIGN(replies, store_->Heartbeats({}, kTtl, now_));
  EXPECT_THAT(replies, IsEmpty());
}

// A server's renewal of an idle executor (it waited behind heartbeats) is written only if the
// executor was not heard since the renewal was made: a beat of its own written first, in an
// earlier batch or earlier in the same one, said its state, and the renewal does not undo it.
TEST_P(MetadataStoreContract, ARenewalMadeBeforeTheExecutorsOwnBeatWasWrittenLeavesThatBeatsState) {
  const auto [a, b, c] = RegisterAll({"a", "b", "c"});
  Advance(absl::Seconds(10));
  const absl::Time made = now_;  // the renewals are made now, then wait
  auto renewal = [&](const std::string& id) {
    HeartbeatCall call{id, ExecutorState::kAvailable, "", {}, std::nullopt};
    call.unless_heard_since = made;
    return call;
  };
  Advance(absl::Seconds(1));
  // a's own beat (its owner came back) is written before its renewal, in an earlier batch.
  ASSERT_OK(store_->Heartbeats({{a, ExecutorState::kOwnerActive, "", {}, std::nullopt}}, kTtl, now_).status());
  Advance(absl::Seconds(1));
  // b's own beat and its renewal in one batch (the renewal after it); c was not heard: renewed.
  ASSERT_OK_AND_ASSIGN(std::vector<HeartbeatReply> replies,
                       store_->Heartbeats({renewal(a), {b, ExecutorState::kDraining, "", {}, std::nullopt}, renewal(b),
                                           renewal(c)},
                                          kTtl, now_));
  ASSERT_THAT(replies, SizeIs(4));
  EXPECT_EQ(GetExecutor(a).state, ExecutorState::kOwnerActive);
  EXPECT_EQ(GetExecutor(a).last_heartbeat_at, now_ - absl::Seconds(1)) << "a's renewal was written";
  EXPECT_EQ(GetExecutor(b).state, ExecutorState::kDraining);
  EXPECT_EQ(GetExecutor(b).last_heartbeat_at, now_);
  EXPECT_EQ(GetExecutor(c).state, ExecutorState::kAvailable);
  EXPECT_EQ(GetExecutor(c).last_heartbeat_at, now_);
}
// --- completions in batches ---

TEST_P(MetadataStoreContract, ABatchOfCompletionsIsFencedReportByReport) {
  // Executor A holds four tasks and reports them together; one report is for an attempt it no
  // longer holds and one is short of records. Those two are refused; the other two complete.
  ASSERT_OK_AND_ASSIGN(Job created, store_->CreateJob(Spec(), now_));
  const std::string job_id = created.id;
  ASSERT_OK(store_->AddTasks(job_id, Shards(4), 40, now_));
  const std::string a = Register("mac-a");
  std::vector<Lease> leases = LeaseUpTo(a, 4);
  ASSERT_EQ(leases.size(), 4u);
  std::vector<LeaseProgress> reports;
  for (const Lease& lease : leases) reports.push_back(Progress(lease, 10, 0));
  reports[1].attempt = 7;         // not the current attempt
  reports[2].records_done = 9;    // does not account for every record
  reports[3].records_failed = 2;
  ASSERT_OK_AND_ASSIGN(std::vector<absl::Status> outcomes, store_->CompleteTasks(a, reports, now_));
  ASSERT_EQ(outcomes.size(), 4u);
  EXPECT_OK(outcomes[0]);
  EXPECT_EQ(outcomes[1].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(outcomes[2].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_OK(outcomes[3]);
  EXPECT_EQ(GetTask(job_id, 0).state, TaskState::kSucceeded);
  EXPECT_EQ(GetTask(job_id, 1).state, TaskState::kRunning);
  EXPECT_EQ(GetTask(job_id, 2).state, TaskState::kRunning);
  EXPECT_EQ(GetTask(job_id, 3).state, TaskState::kSucceeded);
  Job job = GetJob(job_id);
  EXPECT_EQ(job.tasks_done, 2);
  EXPECT_EQ(job.counts.completed, 18);
  EXPECT_EQ(job.counts.failed, 2);
  EXPECT_EQ(GetExecutor(a).records_done, 20);
  // The refused ones can still be completed properly, and the job then finishes.
  reports = {Progress(leases[1], 10, 0), Progress(leases[2], 10, 0)};
  ASSERT_OK_AND_ASSIGN(outcomes, store_->CompleteTasks(a, reports, now_));
  EXPECT_OK(outcomes[0]);
  EXPECT_OK(outcomes[1]);
  EXPECT_EQ(GetJob(job_id).state, JobState::kFinalizing);
  // An unknown executor is NotFound as a whole.
  EXPECT_EQ(store_->CompleteTasks("exe-nobody", reports, now_).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(MetadataStoreContract, ABatchOfSeveralExecutorsCompletionsIsAnsweredAsEachAlone) {
  // Two executors' completions and a stranger's, in one transaction: each call is fenced as it
  // would be alone, and the answer names the job once its last task ends, without a read of it.
  const std::string job_id = Submit(Spec(), 4);
  const std::string a = Register("mac-a"), b = Register("mac-b");
  std::vector<Lease> of_a = LeaseExactly(a, 2), of_b = LeaseUpTo(b, 2);
  ASSERT_THAT(of_b, SizeIs(2));
  LeaseProgress stale = Progress(of_b[1], 10);
  stale.attempt = 7;
  std::vector<CompletionCall> calls = {
      {a, {Progress(of_a[0], 10), Progress(of_b[0], 10)}},  // b's task is not a's to complete
      {b, {Progress(of_b[0], 10, 1), stale}},
      {"exe-nobody", {Progress(of_a[1], 10)}},
  };
  ASSERT_OK_AND_ASSIGN(CompletionReply reply, store_->CompleteMany(calls, now_));
  ASSERT_THAT(reply.outcomes, SizeIs(3));
  ASSERT_OK(reply.outcomes[0].status());
  ASSERT_THAT(*reply.outcomes[0], SizeIs(2));
  EXPECT_OK((*reply.outcomes[0])[0]);
  EXPECT_EQ((*reply.outcomes[0])[1].code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_OK(reply.outcomes[1].status());
  ASSERT_THAT(*reply.outcomes[1], SizeIs(2));
  EXPECT_OK((*reply.outcomes[1])[0]);
  EXPECT_EQ((*reply.outcomes[1])[1].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(reply.outcomes[2].status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(reply.finalizing, IsEmpty());
  EXPECT_EQ(GetTask(job_id, of_a[0].task.index).state, TaskState::kSucceeded);
  EXPECT_EQ(GetTask(job_id, of_a[1].task.index).state, TaskState::kRunning);
  EXPECT_EQ(GetTask(job_id, of_b[0].task.index).state, TaskState::kSucceeded);
  EXPECT_EQ(GetTask(job_id, of_b[1].task.index).state, TaskState::kRunning);
  EXPECT_EQ(GetExecutor(a).records_done, 10);
  EXPECT_EQ(GetExecutor(b).records_done, 10);
  Job job = GetJob(job_id);
  EXPECT_EQ(job.tasks_done, 2);
  EXPECT_EQ(job.counts.completed, 19);
  EXPECT_EQ(job.counts.failed, 1);

  // The last two tasks end in one batch: the job is named once, as ready to finalize.
  ASSERT_OK_AND_ASSIGN(reply, store_->CompleteMany({{b, {Progress(of_b[1], 10)}}, {a, {Progress(of_a[1], 10)}}}, now_));
  ASSERT_THAT(reply.outcomes, SizeIs(2));
  EXPECT_OK((*reply.outcomes[0])[0]);
  EXPECT_OK((*reply.outcomes[1])[0]);
  EXPECT_THAT(reply.finalizing, ElementsAre(job_id));
  EXPECT_EQ(GetJob(job_id).state, JobState::kFinalizing);
  // A late report changes nothing and names no job.
  ASSERT_OK_AND_ASSIGN(reply, store_->CompleteMany({{a, {Progress(of_a[1], 10)}}}, now_));
  EXPECT_EQ((*reply.outcomes[0])[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(reply.finalizing, IsEmpty());
  ASSERT_OK_AND_ASSIGN(reply, store_->CompleteMany({}, now_));
  EXPECT_THAT(reply.outcomes, IsEmpty());
}

TEST_P(MetadataStoreContract, OnlyTheJobsTheseCompletionsEndAreNamedReadyToFinalize) {
  JobSpec spec = Spec();
  spec.max_attempts = 1;
  const std::string failing = Submit(spec, 1);
  const std::string a = Register("mac-a");
  std::vector<Lease> leases = LeaseExactly(a, 1);
  ASSERT_OK(store_->FailTask(a, failing, 0, leases[0].task.attempt, FailureClass::kPermanent, "bad", now_).status());
  EXPECT_EQ(GetJob(failing).state, JobState::kFailed);
  // The next job's one task completes: only it is named.
  const std::string done = Submit(Spec(), 1);
  leases = LeaseUpTo(a, 1);
  ASSERT_THAT(leases, SizeIs(1));
  ASSERT_OK_AND_ASSIGN(CompletionReply reply, store_->CompleteMany({{a, {Progress(leases[0], 10)}}}, now_));
  EXPECT_THAT(reply.finalizing, ElementsAre(done));
}
// --- checkpoints and deadlines ---

TEST_P(MetadataStoreContract, HeartbeatsCommitChunksAndTheNextAttemptResumesAfterThem) {
  const std::string job_id = Submit(Spec(), 1);
  const std::string a = Register("mac-a"), b = Register("mac-b");
  std::vector<Lease> first = LeaseExactly(a, 1);
  LeaseProgress beat = Progress(first[0], 7, 1);
  beat.chunks = {Chunk{1, 0, 0, 4, 1}, Chunk{1, 1, 4, 6, 0}};
  ASSERT_OK(store_->Heartbeat(a, ExecutorState::kBusy, "", {beat}, kTtl, now_).status());
  Task task = GetTask(job_id, 0);
  // Each committed chunk names its producer (whose answers spot checks re-score).
  EXPECT_THAT(task.chunks, ElementsAre(Chunk{1, 0, 0, 4, 1, a}, Chunk{1, 1, 4, 6, 0, a}));
  EXPECT_EQ(task.records_done, 7);

  // A goes silent; its lease expires; B's attempt resumes after record 6.
  Advance(kTtl + absl::Seconds(1));
  ASSERT_OK(store_->ExpireLeases(now_, 10).status());
  Advance(absl::Minutes(10));  // past the retry backoff
  std::vector<Lease> second = LeaseExactly(b, 1);
  EXPECT_EQ(second[0].task.attempt, 2);
  EXPECT_EQ(CommittedRecords(second[0].task), 6);
  EXPECT_EQ(NextChunkSeq(second[0].task), 0);
  // A's late report is fenced off and commits nothing.
  LeaseProgress stale = Progress(first[0], 10, 1);
  stale.chunks = {Chunk{1, 2, 6, 10, 0}};
  ASSERT_OK_AND_ASSIGN(auto stale_outcomes, store_->CompleteTasks(a, {stale}, now_));
  EXPECT_EQ(stale_outcomes[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(GetTask(job_id, 0).chunks, SizeIs(2));

  LeaseProgress done = Progress(second[0], 10, 2);
  done.chunks = {Chunk{2, 0, 6, 10, 1}};
  ASSERT_OK_AND_ASSIGN(auto outcomes, store_->CompleteTasks(b, {done}, now_));
  ASSERT_OK(outcomes[0]);
  task = GetTask(job_id, 0);
  EXPECT_EQ(task.state, TaskState::kSucceeded);
  EXPECT_THAT(task.chunks, ElementsAre(Chunk{1, 0, 0, 4, 1, a}, Chunk{1, 1, 4, 6, 0, a}, Chunk{2, 0, 6, 10, 1, b}));
  Job job = GetJob(job_id);
  EXPECT_EQ(job.state, JobState::kFinalizing);
  EXPECT_EQ(job.counts.completed, 8);
  EXPECT_EQ(job.counts.failed, 2);
}

TEST_P(MetadataStoreContract, ACompletionWhoseChunksLeaveAGapIsRefused) {
  const std::string job_id = Submit(Spec(), 1);
  const std::string a = Register("mac-a");
  std::vector<Lease> leases = LeaseUpTo(a, 1);
  LeaseProgress report = Progress(leases[0], 10, 0);
  report.chunks = {Chunk{1, 0, 0, 4, 0}, Chunk{1, 1, 5, 10, 0}};
  ASSERT_OK_AND_ASSIGN(auto outcomes, store_->CompleteTasks(a, {report}, now_));
  EXPECT_EQ(outcomes[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(outcomes[0]), HasSubstr("covers records [5, 10)"));
  EXPECT_EQ(GetTask(job_id, 0).state, TaskState::kRunning);
  EXPECT_THAT(GetTask(job_id, 0).chunks, IsEmpty());
}
// GetTask reads one task as ListTasks has it (what the server checks an executor's report of
// chunks against), chunks included; an unknown job or index is NotFound.
TEST_P(MetadataStoreContract, GetTaskReadsOneTaskAsListTasksHasIt) {
  const std::string job_id = Submit(Spec(), 3);
  const std::string executor = Register("a");
  std::vector<Lease> leases = LeaseExactly(executor, 1);
  LeaseProgress progress = Progress(leases[0], 4);
  progress.chunks = {Chunk{leases[0].task.attempt, 0, 0, 4, 1}};
  ASSERT_OK(store_->Heartbeat(executor, ExecutorState::kBusy, "", {progress}, kTtl, now_).status());
  ASSERT_OK_AND_ASSIGN(std::vector<Task> listed, store_->ListTasks(job_id));
  for (const Task& expected : listed) {
    ASSERT_OK_AND_ASSIGN(Task task, store_->GetTask(job_id, expected.index));
    EXPECT_EQ(task.job_id, expected.job_id);
    EXPECT_EQ(task.index, expected.index);
    EXPECT_EQ(task.state, expected.state);
    EXPECT_EQ(task.attempt, expected.attempt);
    EXPECT_EQ(task.executor_id, expected.executor_id);
    EXPECT_EQ(task.byte_begin, expected.byte_begin);
    EXPECT_EQ(task.byte_end, expected.byte_end);
    EXPECT_EQ(task.n_records, expected.n_records);
    EXPECT_EQ(task.chunks, expected.chunks);
  }
  ASSERT_OK_AND_ASSIGN(Task first, store_->GetTask(job_id, leases[0].task.index));
  EXPECT_THAT(first.chunks, ElementsAre(Chunk{leases[0].task.attempt, 0, 0, 4, 1, executor}));
  EXPECT_CODE(store_->GetTask(job_id, 3), kNotFound);
  EXPECT_CODE(store_->GetTask("job-000000000000", 0), kNotFound);
}

}  // namespace
}  // namespace minions
