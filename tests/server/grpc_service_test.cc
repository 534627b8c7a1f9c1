// The gRPC services end to end in one process: a ControlPlane on a loopback port, driven only
// through real stubs, the way the client verbs and executors talk to it (grpc_service_fixture.h).

#include <grpcpp/generic/generic_stub.h>

#include <filesystem>
#include <sqlite3.h>

#include "absl/synchronization/notification.h"
#include "grpc_service_fixture.h"
#include "testing/fake_watchdog_lock.h"
#include "watchdog/watchdog.h"

namespace minions::testing {
namespace {

// ------------------------------------------------------------------ submit: bad input

TEST_F(GrpcServiceTest, InputThatIsNotJsonlIsRefused) {
  StartServer();
  std::string binary;
  for (int i = 0; i < 2048; ++i) binary.push_back(static_cast<char>((i * 131 + 7) & 0xff));
  v1::Job job;
  EXPECT_GRPC_ERROR(Submit(Request(binary), &job), INVALID_ARGUMENT, "no line of the input is a valid request");
  EXPECT_GRPC_ERROR(Submit(Request("custom_id,prompt\nr0,hello\nr1,world\n"), &job), INVALID_ARGUMENT,
                    "no line of the input is a valid request");
  // The message points at the first bad line.
  EXPECT_GRPC_ERROR(Submit(Request("custom_id,prompt\nr0,hello\n"), &job), INVALID_ARGUMENT, "line 1: ");
  ExpectServerUp();

  // Each refusal is on record as a failed job, with the reason.
  v1::ListJobsRequest list;
  list.set_state("failed");
  v1::ListJobsResponse failed;
  ASSERT_GRPC_OK(jobs_->ListJobs(Context().get(), list, &failed));
  ASSERT_EQ(failed.jobs_size(), 3);
  EXPECT_THAT(failed.jobs(0).error(), HasSubstr("no line of the input is a valid request"));
  // And a good job still goes through.
  EXPECT_EQ(MustSubmit(Records(2)).state(), "queued");
}

TEST_F(GrpcServiceTest, EmptyInputHasNoRecords) {
  StartServer();
  v1::Job job;
  EXPECT_GRPC_ERROR(Submit(Request(""), &job), INVALID_ARGUMENT, "no records");
  EXPECT_GRPC_ERROR(Submit(Request("\n\n  \r\n"), &job), INVALID_ARGUMENT, "no records");
  ExpectServerUp();
}

TEST_F(GrpcServiceTest, AJobNeedsAModelThatExists) {
  StartServer();
  v1::Job job;
  v1::SubmitJobRequest no_model = Request(Records(2));
  no_model.clear_model();
  EXPECT_GRPC_ERROR(Submit(no_model, &job), INVALID_ARGUMENT, "needs a model");
  v1::SubmitJobRequest missing = Request(Records(2));
  missing.set_model(dir_.File("nowhere.gguf"));
  EXPECT_GRPC_ERROR(Submit(missing, &job), INVALID_ARGUMENT, "does not exist");
  v1::SubmitJobRequest directory = Request(Records(2));
  directory.set_model(dir_.path());
  EXPECT_GRPC_ERROR(Submit(directory, &job), INVALID_ARGUMENT, "does not exist");
  ExpectServerUp();
  // Nothing was created for these.
  v1::ListJobsResponse all;
  ASSERT_GRPC_OK(jobs_->ListJobs(Context().get(), v1::ListJobsRequest(), &all));
  EXPECT_EQ(all.jobs_size(), 0);
}

TEST_F(GrpcServiceTest, RunnerOptionsMustBeAValidObject) {
  StartServer();
  v1::Job job;
  for (const std::string options : {"[1, 2]", "\"n_parallel\"", "not json", "42"}) {
    SCOPED_TRACE(options);
    v1::SubmitJobRequest request = Request(Records(2));
    request.set_runner_options_json(options);
    EXPECT_GRPC_ERROR(Submit(request, &job), INVALID_ARGUMENT, "must be a JSON object");
  }
  v1::SubmitJobRequest zero = Request(Records(2));
  zero.set_runner_options_json(R"({"n_parallel": 0})");
  EXPECT_GRPC_ERROR(Submit(zero, &job), INVALID_ARGUMENT, "n_parallel");
  v1::SubmitJobRequest wrong_type = Request(Records(2));
  wrong_type.set_runner_options_json(R"({"n_batch": "big"})");
  EXPECT_GRPC_ERROR(Submit(wrong_type, &job), INVALID_ARGUMENT, "n_batch");
  v1::SubmitJobRequest flash = Request(Records(2));
  flash.set_runner_options_json(R"({"flash_attn": "maybe"})");
  EXPECT_GRPC_ERROR(Submit(flash, &job), INVALID_ARGUMENT, "flash_attn");
  ExpectServerUp();

  v1::SubmitJobRequest good = Request(Records(2));
  good.set_runner_options_json(R"({"n_parallel": 4})");
  ASSERT_GRPC_OK(Submit(good, &job));
  // The options reach the executor with the lease.
  std::string executor = RegisterExecutor("e");
  v1::TaskLease lease = MustLeaseOne(executor);
  auto options = ParseJson(lease.runner_options_json());
  ASSERT_OK(options);
  EXPECT_EQ((*options)["n_parallel"], 4);
}

// ------------------------------------------------------------------ jobs: unknown and wrong state

TEST_F(GrpcServiceTest, UnknownJobIsNotFoundEverywhere) {
  StartServer();
  const std::string unknown = "job-0123456789ab";
  v1::Job job;
  EXPECT_GRPC_ERROR(GetJob(unknown, &job), NOT_FOUND, unknown);
  EXPECT_GRPC_ERROR(Cancel(unknown, &job), NOT_FOUND, unknown);
  EXPECT_GRPC_ERROR(Watch(unknown).first, NOT_FOUND, unknown);
  EXPECT_GRPC_ERROR(Results(unknown).first, NOT_FOUND, unknown);
  EXPECT_GRPC_ERROR(Results(unknown, /*errors=*/true).first, NOT_FOUND, unknown);
  v1::ListTasksRequest tasks;
  tasks.set_job_id(unknown);
  v1::ListTasksResponse reply;
  EXPECT_GRPC_ERROR(jobs_->ListTasks(Context().get(), tasks, &reply), NOT_FOUND, unknown);
  ExpectServerUp();
}

TEST_F(GrpcServiceTest, ResultsOfARunningJobAreNotThereYet) {
  StartServer();
  v1::Job job = MustSubmit(Records(4), 2);
  EXPECT_GRPC_ERROR(Results(job.id()).first, FAILED_PRECONDITION, "is queued");
  std::string executor = RegisterExecutor("e");
  ASSERT_EQ(MustLease(executor, 1).size(), 1u);
  EXPECT_EQ(MustGetJob(job.id()).state(), "running");
  auto [status, data] = Results(job.id());
  EXPECT_GRPC_ERROR(status, FAILED_PRECONDITION, "results exist once it has completed");
  EXPECT_THAT(data, IsEmpty());
  EXPECT_GRPC_ERROR(Results(job.id(), true).first, FAILED_PRECONDITION, "is running");
}

TEST_F(GrpcServiceTest, CancelOfAFinishedJobIsRefused) {
  StartServer();
  v1::Job done = CompletedJob(3, 2);
  v1::Job job;
  EXPECT_GRPC_ERROR(Cancel(done.id(), &job), FAILED_PRECONDITION, "completed");
  EXPECT_EQ(MustGetJob(done.id()).state(), "completed");
  // Its results are intact.
  EXPECT_THAT(CustomIds(Results(done.id()).second), ElementsAre("r0", "r1", "r2"));

  // An unfinished job cancels once; the second cancel is refused too.
  v1::Job unfinished = MustSubmit(Records(2), 1);
  ASSERT_GRPC_OK(Cancel(unfinished.id(), &job));
  EXPECT_EQ(job.state(), "cancelled");
  EXPECT_GRPC_ERROR(Cancel(unfinished.id(), &job), FAILED_PRECONDITION, "cancelled");
  ExpectServerUp();
}

// Cancel keeps finished work: the results of a cancelled job hold what its tasks finished and an
// error line "batch_cancelled" for every record that never ran; its counts count what ran.
TEST_F(GrpcServiceTest, ACancelledJobsResultsKeepWhatFinished) {
  StartServer();
  auto [submitted, executor, lease] = SubmitAndLeaseOne(4, 2, "e");
  auto [done, failed] = Serve(lease);
  ASSERT_TRUE(Complete(executor, lease.ref(), done, failed).ok());
  v1::Job job;
  ASSERT_GRPC_OK(Cancel(submitted.id(), &job));
  EXPECT_EQ(job.state(), "cancelled");
  EXPECT_EQ(job.request_counts().completed(), 2);  // what ran; the 2 that never ran are not counted
  EXPECT_EQ(job.request_counts().failed(), 0);
  auto [status, output] = Results(submitted.id());
  ASSERT_GRPC_OK(status);
  EXPECT_THAT(CustomIds(output), ElementsAre("r0", "r1"));
  auto [errors_status, errors] = Results(submitted.id(), /*errors=*/true);
  ASSERT_GRPC_OK(errors_status);
  EXPECT_THAT(CustomIds(errors), ElementsAre("r2", "r3"));
  EXPECT_THAT(errors, HasSubstr("batch_cancelled"));
  // Asked again, the same bytes.
  EXPECT_EQ(Results(submitted.id()).second, output);
}

// A model file in none of the executors' model folders is refused at submit, naming the folders
// and the way out (`minions models push`); one in a folder, or a path through "..", as it resolves.
TEST_F(GrpcServiceTest, AModelPathInNoExecutorsFolderIsRefusedAtSubmit) {
  StartServer();
  v1::Job job;
  // No executor says where its models are: the executors decide (the job is accepted).
  RegisterExecutor("old");
  ASSERT_GRPC_OK(Submit(Request(Records(2)), &job));
  const std::string folder = dir_.File("models");
  std::filesystem::create_directories(folder);
  RegisterExecutor("e", "", "", {folder, "/srv/models"});
  EXPECT_GRPC_ERROR(Submit(Request(Records(2)), &job), INVALID_ARGUMENT, "in none of the executors' model folders");
  grpc::Status refused = Submit(Request(Records(2)), &job);
  EXPECT_THAT(refused.error_message(), HasSubstr(folder));
  EXPECT_THAT(refused.error_message(), HasSubstr("/srv/models"));
  EXPECT_THAT(refused.error_message(), HasSubstr("minions models push " + model_ + " --name NAME"));
  // Inside a folder: accepted. A way out through "..": refused.
  const std::string inside = folder + "/tiny.gguf";
  std::filesystem::copy_file(model_, inside);
  v1::SubmitJobRequest in_folder = Request(Records(2));
  in_folder.set_model(inside);
  ASSERT_GRPC_OK(Submit(in_folder, &job));
  v1::SubmitJobRequest escape = Request(Records(2));
  escape.set_model(folder + "/../tiny.gguf");
  EXPECT_GRPC_ERROR(Submit(escape, &job), INVALID_ARGUMENT, "in none of the executors' model folders");
  ExpectServerUp();
}

// The waiting line agrees with the task table: free executors could take the job, but its
// attempts fail (here: the input cannot be read), and the line says so with the task's error.
TEST_F(GrpcServiceTest, TheWaitingLineNamesTheErrorItsAttemptsFailWith) {
  StartServer();
  auto [submitted, executor, lease] = SubmitAndLeaseOne(2, 2, "e");
  ASSERT_GRPC_OK(Fail(executor, lease.ref(), "retryable", "cannot read the input: 403 Forbidden"));
  v1::Job job = MustGetJob(submitted.id());
  EXPECT_EQ(job.wait_cause(), "in_line");
  EXPECT_THAT(job.wait_reason(), HasSubstr("free executor"));
  EXPECT_THAT(job.wait_reason(), HasSubstr("but its attempts fail: task 0 failed 1 of"));
  EXPECT_THAT(job.wait_reason(), HasSubstr("cannot read the input: 403 Forbidden"));
  EXPECT_THAT(job.wait_reason(), HasSubstr("minions status " + submitted.id() + " --tasks"));
}

// Two records with one custom_id: refused at submit, naming both lines.
TEST_F(GrpcServiceTest, DuplicateCustomIdsAreRefusedNamingTheirLines) {
  StartServer();
  v1::Job job;
  grpc::Status refused = Submit(Request(Records(3) + RequestLine("r1") + "\n"), &job);
  EXPECT_GRPC_ERROR(refused, INVALID_ARGUMENT, "custom_id 'r1' on line 4 is already on line 2");
  ExpectServerUp();
}

// ------------------------------------------------------------------ executors: fencing

TEST_F(GrpcServiceTest, AnExecutorIsTheOneItsCredentialNamesWhateverItsRequestsSay) {
  StartServer();
  MustSubmit(Records(2));
  std::string executor = RegisterExecutor("e");
  // Naming another executor is refused, whichever id it is (unknown or not).
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_executor_id("exe-unknown00000");
  heartbeat.set_state("available");
  v1::HeartbeatResponse reply;
  EXPECT_GRPC_ERROR(executors_->Heartbeat(ExecutorContext(executor).get(), heartbeat, &reply), PERMISSION_DENIED,
                    "not exe-unknown00000");
  v1::LeaseRequest lease;
  lease.set_executor_id("exe-unknown00000");
  lease.set_max_tasks(4);
  v1::LeaseResponse leases;
  EXPECT_GRPC_ERROR(executors_->Lease(ExecutorContext(executor).get(), lease, &leases), PERMISSION_DENIED,
                    executor);
  EXPECT_EQ(leases.leases_size(), 0);
  // An empty id means "the one my credential names".
  heartbeat.set_executor_id("");
  ASSERT_GRPC_OK(executors_->Heartbeat(ExecutorContext(executor).get(), heartbeat, &reply));
  EXPECT_FALSE(reply.reregister());
  heartbeat.set_executor_id(executor);
  ASSERT_GRPC_OK(executors_->Heartbeat(ExecutorContext(executor).get(), heartbeat, &reply));
  // A bad state is refused; so is one only the server may give.
  heartbeat.set_state("sleepy");
  EXPECT_GRPC_ERROR(executors_->Heartbeat(ExecutorContext(executor).get(), heartbeat, &reply), INVALID_ARGUMENT,
                    "sleepy");
  heartbeat.set_state("lost");
  EXPECT_GRPC_ERROR(executors_->Heartbeat(ExecutorContext(executor).get(), heartbeat, &reply), INVALID_ARGUMENT,
                    "lost");
  heartbeat.set_state("revoked");
  EXPECT_GRPC_ERROR(executors_->Heartbeat(ExecutorContext(executor).get(), heartbeat, &reply), INVALID_ARGUMENT,
                    "revoked");
  // Nothing leased by the refused calls.
  EXPECT_THAT(store_->ListRunningTasks().value(), IsEmpty());
}

TEST_F(GrpcServiceTest, ReportsForAnotherExecutorsLeaseAreRefusedAndChangeNothing) {
  StartServer();
  auto [job, holder, lease] = SubmitAndLeaseOne(3, 3, "holder");
  std::string intruder = RegisterExecutor("intruder");
  const v1::LeaseRef& ref = lease.ref();
  EXPECT_EQ(ref.attempt(), 1);

  EXPECT_GRPC_ERROR(Complete(intruder, ref, 3), FAILED_PRECONDITION, "stale attempt");
  EXPECT_GRPC_ERROR(Fail(intruder, ref, "permanent"), FAILED_PRECONDITION, "stale attempt");
  EXPECT_GRPC_ERROR(Fail(intruder, ref, "preempted"), FAILED_PRECONDITION, "stale attempt");
  // An executor without a credential is not even asked about the fence.
  EXPECT_GRPC_ERROR(Complete("exe-nobody000000", ref, 3), UNAUTHENTICATED, "token");

  Task task = StoreTask(job.id(), 0);
  EXPECT_EQ(task.state, TaskState::kRunning);
  EXPECT_EQ(task.executor_id, holder);
  EXPECT_EQ(task.attempt, 1);
  EXPECT_EQ(task.failures, 0);
  EXPECT_EQ(task.preemptions, 0);

  // The real holder still completes it.
  auto [done, failed] = Serve(lease);
  ASSERT_GRPC_OK(Complete(holder, ref, done, failed));
  EXPECT_EQ(StoreTask(job.id(), 0).state, TaskState::kSucceeded);
  WaitForState(job.id(), "completed");
  // And a repeated completion is refused.
  EXPECT_GRPC_ERROR(Complete(holder, ref, done, failed), FAILED_PRECONDITION, "succeeded");
}

// An executor whose Lease answer was lost asks again with `reclaim`: it gets back its own current
// lease (same attempt, nothing requeued), never another executor's, and nothing it says it holds.
TEST_F(GrpcServiceTest, AReclaimGrantsBackOnlyTheCallersOwnUnheardLeases) {
  StartServer();
  v1::Job job = MustSubmit(Records(3), 3);  // one task
  std::string holder = RegisterExecutor("holder");
  std::string intruder = RegisterExecutor("intruder");
  std::vector<v1::TaskLease> granted = MustLease(holder, 1);  // "lost": the holder never heard it
  ASSERT_EQ(granted.size(), 1u);
  auto reclaim = [&](const std::string& executor, const std::vector<v1::LeaseRef>& held) {
    v1::LeaseRequest request;
    request.set_executor_id(executor);
    request.set_max_tasks(4);
    request.set_reclaim(true);
    for (const v1::LeaseRef& ref : held) *request.add_held() = ref;
    v1::LeaseResponse reply;
    grpc::Status status = executors_->Lease(ExecutorContext(executor).get(), request, &reply);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return std::vector<v1::TaskLease>(reply.leases().begin(), reply.leases().end());
  };
  EXPECT_TRUE(reclaim(intruder, {}).empty()) << "another executor's lease is never handed over";
  EXPECT_TRUE(reclaim(holder, {granted[0].ref()}).empty()) << "what it holds is not granted twice";
  std::vector<v1::TaskLease> again = reclaim(holder, {});
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].ref().job_id(), job.id());
  EXPECT_EQ(again[0].ref().task_index(), 0);
  EXPECT_EQ(again[0].ref().attempt(), 1);
  EXPECT_EQ(again[0].byte_begin(), granted[0].byte_begin());
  EXPECT_EQ(again[0].byte_end(), granted[0].byte_end());
  EXPECT_EQ(again[0].model(), granted[0].model());
  Task task = StoreTask(job.id(), 0);
  EXPECT_EQ(task.executor_id, holder);
  EXPECT_EQ(task.attempt, 1);
  // And the holder completes it in that attempt.
  auto [done, failed] = Serve(again[0]);
  ASSERT_GRPC_OK(Complete(holder, again[0].ref(), done, failed));
  WaitForState(job.id(), "completed");
}

