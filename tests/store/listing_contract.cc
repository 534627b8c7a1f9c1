// The MetadataStore contract's scenarios of what the server reads and records beside leasing (see
// metadata_store_contract.h): the object store it runs with, task sizes and throughput, a job's
// and an executor's view, executors and listings. Each test tells one story; time only moves when
// the story says so.

#include "metadata_store_contract.h"

#include <algorithm>
#include <map>
#include <set>
#include <thread>

namespace minions {
namespace {

// --- the servers agree on the object store ---

TEST_P(MetadataStoreContract, TheFirstServersObjectStoreIsRecordedAndAServerWithAnotherIsRefused) {
  ASSERT_OK_AND_ASSIGN(std::string recorded, store_->RecordedObjectStore());
  EXPECT_EQ(recorded, "");
  ASSERT_OK(store_->ClaimObjectStore("file:/srv/minions/objects", now_));
  ASSERT_OK_AND_ASSIGN(recorded, store_->RecordedObjectStore());
  EXPECT_EQ(recorded, "file:/srv/minions/objects");
  // The same object store again (a server restarting, a second server): agreed.
  Advance(absl::Seconds(5));
  EXPECT_OK(store_->ClaimObjectStore("file:/srv/minions/objects", now_));
  // Another: refused, naming both, and the record stays.
  absl::Status other = store_->ClaimObjectStore("file:/home/me/objects", now_);
  EXPECT_CODE(other, kFailedPrecondition);
  EXPECT_THAT(Message(other), HasSubstr("file:/srv/minions/objects"));
  EXPECT_THAT(Message(other), HasSubstr("file:/home/me/objects"));
  ASSERT_OK_AND_ASSIGN(recorded, store_->RecordedObjectStore());
  EXPECT_EQ(recorded, "file:/srv/minions/objects");
}

// --- task sizes ---

TEST_P(MetadataStoreContract, ThroughputIsKeptPerModelAndRunnerWithOldSamplesWeighedLess) {
  const ThroughputKey llama{"sha256:aa", "llama"};
  const ThroughputKey other_runner{"sha256:aa", "echo"};
  ASSERT_OK_AND_ASSIGN(std::optional<Throughput> none, store_->GetThroughput(llama));
  EXPECT_FALSE(none.has_value());
  ASSERT_OK(store_->RecordThroughput(llama, ThroughputSample{100, absl::Seconds(50)}, now_));
  Advance(absl::Seconds(5));
  ASSERT_OK(store_->RecordThroughput(llama, ThroughputSample{300, absl::Seconds(30)}, now_));
  ASSERT_OK(store_->RecordThroughput(other_runner, ThroughputSample{7, absl::Seconds(1)}, now_));
  ASSERT_OK_AND_ASSIGN(std::optional<Throughput> got, store_->GetThroughput(llama));
  ASSERT_TRUE(got.has_value());
  // The first sample's sums weighed by kThroughputMemory, the second's added whole.
  EXPECT_DOUBLE_EQ(got->records, 100 * kThroughputMemory + 300);
  EXPECT_DOUBLE_EQ(got->seconds, 50 * kThroughputMemory + 30);
  EXPECT_EQ(got->samples, 2);
  EXPECT_EQ(got->updated_at, now_);
  ASSERT_OK_AND_ASSIGN(got, store_->GetThroughput(other_runner));
  ASSERT_TRUE(got.has_value());
  EXPECT_DOUBLE_EQ(got->RecordsPerSecond(), 7.0);
  ASSERT_OK_AND_ASSIGN(none, store_->GetThroughput(ThroughputKey{"sha256:bb", "llama"}));
  EXPECT_FALSE(none.has_value());
}

TEST_P(MetadataStoreContract, ACompletedTaskKeepsTheTimesItsThroughputIsMeasuredFrom) {
  const std::string job_id = Submit(Spec(), 1);
  const std::string a = Register("a");
  std::vector<Lease> leases = LeaseExactly(a, 1);
  Advance(absl::Seconds(4));
  ASSERT_OK(store_->CompleteTask(a, job_id, 0, leases[0].task.attempt, kRecordsPerTask, 0, now_));
  ASSERT_OK_AND_ASSIGN(Task task, store_->GetTask(job_id, 0));
  std::optional<ThroughputSample> sample = SampleOfCompletion(task, leases[0].task.attempt);
  ASSERT_TRUE(sample.has_value());
  EXPECT_EQ(sample->records, kRecordsPerTask);
  EXPECT_EQ(sample->took, absl::Seconds(4));
}

// --- what the server asks for a job's and an executor's view ---

TEST_P(MetadataStoreContract, AnyTaskPendingSaysWhetherAnExecutorCouldBeGrantedAnything) {
  ASSERT_OK_AND_ASSIGN(bool pending, store_->AnyTaskPending());
  EXPECT_FALSE(pending) << "no job yet";
  const std::string job_id = Submit(Spec(), 2);
  ASSERT_OK_AND_ASSIGN(pending, store_->AnyTaskPending());
  EXPECT_TRUE(pending);
  const std::string a = Register("a");
  std::vector<Lease> leased = LeaseExactly(a, 2);
  ASSERT_OK_AND_ASSIGN(pending, store_->AnyTaskPending());
  EXPECT_FALSE(pending) << "every task is running";
  // A retried task backs off: pending, though no lease may take it yet.
  ASSERT_OK(store_->FailTask(a, job_id, leased[0].task.index, leased[0].task.attempt, FailureClass::kRetryable,
                             "runner crashed", now_));
  ASSERT_OK_AND_ASSIGN(pending, store_->AnyTaskPending());
  EXPECT_TRUE(pending);
  ASSERT_OK(store_->CancelJob(job_id, now_));
  ASSERT_OK_AND_ASSIGN(pending, store_->AnyTaskPending());
  EXPECT_FALSE(pending) << "a cancelled job's tasks are not pending";
}

TEST_P(MetadataStoreContract, CountTasksAndListRunningTasksAnswerWithoutListingAJob) {
  const std::string job_id = Submit(Spec(), 5);
  const auto [a, b] = RegisterAll({"a", "b"});
  std::vector<Lease> of_a = LeaseExactly(a, 2);
  std::vector<Lease> of_b = LeaseExactly(b, 1);
  ASSERT_OK(store_->CompleteTask(a, job_id, of_a[0].task.index, of_a[0].task.attempt, kRecordsPerTask, 0, now_));
  ASSERT_OK(store_->FailTask(b, job_id, of_b[0].task.index, of_b[0].task.attempt, FailureClass::kPermanent, "x", now_));

  ASSERT_OK_AND_ASSIGN(TaskStateCounts counts, store_->CountTasks(job_id));
  EXPECT_EQ(counts.pending, 2);
  EXPECT_EQ(counts.running, 1);
  EXPECT_EQ(counts.done, 2);
  EXPECT_EQ(counts.succeeded, 1);
  EXPECT_EQ(counts.executors, 1);
  EXPECT_CODE(store_->CountTasks("job-000000000000"), kNotFound);

  EXPECT_EQ(counts.records_in_flight, 0);
  // Progress of a running attempt, as its executor's heartbeat reports it.
  ASSERT_OK(store_->Heartbeat(a, ExecutorState::kBusy, "", {{job_id, of_a[1].task.index, of_a[1].task.attempt, 7, 1}},
                              kTtl, now_));
  ASSERT_OK_AND_ASSIGN(counts, store_->CountTasks(job_id));
  EXPECT_EQ(counts.records_in_flight, 7);

  std::vector<Lease> more = LeaseExactly(b, 1);
  ASSERT_OK_AND_ASSIGN(std::vector<Task> running, store_->ListRunningTasks());
  ASSERT_THAT(running, SizeIs(2));
  EXPECT_LE(running[0].executor_id, running[1].executor_id);  // by executor
  std::map<std::string, int64_t> by_executor;
  for (const Task& task : running) {
    EXPECT_EQ(task.state, TaskState::kRunning);
    by_executor[task.executor_id] = task.index;
  }
  EXPECT_EQ(by_executor[a], of_a[1].task.index);
  EXPECT_EQ(by_executor[b], more[0].task.index);
  ASSERT_OK_AND_ASSIGN(counts, store_->CountTasks(job_id));
  EXPECT_EQ(counts.running, 2);
  EXPECT_EQ(counts.executors, 2);
  EXPECT_EQ(counts.pending, 1);
  EXPECT_EQ(counts.records_in_flight, 7);
}

// --- executors and listings ---

TEST_P(MetadataStoreContract, RegisteringAgainKeepsTheIdAndUpdatesTheInfo) {
  const std::string a = Register("a", 8 * kGiB);
  const absl::Time first = now_;
  Advance(absl::Minutes(5));
  ExecutorInfo info;
  info.name = "a-upgraded";
  info.memory_bytes = 32 * kGiB;
  info.runners = {"llama", "mlx"};
  ASSERT_OK_AND_ASSIGN(Executor again, store_->RegisterExecutor(a, info, now_));
  EXPECT_EQ(again.id, a);
  Executor stored = GetExecutor(a);
  EXPECT_EQ(stored.info.name, "a-upgraded");
  EXPECT_EQ(stored.info.memory_bytes, 32 * kGiB);
  EXPECT_THAT(stored.info.runners, ElementsAre("llama", "mlx"));
  EXPECT_EQ(stored.registered_at, first);
  EXPECT_EQ(stored.last_heartbeat_at, now_);

  // An id the store has never seen (its database was reset) is registered as given.
  ASSERT_OK_AND_ASSIGN(Executor known_elsewhere, store_->RegisterExecutor("exe-0123456789ab", info, now_));
  EXPECT_EQ(known_elsewhere.id, "exe-0123456789ab");
  ASSERT_OK_AND_ASSIGN(std::vector<Executor> all, store_->ListExecutors());
  EXPECT_THAT(all, SizeIs(2));
}

TEST_P(MetadataStoreContract, HeartbeatRecordsTheReportedState) {
  const std::string a = Register("a");
  Advance(absl::Seconds(10));
  ASSERT_OK(store_->Heartbeat(a, ExecutorState::kOwnerActive, "keyboard activity", {}, kTtl, now_));
  Executor executor = GetExecutor(a);
  EXPECT_EQ(executor.state, ExecutorState::kOwnerActive);
  EXPECT_EQ(executor.state_reason, "keyboard activity");
  EXPECT_EQ(executor.last_heartbeat_at, now_);
}

TEST_P(MetadataStoreContract, ListJobsNewestFirstByStateAndTeam) {
  JobSpec other = Spec();
  other.team = "ads";
  const std::string j1 = Submit(Spec(), 1);
  const std::string j2 = Submit(other, 1);
  ASSERT_OK_AND_ASSIGN(Job j3, store_->CreateJob(Spec(), now_));

  ASSERT_OK_AND_ASSIGN(std::vector<Job> jobs, store_->ListJobs(JobFilter{}));
  ASSERT_THAT(jobs, SizeIs(3));
  EXPECT_EQ(jobs[0].id, j3.id);
  EXPECT_EQ(jobs[1].id, j2);
  EXPECT_EQ(jobs[2].id, j1);

  ASSERT_OK_AND_ASSIGN(jobs, store_->ListJobs(JobFilter{JobState::kQueued, "", 100}));
  ASSERT_THAT(jobs, SizeIs(2));
  ASSERT_OK_AND_ASSIGN(jobs, store_->ListJobs(JobFilter{std::nullopt, "ads", 100}));
  ASSERT_THAT(jobs, SizeIs(1));
  EXPECT_EQ(jobs[0].id, j2);
  EXPECT_EQ(jobs[0].spec.team, "ads");
  ASSERT_OK_AND_ASSIGN(jobs, store_->ListJobs(JobFilter{JobState::kQueued, "search", 100}));
  ASSERT_THAT(jobs, SizeIs(1));
  EXPECT_EQ(jobs[0].id, j1);
  ASSERT_OK_AND_ASSIGN(jobs, store_->ListJobs(JobFilter{std::nullopt, "", 2}));
  EXPECT_THAT(jobs, SizeIs(2));
}

TEST_P(MetadataStoreContract, ASpecSurvivesTheStoreUnchanged) {
  JobSpec spec = Spec(/*priority=*/3, /*max_attempts=*/7, /*min_memory_bytes=*/5 * kGiB, "mlx");
  spec.runner_options = Json{{"n_ctx_per_seq", 4096}, {"stop", {"a", "b"}}, {"name", "ünïcode"}};
  spec.completion_window = absl::Hours(24);
  ASSERT_OK_AND_ASSIGN(Job created, store_->CreateJob(spec, now_));
  Job job = GetJob(created.id);
  EXPECT_EQ(job.spec.team, "search");
  EXPECT_EQ(job.spec.priority, 3);
  EXPECT_EQ(job.spec.max_attempts, 7);
  EXPECT_EQ(job.spec.requirements.min_memory_bytes, 5 * kGiB);
  EXPECT_EQ(job.spec.requirements.runner, "mlx");
  EXPECT_EQ(job.spec.runner_options, spec.runner_options);
  EXPECT_EQ(job.spec.completion_window, absl::Hours(24));
  EXPECT_EQ(job.created_at, now_);
}
TEST_P(MetadataStoreContract, TasksAreReadManyAtOnce) {
  const std::string job_id = Submit(Spec(), 3);
  ASSERT_OK_AND_ASSIGN(std::vector<Task> tasks,
                       store_->GetTasks({{job_id, 2}, {job_id, 0}, {job_id, 2}, {job_id, 9}, {"job-nobody", 0}}));
  ASSERT_THAT(tasks, SizeIs(2));
  EXPECT_EQ(tasks[0].index, 0);
  EXPECT_EQ(tasks[1].index, 2);
  EXPECT_EQ(tasks[1].job_id, job_id);
  EXPECT_EQ(tasks[1].n_records, GetTask(job_id, 2).n_records);
  ASSERT_OK_AND_ASSIGN(tasks, store_->GetTasks({}));
  EXPECT_THAT(tasks, IsEmpty());
}

}  // namespace
}  // namespace minions