TEST_F(GrpcServiceTest, CompletionMustAccountForEveryRecord) {
  StartServer();
  auto [job, executor, lease] = SubmitAndLeaseOne(3, 3, "e");
  EXPECT_GRPC_ERROR(Complete(executor, lease.ref(), 2), INVALID_ARGUMENT, "all 3 records");
  EXPECT_EQ(StoreTask(job.id(), 0).state, TaskState::kRunning);
  Serve(lease);  // a completion is accepted once its output is uploaded (server/chunk_check.h)
  ASSERT_GRPC_OK(Complete(executor, lease.ref(), 3));
}

TEST_F(GrpcServiceTest, AStaleAttemptsCompletionAfterExpiryIsRefused) {
  StartServer();
  auto [job, a, first] = SubmitAndLeaseOne(2, 2, "a");
  std::string b = RegisterExecutor("b");
  ASSERT_EQ(first.ref().attempt(), 1);
  Serve(first);  // a finishes the work, but its lease runs out before it reports

  fake_clock_.Advance(kLeaseTtl + absl::Seconds(1));
  ASSERT_OK_AND_ASSIGN(std::vector<Task> expired, store_->ExpireLeases(fake_clock_.Now(), 100));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].state, TaskState::kPending);
  fake_clock_.Advance(absl::Minutes(1));  // past the retry backoff
  v1::TaskLease second = MustLeaseOne(b);
  EXPECT_EQ(second.ref().attempt(), 2);
  EXPECT_NE(second.chunk_urls(0).output_url(), first.chunk_urls(0).output_url());  // attempts write apart

  EXPECT_GRPC_ERROR(Complete(a, first.ref(), 2), FAILED_PRECONDITION, "stale attempt");
  EXPECT_GRPC_ERROR(Fail(a, first.ref(), "retryable"), FAILED_PRECONDITION, "stale attempt");
  // a's heartbeat about its old lease is answered with "stop it".
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_executor_id(a);
  heartbeat.set_state("busy");
  *heartbeat.add_leases() = first.ref();
  v1::HeartbeatResponse reply;
  ASSERT_GRPC_OK(executors_->Heartbeat(ExecutorContext(a).get(), heartbeat, &reply));
  ASSERT_EQ(reply.cancel_size(), 1);
  EXPECT_EQ(reply.cancel(0).attempt(), 1);
  EXPECT_EQ(reply.renewed_size(), 0);

  Task task = StoreTask(job.id(), 0);
  EXPECT_EQ(task.state, TaskState::kRunning);
  EXPECT_EQ(task.executor_id, b);
  EXPECT_EQ(task.attempt, 2);

  auto [done, failed] = Serve(second);
  ASSERT_GRPC_OK(Complete(b, second.ref(), done, failed));
  v1::Job finished = WaitForState(job.id(), "completed");
  EXPECT_EQ(finished.request_counts().completed(), 2);
}

TEST_F(GrpcServiceTest, UnknownFailureClassIsRefused) {
  StartServer();
  auto [job, executor, lease] = SubmitAndLeaseOne(2, 2, "e");
  EXPECT_GRPC_ERROR(Fail(executor, lease.ref(), "bogus"), INVALID_ARGUMENT, "failure_class");
  EXPECT_GRPC_ERROR(Fail(executor, lease.ref(), ""), INVALID_ARGUMENT, "failure_class");
  Task task = StoreTask(job.id(), 0);
  EXPECT_EQ(task.state, TaskState::kRunning);
  EXPECT_EQ(task.failures, 0);
  // A real failure class is accepted: preempted goes straight back to pending.
  ASSERT_GRPC_OK(Fail(executor, lease.ref(), "preempted", "owner is back"));
  task = StoreTask(job.id(), 0);
  EXPECT_EQ(task.state, TaskState::kPending);
  EXPECT_EQ(task.preemptions, 1);
  EXPECT_EQ(task.failures, 0);
}

TEST_F(GrpcServiceTest, ALeaseThatCannotBeAnsweredHandsEveryGrantedTaskBack) {
  UrlFailingBlobStore blobs(blobs_.get(), "/tasks/1/");
  StartServer(&fake_clock_, Options(), &blobs);
  v1::Job job = MustSubmit(Records(3), 1);
  std::string executor = RegisterExecutor("e");
  v1::LeaseResponse reply;
  EXPECT_GRPC_ERROR(Lease(executor, 3, &reply), UNAVAILABLE, "cannot presign");
  EXPECT_EQ(reply.leases_size(), 0);
  // Nobody holds anything: every task granted by the refused call is pending again, and the
  // hand-back is not counted as a failure.
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    Task task = StoreTask(job.id(), i);
    EXPECT_EQ(task.state, TaskState::kPending);
    EXPECT_EQ(task.failures, 0);
    EXPECT_FALSE(task.not_before.has_value());
  }
  // The tasks whose URLs can be made are leased again at once.
  v1::TaskLease again = MustLeaseOne(executor);
  EXPECT_EQ(again.ref().task_index(), 0);
  EXPECT_EQ(again.ref().attempt(), 2);
}

// ------------------------------------------------------------------ authentication

TEST_F(GrpcServiceTest, CallsWithoutAValidTokenAreRefusedAndMakeNothing) {
  StartServer();
  const std::string none, wrong = "guess", forged = token::Mint(Role::kAdmin).text;

  v1::GetJobRequest get;
  get.set_job_id("job-0123456789ab");
  v1::Job job;
  EXPECT_GRPC_ERROR(jobs_->GetJob(Context(&none).get(), get, &job), UNAUTHENTICATED, "token");
  EXPECT_GRPC_ERROR(jobs_->GetJob(Context(&wrong).get(), get, &job), UNAUTHENTICATED, "token");
  EXPECT_GRPC_ERROR(jobs_->GetJob(Context(&forged).get(), get, &job), UNAUTHENTICATED, "unknown token");
  EXPECT_GRPC_ERROR(jobs_->SubmitJob(Context(&none).get(), Request(Records(2)), &job), UNAUTHENTICATED, "token");
  v1::RegisterRequest register_request;
  v1::RegisterResponse register_reply;
  EXPECT_GRPC_ERROR(executors_->Register(Context(&none).get(), register_request, &register_reply), UNAUTHENTICATED,
                    "token");
  // An admin's token is not an executor's credential; a join token enrols and does nothing else.
  EXPECT_GRPC_ERROR(executors_->Register(Context().get(), register_request, &register_reply), PERMISSION_DENIED,
                    "executor");
  EXPECT_GRPC_ERROR(executors_->Register(Context(&join_token_).get(), register_request, &register_reply),
                    PERMISSION_DENIED, "executor");
  EXPECT_GRPC_ERROR(jobs_->GetJob(Context(&join_token_).get(), get, &job), PERMISSION_DENIED, "join token");
  v1::ListJobsResponse list;
  ASSERT_OK_AND_ASSIGN(auto stored, store_->ListJobs(JobFilter{}));
  EXPECT_THAT(stored, IsEmpty());  // the refused submit made nothing
  ASSERT_OK_AND_ASSIGN(auto executors, store_->ListExecutors());
  EXPECT_THAT(executors, IsEmpty());

  // With a valid token the same calls go through.
  EXPECT_GRPC_ERROR(jobs_->GetJob(Context().get(), get, &job), NOT_FOUND, "job-0123456789ab");
  ASSERT_GRPC_OK(jobs_->SubmitJob(Context().get(), Request(Records(2)), &job));
  EXPECT_EQ(job.state(), "queued");
  EXPECT_EQ(job.owner(), "tests");
  EXPECT_EQ(job.team(), "default");
  ASSERT_GRPC_OK(jobs_->ListJobs(Context().get(), v1::ListJobsRequest(), &list));
  EXPECT_EQ(list.jobs_size(), 1);
  EXPECT_FALSE(RegisterExecutor("with-credential").empty());
}

// ------------------------------------------------------------------ a whole job through gRPC

TEST_F(GrpcServiceTest, AJobRunsToCompletionThroughGrpcAlone) {
  StartServer();
  v1::Job job = MustSubmit(Records(7), 3);
  ASSERT_FALSE(job.id().empty());
  EXPECT_EQ(job.state(), "queued");
  EXPECT_EQ(job.n_tasks(), 3);
  EXPECT_EQ(job.request_counts().total(), 7);
  EXPECT_EQ(job.shard_size(), 3);

  v1::ListTasksRequest list_tasks;
  list_tasks.set_job_id(job.id());
  v1::ListTasksResponse tasks;
  ASSERT_GRPC_OK(jobs_->ListTasks(Context().get(), list_tasks, &tasks));
  ASSERT_EQ(tasks.tasks_size(), 3);
  EXPECT_EQ(tasks.tasks(0).n_records(), 3);
  EXPECT_EQ(tasks.tasks(1).n_records(), 3);
  EXPECT_EQ(tasks.tasks(2).n_records(), 1);
  EXPECT_EQ(tasks.tasks(2).first_record(), 6);

  // Someone watches the job from the start: an update now, then one each second of the clock.
  std::pair<grpc::Status, std::vector<v1::JobProgress>> watched;
  std::thread watcher([&] { watched = Watch(job.id(), 1000); });
  // A second passes; the stream sends its update and waits for the next before the story goes on.
  auto next_update = [&] {
    fake_clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(fake_clock_.AwaitWaiters(1)) << "the watch stream does not wait for its next update";
  };
  ASSERT_TRUE(fake_clock_.AwaitWaiters(1));  // the first update is out

  std::string executor = RegisterExecutor("worker");
  std::vector<v1::TaskLease> leases;
  for (int i = 0; i < 3; ++i) {  // one at a time, as a one-slot executor would
    v1::TaskLease got = MustLeaseOne(executor);
    leases.push_back(got);
  }
  EXPECT_THAT(MustLease(executor, 4), IsEmpty());
  EXPECT_EQ(MustGetJob(job.id()).state(), "running");
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(leases[i].ref().job_id(), job.id());
    EXPECT_EQ(leases[i].ref().task_index(), i);
    EXPECT_EQ(leases[i].ref().attempt(), 1);
    EXPECT_EQ(leases[i].model(), model_);
    EXPECT_THAT(leases[i].input_url(), ::testing::StartsWith("file:///"));
    EXPECT_THAT(leases[i].chunk_urls(0).output_url(), HasSubstr(absl::StrCat("/tasks/", i, "/attempt-1/")));
  }
  // Second 1: a heartbeat says task 0 has done 2 of its records.
  next_update();
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_executor_id(executor);
  heartbeat.set_state("busy");
  *heartbeat.add_leases() = leases[0].ref();
  heartbeat.mutable_leases(0)->set_records_done(2);
  v1::HeartbeatResponse beat;
  ASSERT_GRPC_OK(executors_->Heartbeat(ExecutorContext(executor).get(), heartbeat, &beat));
  // Seconds 2 to 4: the last task finishes first, then the others.
  for (int i : {2, 0, 1}) {
    next_update();
    auto [done, failed] = Serve(leases[i]);
    ASSERT_GRPC_OK(Complete(executor, leases[i].ref(), done, failed));
  }
  next_update();  // every task has ended: finalizing
  // The server's background loop finalises it; the stream's next update is the last.
  v1::Job finished = WaitForState(job.id(), "completed");
  fake_clock_.Advance(absl::Seconds(1));
  watcher.join();
  EXPECT_EQ(finished.request_counts().completed(), 7);
  EXPECT_EQ(finished.request_counts().failed(), 0);
  EXPECT_EQ(finished.tasks_done(), 3);
  EXPECT_FALSE(finished.output_key().empty());
  EXPECT_GT(finished.finished_at_ms(), 0);

  auto [status, output] = Results(job.id());
  ASSERT_GRPC_OK(status);
  EXPECT_THAT(CustomIds(output), ElementsAre("r0", "r1", "r2", "r3", "r4", "r5", "r6"));
  auto [errors_status, errors] = Results(job.id(), /*errors=*/true);
  ASSERT_GRPC_OK(errors_status);
  EXPECT_THAT(errors, IsEmpty());

  // What the watcher saw, second by second: progress moves per record (the heartbeat's 2 records
  // count before their task ends), never back, and the rate and ETA follow.
  ASSERT_GRPC_OK(watched.first);
  const std::vector<v1::JobProgress>& progress = watched.second;
  std::vector<int64_t> done;
  for (const v1::JobProgress& p : progress) {
    done.push_back(p.job().request_counts().completed() + p.job().request_counts().failed() + p.records_in_flight());
  }
  // 0 s: queued; 1 s: leased, nothing done; 2 s: 2 in flight; 3 s: task 2 (1 record) done;
  // 4 s: task 0 done; 5 s: task 1 done; 6 s: completed.
  EXPECT_THAT(done, ElementsAre(0, 0, 2, 3, 4, 7, 7));
  ASSERT_EQ(progress.size(), 7u);
  EXPECT_EQ(progress[0].job().state(), "queued");
  EXPECT_EQ(progress[0].eta_seconds(), -1);
  EXPECT_EQ(progress[2].records_in_flight(), 2);
  EXPECT_EQ(progress[2].tasks_running(), 3);
  EXPECT_EQ(progress[2].executors_working(), 1);
  // The job started at second 0 (its first lease): 2 records in 2 s, 5 left.
  EXPECT_DOUBLE_EQ(progress[2].records_per_second(), 1.0);
  EXPECT_DOUBLE_EQ(progress[2].eta_seconds(), 5.0);
  EXPECT_EQ(progress[5].job().state(), "finalizing");
  EXPECT_EQ(progress[5].eta_seconds(), 0);
  EXPECT_EQ(progress.back().job().state(), "completed");
  EXPECT_EQ(progress.back().eta_seconds(), 0);

  // Watching a finished job gives its final state at once.
  auto [again_status, again] = Watch(job.id());
  ASSERT_GRPC_OK(again_status);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].job().state(), "completed");
}

TEST_F(GrpcServiceTest, InvalidRecordsBecomeErrorLinesOfACompletedJob) {
  StartServer(&real_clock_, Options());
  std::string input = absl::StrCat(RequestLine("a"), "\n", "this is not json\n", RequestLine("c"), "\n",
                                   R"({"custom_id":"d","method":"GET"})", "\n");
  v1::Job job = MustSubmit(input, 2);
  EXPECT_EQ(job.request_counts().total(), 4);
  std::string executor = RegisterExecutor("e");
  int64_t failed_total = 0;
  for (const v1::TaskLease& lease : MustLease(executor, 8)) {
    auto [done, failed] = Serve(lease);
    failed_total += failed;
    ASSERT_GRPC_OK(Complete(executor, lease.ref(), done, failed));
  }
  EXPECT_EQ(failed_total, 2);
  v1::Job finished = WaitForState(job.id(), "completed");
  EXPECT_EQ(finished.request_counts().completed(), 2);
  EXPECT_EQ(finished.request_counts().failed(), 2);
  EXPECT_THAT(CustomIds(Results(job.id()).second), ElementsAre("a", "c"));
  std::string errors = Results(job.id(), true).second;
  std::vector<std::string> error_lines = absl::StrSplit(errors, '\n', absl::SkipEmpty());
  ASSERT_EQ(error_lines.size(), 2u);
  EXPECT_THAT(error_lines[1], HasSubstr("\"d\""));
}

// GPU-hours per team and device kind come from the capabilities each executor reports: a CUDA
// machine's attempt is counted as gpu time of kind cuda, a CPU machine's as cpu.
TEST_F(GrpcServiceTest, HarvestedTimeIsCountedByTeamDeviceAndKindFromTheReportedAccelerator) {
  StartServer();
  MustSubmit(Records(6), 3);  // 2 tasks
  const std::string gpu = RegisterExecutor("gpu-box", kAcceleratorCuda, "NVIDIA H200");
  const std::string cpu = RegisterExecutor("cpu-box");
  std::vector<v1::TaskLease> on_gpu = MustLease(gpu, 1);
  std::vector<v1::TaskLease> on_cpu = MustLease(cpu, 1);
  ASSERT_EQ(on_gpu.size(), 1u);
  ASSERT_EQ(on_cpu.size(), 1u);
  fake_clock_.Advance(absl::Seconds(5));
  ASSERT_GRPC_OK(Fail(gpu, on_gpu[0].ref(), "retryable"));
  ASSERT_GRPC_OK(Fail(cpu, on_cpu[0].ref(), "retryable"));
  auto m = ParsePrometheusSamples(server_->metrics().Render());
  EXPECT_EQ(m["minions_harvested_device_seconds_total{team=\"default\",device=\"gpu\",kind=\"cuda\"}"], 5);
  EXPECT_EQ(m["minions_harvested_device_seconds_total{team=\"default\",device=\"cpu\",kind=\"cpu\"}"], 5);
}

TEST_F(GrpcServiceTest, MetricsCountLeasesAttemptsRecordsAndTimes) {
  StartServer();
  v1::Job job = MustSubmit(Records(9), 3);  // 3 tasks of 3 records, team "default"
  fake_clock_.Advance(absl::Seconds(4));    // they wait 4 s in the queue
  std::string executor = RegisterExecutor("counted");
  std::vector<v1::TaskLease> leases = MustLease(executor, 3);
  ASSERT_EQ(leases.size(), 3u);
  fake_clock_.Advance(absl::Seconds(2));    // each attempt takes 2 s
  // The completed attempt uploads two answers and one error line first.
  auto output = FileUrlPath(leases[0].chunk_urls(0).output_url());
  auto errors = FileUrlPath(leases[0].chunk_urls(0).errors_url());
  ASSERT_OK(output);
  ASSERT_OK(errors);
  const Json usage_r0 = {{"usage", {{"prompt_tokens", 11}, {"completion_tokens", 4}}}};
  const Json usage_r1 = {{"usage", {{"prompt_tokens", 20}, {"completion_tokens", 6}}}};
  ASSERT_OK(WriteFileAtomically(*output, DumpJson(MakeResponseLine("r0", usage_r0)) + "\n" +
                                             DumpJson(MakeResponseLine("r1", usage_r1)) + "\n"));
  ASSERT_OK(WriteFileAtomically(*errors, DumpJson(MakeErrorLine("r2", "invalid_request", "no")) + "\n"));
  ASSERT_GRPC_OK(Complete(executor, leases[0].ref(), 3, 1));
  fake_clock_.Advance(absl::Seconds(1));  // the queued two run 1 s more
  ASSERT_GRPC_OK(Fail(executor, leases[1].ref(), "retryable"));
  ASSERT_GRPC_OK(Fail(executor, leases[2].ref(), "preempted"));
  // A refused report changes no counter.
  EXPECT_FALSE(Complete(executor, leases[1].ref(), 3, 0).ok());
  // Two heartbeats, each timed from its arrival to its answer.
  for (int i = 0; i < 2; ++i) {
    v1::HeartbeatRequest beat;
    beat.set_executor_id(executor);
    beat.set_state("available");
    v1::HeartbeatResponse answer;
    ASSERT_GRPC_OK(executors_->Heartbeat(ExecutorContext(executor).get(), beat, &answer));
  }

  auto m = ParsePrometheusSamples(server_->metrics().Render());
  EXPECT_EQ(m["minions_heartbeat_seconds_count"], 2);
  EXPECT_EQ(m["minions_heartbeat_seconds_bucket{le=\"+Inf\"}"], 2);
  EXPECT_EQ(m["minions_leases_granted_total"], 3);
  EXPECT_EQ(m["minions_task_attempts_total{outcome=\"succeeded\"}"], 1);
  EXPECT_EQ(m["minions_task_attempts_total{outcome=\"retried\"}"], 1);
  EXPECT_EQ(m["minions_task_attempts_total{outcome=\"preempted\"}"], 1);
  EXPECT_EQ(m["minions_task_attempts_total{outcome=\"failed\"}"], 0);
  EXPECT_EQ(m["minions_records_succeeded_total{team=\"default\"}"], 2);
  EXPECT_EQ(m["minions_records_failed_total{team=\"default\"}"], 1);
  // The tokens its answers state, counted as the chunk was admitted (once, whatever the reports).
  EXPECT_EQ(m["minions_tokens_total{team=\"default\",kind=\"prompt\"}"], 31);
  EXPECT_EQ(m["minions_tokens_total{team=\"default\",kind=\"completion\"}"], 10);
  EXPECT_EQ(m["minions_task_duration_seconds_count"], 1);
  EXPECT_EQ(m["minions_task_duration_seconds_sum"], 2);
  EXPECT_EQ(m["minions_task_queue_wait_seconds_count"], 3);
  EXPECT_EQ(m["minions_task_queue_wait_seconds_sum"], 12);
  // Every attempt used the executor's time, successful or not, but one at a time: it held the
  // three for 3 s, so 3 s on a CPU, not each attempt's time since its grant (issue 41, point 2).
  EXPECT_EQ(m["minions_harvested_device_seconds_total{team=\"default\",device=\"cpu\",kind=\"cpu\"}"], 3);
  // The store-derived gauges ride along.
  EXPECT_EQ(m["minions_jobs{state=\"running\"}"], 1);
  EXPECT_EQ(m["minions_tasks{state=\"pending\"}"], 2);
}

// A server whose store refuses its statements (here a schema it does not expect: a column renamed
// by another tool) answers its executors' leases INTERNAL, and its operator hears of it: each such
// fault is counted by method (and logged, server/rpc_faults.h). A refusal of a caller's own
// mistake is not a fault of the server's and is not counted.
TEST_F(GrpcServiceTest, FaultsOfTheServersOwnAreCountedByMethodAndRefusalsAreNot) {
  const std::string path = dir_.File("minions.db");
  ASSERT_OK_AND_ASSIGN(store_, SqliteMetadataStore::Open(path, StoreOptions{}));
  StartServer();
  MustSubmit(Records(3), 3);
  const std::string executor = RegisterExecutor("on-a-changed-schema");
  v1::LeaseResponse reply;
  EXPECT_GRPC_ERROR(executors_->Lease(Context().get(), v1::LeaseRequest(), &reply), PERMISSION_DENIED, "");
  // Bytes that are no request at all, to a synchronous method, from a caller with a credential (one
  // without is refused before its message is read): gRPC itself answers INTERNAL.
  {
    grpc::GenericStub generic(rpc::MakeChannel(server_->address()));
    grpc::Slice junk(std::string("\x0a\xff\xff\xff\xff\x0f"));
    grpc::ByteBuffer request(&junk, 1), response;
    std::unique_ptr<grpc::ClientContext> context = Context();
    absl::Notification done;
    grpc::Status status;
    generic.UnaryCall(context.get(), "/minions.v1.Jobs/GetJob", grpc::StubOptions(), &request, &response,
                      [&](grpc::Status s) {
                        status = std::move(s);
                        done.Notify();
                      });
    done.WaitForNotification();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL) << status.error_message();
  }
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(db, "ALTER TABLE tasks RENAME COLUMN lease_expires_at TO lease_ends", nullptr, nullptr,
                           nullptr),
              SQLITE_OK)
        << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  for (int i = 0; i < 3; ++i) EXPECT_GRPC_ERROR(Lease(executor, 1, &reply), INTERNAL, "lease_expires_at");
  auto m = ParsePrometheusSamples(server_->metrics().Render());
  EXPECT_EQ(m["minions_rpc_faults_total{method=\"/minions.v1.Executors/Lease\",code=\"INTERNAL\"}"], 3);
  int fault_series = 0;
  for (const auto& [sample, value] : m) fault_series += sample.rfind("minions_rpc_faults_total{", 0) == 0;
  EXPECT_EQ(fault_series, 1) << "neither the refused lease (an admin's credential) nor the junk is a fault";
}

// ------------------------------------------------------------------ the watchdog on standby

// A database restart ends every session, and with it the watchdog's lock: the server must seek the
// lock again, or no process would ever requeue the work of a vanished executor (the chaos suite's
// store restart found a job stuck for good that way).
TEST_F(GrpcServiceTest, AServerWhoseWatchdogLostItsLockTakesItBackAndRequeuesAVanishedExecutorsTask) {
  auto held = std::make_shared<std::atomic<bool>>(true);
  WatchdogOptions watchdog_options;
  watchdog_options.executor_timeout = kLeaseTtl * 3;
  watchdog_options.takeover_grace = kLeaseTtl * 2;
  ServerOptions options = Options();
  options.background_thread = false;
  clock_ = &fake_clock_;
  server_ = std::make_unique<ControlPlane>(store_.get(), blobs_.get(), &fake_clock_,
                                           ControlPlaneOptions{options, watchdog_options},
                                           std::make_unique<FakeWatchdogLock>(held));
  bool lock_free = false;  // another process holds it until the test says otherwise
  int tries = 0;
  server_->SetWatchdogLockSource([&]() -> absl::StatusOr<std::unique_ptr<WatchdogLock>> {
    ++tries;
    if (!lock_free) return absl::UnavailableError("another process holds the watchdog lock");
    return std::unique_ptr<WatchdogLock>(std::make_unique<FakeWatchdogLock>());
  });
  ASSERT_OK(server_->Start());
  Connect();

  v1::Job job = MustSubmit(Records(3), 3);
  std::string executor = RegisterExecutor("vanishes");
  ASSERT_EQ(MustLease(executor, 1).size(), 1u);
  // The database restarts: the lock is gone; the executor vanishes with its task.
  *held = false;
  server_->RunBackgroundPass();
  EXPECT_EQ(tries, 0) << "the lock is sought only on the pass after it was found lost";
  fake_clock_.Advance(kLeaseTtl * 2);
  server_->RunBackgroundPass();  // sought, not free: the lease stays, nobody requeues it
  EXPECT_EQ(tries, 1);
  EXPECT_EQ(StoreTask(job.id(), 0).state, TaskState::kRunning);
  // The lock is free again: the server takes it, waits out its takeover grace, then requeues.
  lock_free = true;
  fake_clock_.Advance(absl::Seconds(1));
  server_->RunBackgroundPass();
  EXPECT_EQ(tries, 2);
  EXPECT_EQ(StoreTask(job.id(), 0).state, TaskState::kRunning) << "requeued inside the takeover grace";
  fake_clock_.Advance(watchdog_options.takeover_grace);
  server_->RunBackgroundPass();
  EXPECT_EQ(tries, 2) << "sought again while held";
  Task task = StoreTask(job.id(), 0);
  EXPECT_EQ(task.state, TaskState::kPending);
  EXPECT_THAT(task.last_error, HasSubstr("expired"));
}

}  // namespace
}  // namespace minions::testing
