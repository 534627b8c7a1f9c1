// Attacks on the gRPC port, one per attack and role boundary. Each asserts the refusal AND that
// nothing else was lost: the victim's job, lease or credential is as it was, and the refused call
// left no trace in the store.

#include <functional>
#include <thread>

#include "identity/token.h"
#include "secure_server.h"
#include "server/keys.h"

namespace minions::testing {
namespace {

class GrpcAttack : public SecureServer {
 protected:
  // A unary call of `stub` as the holder of `token` ("": none): what it answered.
  template <typename Stub, typename Request, typename Reply>
  grpc::Status CallAs(Stub& stub, grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Reply*),
                      const std::string& token, const Request& request = Request()) {
    Reply reply;
    return (stub.*method)(As(token).get(), request, &reply);
  }
  // A unary Jobs call about job `id` as the holder of `token`.
  template <typename Request, typename Reply>
  grpc::Status CallOnJob(grpc::Status (v1::Jobs::Stub::*method)(grpc::ClientContext*, const Request&, Reply*),
                         const std::string& token, const std::string& id) {
    Request request;
    request.set_job_id(id);
    return CallAs(*jobs_, method, token, request);
  }
  // A streaming Jobs call about job `id` as the holder of `token`: how it ended. The test fails
  // if it streams anything (`leaked` says what that would be).
  template <typename Request, typename Message>
  grpc::Status StreamOnJob(
      std::unique_ptr<grpc::ClientReader<Message>> (v1::Jobs::Stub::*method)(grpc::ClientContext*, const Request&),
      const std::string& token, const std::string& id, const char* leaked) {
    Request request;
    request.set_job_id(id);
    auto context = As(token);
    auto reader = ((*jobs_).*method)(context.get(), request);
    Message message;
    EXPECT_FALSE(reader->Read(&message)) << leaked;
    return reader->Finish();
  }
  void SetUp() override {
    SecureServer::SetUp();
    StartServer();
    CreateTeam("search");
    CreateTeam("ads");
    search_submitter_ = Issue(Role::kSubmitter, "search", "alice");
    search_viewer_ = Issue(Role::kViewer, "search", "bob");
    ads_submitter_ = Issue(Role::kSubmitter, "ads", "eve");
  }
  std::string search_submitter_, search_viewer_, ads_submitter_;
};

TEST_F(GrpcAttack, NoTokenIsRefusedOnEveryServiceAndMakesNothing) {
  EXPECT_GRPC_CODE(CallAs(*jobs_, &v1::Jobs::Stub::SubmitJob, "", Request(2)), UNAUTHENTICATED);
  EXPECT_GRPC_CODE(CallAs(*jobs_, &v1::Jobs::Stub::ListJobs, ""), UNAUTHENTICATED);
  EXPECT_GRPC_CODE(CallAs(*jobs_, &v1::Jobs::Stub::ListExecutors, ""), UNAUTHENTICATED);
  EXPECT_GRPC_CODE(CallAs(*executors_, &v1::Executors::Stub::Register, ""), UNAUTHENTICATED);
  EXPECT_GRPC_CODE(CallAs(*executors_, &v1::Executors::Stub::Enrol, ""), UNAUTHENTICATED);
  EXPECT_GRPC_CODE(CallAs(*executors_, &v1::Executors::Stub::Lease, ""), UNAUTHENTICATED);
  v1::IssueTokenRequest issue;
  issue.set_role("admin");
  issue.set_principal("me");
  EXPECT_GRPC_CODE(CallAs(*admin_stub_, &v1::Admin::Stub::IssueToken, "", issue), UNAUTHENTICATED);
  // A token of the right shape that was never issued is no better.
  EXPECT_GRPC_CODE(CallAs(*admin_stub_, &v1::Admin::Stub::IssueToken, token::Mint(Role::kAdmin).text, issue),
                   UNAUTHENTICATED);
  EXPECT_THAT(Must(store_->ListJobs({})), IsEmpty());
  EXPECT_THAT(Must(store_->ListExecutors()), IsEmpty());
  EXPECT_EQ(Must(store_->ListTokens({"", Role::kAdmin, "", true})).size(), 1u);  // the fixture's
}

TEST_F(GrpcAttack, ARevokedTokenIsRefusedOnItsNextCallAndTheJobsItMadeStay) {
  v1::Job job = MustSubmit(search_submitter_);
  TokenRecord record = Must(store_->FindToken(token::Hash(search_submitter_)));
  v1::RevokeTokenRequest revoke;
  revoke.set_token_id(record.id);
  v1::TokenInfo info;
  ASSERT_GRPC_OK(admin_stub_->RevokeToken(As(admin_).get(), revoke, &info));
  EXPECT_GT(info.revoked_at_ms(), 0);
  // Refused at once by the server that revoked it (its cache forgot the credential).
  v1::GetJobRequest get;
  get.set_job_id(job.id());
  v1::Job seen;
  EXPECT_GRPC_ERROR(jobs_->GetJob(As(search_submitter_).get(), get, &seen), UNAUTHENTICATED, "revoked");
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  EXPECT_GRPC_CODE(jobs_->CancelJob(As(search_submitter_).get(), cancel, &seen), UNAUTHENTICATED);
  // The job it made is untouched, and its team's other members still see it.
  EXPECT_EQ(StoreJob(job.id()).state, JobState::kQueued);
  ASSERT_GRPC_OK(jobs_->GetJob(As(search_viewer_).get(), get, &seen));
  EXPECT_EQ(seen.owner(), "alice");
}

TEST_F(GrpcAttack, AnExpiredJoinTokenEnrolsNobody) {
  const std::string join = Issue(Role::kJoin, "", "laptops", absl::Milliseconds(1));
  absl::SleepFor(absl::Milliseconds(5));
  v1::EnrolRequest request;
  request.mutable_capabilities()->set_name("late");
  v1::EnrolResponse reply;
  EXPECT_GRPC_ERROR(executors_->Enrol(As(join).get(), request, &reply), UNAUTHENTICATED, "expired");
  EXPECT_TRUE(reply.credential().empty());
  EXPECT_THAT(Must(store_->ListExecutors()), IsEmpty());
  EXPECT_THAT(Must(store_->ListTokens({"", Role::kExecutor, "", true})), IsEmpty());
}

TEST_F(GrpcAttack, AnExecutorNameWithControlCharactersIsRefused) {
  // Names are printed on admins' terminals (`minions executors`) and in logs: an escape sequence
  // in one would rewrite what they see (issue 40, point 7).
  const std::string join = Issue(Role::kJoin, "", "laptops", std::nullopt, 10);
  for (const std::string& name : {std::string("\x1b[2Jowned"), std::string("two\nlines"),
                                  std::string(101, 'a'), std::string("c1 \xc2\x9b" "31m")}) {
    v1::EnrolRequest request;
    request.mutable_capabilities()->set_name(name);
    v1::EnrolResponse reply;
    grpc::Status status = executors_->Enrol(As(join).get(), request, &reply);
    EXPECT_GRPC_CODE(status, INVALID_ARGUMENT);
    EXPECT_TRUE(reply.credential().empty());
  }
  EXPECT_THAT(Must(store_->ListExecutors()), IsEmpty());
  // An enrolled executor cannot take such a name when it registers either.
  Enrolled worker = Enrol("mac-studio.local");
  v1::RegisterRequest registration;
  registration.mutable_capabilities()->set_name("\x1b]0;evil\x07");
  v1::RegisterResponse registered;
  EXPECT_GRPC_CODE(executors_->Register(As(worker.credential).get(), registration, &registered), INVALID_ARGUMENT);
  auto executors = Must(store_->ListExecutors());
  ASSERT_EQ(executors.size(), 1u);
  EXPECT_EQ(executors[0].info.name, "mac-studio.local");
}

TEST_F(GrpcAttack, AJoinTokenIsTradedOnlyAsOftenAsItsUsesAndForNothingElse) {
  const std::string join = Issue(Role::kJoin, "", "laptops", std::nullopt, /*uses=*/2);
  v1::EnrolRequest request;
  v1::EnrolResponse first, second, third;
  ASSERT_GRPC_OK(executors_->Enrol(As(join).get(), request, &first));
  // While it has uses left it cannot read jobs, act as an executor, or administer.
  v1::ListJobsResponse jobs;
  EXPECT_GRPC_CODE(jobs_->ListJobs(As(join).get(), v1::ListJobsRequest(), &jobs), PERMISSION_DENIED);
  v1::LeaseResponse leases;
  EXPECT_GRPC_CODE(executors_->Lease(As(join).get(), v1::LeaseRequest(), &leases), PERMISSION_DENIED);
  v1::ListTeamsResponse teams;
  EXPECT_GRPC_CODE(admin_stub_->ListTeams(As(join).get(), v1::ListTeamsRequest(), &teams), PERMISSION_DENIED);
  ASSERT_GRPC_OK(executors_->Enrol(As(join).get(), request, &second));
  // Used up.
  EXPECT_GRPC_CODE(executors_->Enrol(As(join).get(), request, &third), UNAUTHENTICATED);
  EXPECT_EQ(Must(store_->ListExecutors()).size(), 2u);
  // Nor can an executor's credential enrol another executor.
  EXPECT_GRPC_CODE(executors_->Enrol(As(first.credential()).get(), request, &third), UNAUTHENTICATED);
  EXPECT_EQ(Must(store_->ListExecutors()).size(), 2u);
}

TEST_F(GrpcAttack, AViewerCanReadButNotSubmitOrCancel) {
  v1::Job job = MustSubmit(search_submitter_);
  v1::Job reply;
  EXPECT_GRPC_ERROR(jobs_->SubmitJob(As(search_viewer_).get(), Request(2), &reply), PERMISSION_DENIED, "viewer");
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  EXPECT_GRPC_CODE(jobs_->CancelJob(As(search_viewer_).get(), cancel, &reply), PERMISSION_DENIED);
  // Nothing was made or cancelled; reading works.
  EXPECT_EQ(Must(store_->ListJobs({})).size(), 1u);
  EXPECT_EQ(StoreJob(job.id()).state, JobState::kQueued);
  v1::GetJobRequest get;
  get.set_job_id(job.id());
  ASSERT_GRPC_OK(jobs_->GetJob(As(search_viewer_).get(), get, &reply));
}

TEST_F(GrpcAttack, AnotherTeamsJobIsNotFoundEverywhereAndStaysAsItWas) {
  v1::Job theirs = MustSubmit(search_submitter_, 6);
  const std::string unknown = "job-000000000000";
  // Each call on their job answers exactly as on a job that does not exist.
  auto expect_hidden = [&](const std::function<grpc::Status(const std::string&)>& call, const char* what) {
    grpc::Status on_theirs = call(theirs.id());
    grpc::Status on_unknown = call(unknown);
    EXPECT_EQ(on_theirs.error_code(), grpc::StatusCode::NOT_FOUND) << what << ": " << on_theirs.error_message();
    EXPECT_EQ(on_theirs.error_message(), absl::StrReplaceAll(on_unknown.error_message(), {{unknown, theirs.id()}}))
        << what;
  };
  expect_hidden([&](const std::string& id) { return CallOnJob(&v1::Jobs::Stub::GetJob, ads_submitter_, id); },
                "GetJob");
  expect_hidden([&](const std::string& id) { return CallOnJob(&v1::Jobs::Stub::CancelJob, ads_submitter_, id); },
                "CancelJob");
  expect_hidden([&](const std::string& id) { return CallOnJob(&v1::Jobs::Stub::ListTasks, ads_submitter_, id); },
                "ListTasks");
  expect_hidden(
      [&](const std::string& id) {
        return StreamOnJob(&v1::Jobs::Stub::GetResults, ads_submitter_, id, "a byte of another team's results");
      },
      "GetResults");
  expect_hidden(
      [&](const std::string& id) {
        return StreamOnJob(&v1::Jobs::Stub::WatchJob, ads_submitter_, id, "progress of another team's job");
      },
      "WatchJob");
  // Listing shows only the caller's team; naming the other team is refused.
  v1::ListJobsResponse listed;
  ASSERT_GRPC_OK(jobs_->ListJobs(As(ads_submitter_).get(), v1::ListJobsRequest(), &listed));
  EXPECT_EQ(listed.jobs_size(), 0);
  v1::ListJobsRequest by_team;
  by_team.set_team("search");
  EXPECT_GRPC_CODE(jobs_->ListJobs(As(ads_submitter_).get(), by_team, &listed), PERMISSION_DENIED);
  // Their job is as it was: not cancelled, its tasks untouched.
  EXPECT_EQ(StoreJob(theirs.id()).state, JobState::kQueued);
  for (const Task& task : Must(store_->ListTasks(theirs.id()))) EXPECT_EQ(task.state, TaskState::kPending);
  // An admin sees every team's.
  v1::GetJobRequest get;
  get.set_job_id(theirs.id());
  v1::Job seen;
  ASSERT_GRPC_OK(jobs_->GetJob(As(admin_).get(), get, &seen));
  EXPECT_EQ(seen.team(), "search");
}

TEST_F(GrpcAttack, TheFleetShowsOnlyTheCallersOwnTasksAndNeverWhyAnOwnerIsBack) {
  Enrolled worker = Enrol("worker");
  Enrolled laptop = Enrol("laptop");
  v1::Job theirs = MustSubmit(search_submitter_);
  ASSERT_EQ(MustLease(worker, 1).size(), 1u);
  v1::HeartbeatRequest beat;
  beat.set_state("owner_active");
  beat.set_state_reason("keyboard activity 3 s ago; zoom.us running");
  v1::HeartbeatResponse answer;
  ASSERT_GRPC_OK(executors_->Heartbeat(As(laptop.credential).get(), beat, &answer));
  v1::ListExecutorsResponse fleet;
  ASSERT_GRPC_OK(jobs_->ListExecutors(As(ads_submitter_).get(), v1::ListExecutorsRequest(), &fleet));
  ASSERT_EQ(fleet.executors_size(), 2);
  for (const v1::Executor& e : fleet.executors()) {
    EXPECT_THAT(e.current_tasks(), IsEmpty()) << "another team's task shown";
    if (e.id() == laptop.id) {
      EXPECT_EQ(e.state(), "unavailable");
      EXPECT_EQ(e.state_reason(), "");
    }
  }
  // The reason was never even stored; the team that owns the task sees it.
  EXPECT_EQ(Must(store_->GetExecutor(laptop.id)).state_reason, "");
  ASSERT_GRPC_OK(jobs_->ListExecutors(As(search_viewer_).get(), v1::ListExecutorsRequest(), &fleet));
  int shown = 0;
  for (const v1::Executor& e : fleet.executors()) shown += e.current_tasks_size();
  EXPECT_EQ(shown, 1);
}

// 40.7f: another team's cached digests, its loaded model and the exact second an executor beat
// are not shown to a team; an admin sees them all.
TEST_F(GrpcAttack, TheFleetHidesAnotherTeamsModelsAndTheExactHeartbeat) {
  const std::string ours = "sha256:" + std::string(64, 'a');
  const std::string theirs = "sha256:" + std::string(64, 'b');
  AddModel("search", "ours", ours);
  AddModel("ads", "theirs", theirs);
  Enrolled worker = Enrol("worker");
  ASSERT_GRPC_OK(RegisterHolding(worker, "worker", {ours, theirs}, theirs));
  v1::ListExecutorsResponse fleet;
  ASSERT_GRPC_OK(jobs_->ListExecutors(As(search_viewer_).get(), v1::ListExecutorsRequest(), &fleet));
  ASSERT_EQ(fleet.executors_size(), 1);
  const v1::Executor& seen = fleet.executors(0);
  EXPECT_THAT(seen.models_cached(), ::testing::ElementsAre(ours));
  ASSERT_EQ(seen.models_shown_size(), 1);
  EXPECT_THAT(seen.models_shown(0), HasSubstr("ours@"));
  EXPECT_EQ(seen.model_loaded(), "");
  EXPECT_EQ(seen.model_loaded_shown(), "(another team's model)");
  EXPECT_EQ(fleet.DebugString().find(std::string(40, 'b')), std::string::npos);
  EXPECT_EQ(fleet.DebugString().find("theirs"), std::string::npos);
  EXPECT_EQ(seen.last_heartbeat_at_ms() % 30000, 0);
  EXPECT_GT(seen.last_heartbeat_at_ms(), 0);
  // An admin sees every digest, the loaded model and the heartbeat to the millisecond.
  ASSERT_GRPC_OK(jobs_->ListExecutors(As(admin_).get(), v1::ListExecutorsRequest(), &fleet));
  EXPECT_EQ(fleet.executors(0).models_cached_size(), 2);
  EXPECT_EQ(fleet.executors(0).model_loaded(), theirs);
  EXPECT_EQ(fleet.executors(0).last_heartbeat_at_ms(),
            absl::ToUnixMillis(Must(store_->GetExecutor(worker.id)).last_heartbeat_at));
}

TEST_F(GrpcAttack, TeamAndPriorityComeFromTheCredential) {
  v1::Job job;
  // Another team's name is refused; so is a priority over the team's ceiling (10).
  EXPECT_GRPC_ERROR(jobs_->SubmitJob(As(search_submitter_).get(), Request(2, "ads"), &job), PERMISSION_DENIED, "team search");
  v1::SubmitJobRequest urgent = Request(2);
  urgent.set_priority(11);
  EXPECT_GRPC_ERROR(jobs_->SubmitJob(As(search_submitter_).get(), urgent, &job), PERMISSION_DENIED, "priority 10 at most");
  EXPECT_THAT(Must(store_->ListJobs({})), IsEmpty());
  // Within bounds: the credential's team and principal.
  urgent.set_priority(10);
  ASSERT_GRPC_OK(jobs_->SubmitJob(As(search_submitter_).get(), urgent, &job));
  EXPECT_EQ(job.team(), "search");
  EXPECT_EQ(job.owner(), "alice");
  EXPECT_EQ(job.priority(), 10);
}

TEST_F(GrpcAttack, ASubmitterCannotLearnWhetherAPathExistsOnTheServer) {
  // A file the server's machine has and one it has not are answered alike: no oracle over its
  // file system for a team's credential (an admin is told, see GrpcServiceTest).
  v1::Job job;
  v1::SubmitJobRequest existing = Request(2);
  existing.set_model("/etc/passwd");
  v1::SubmitJobRequest missing = Request(2);
  missing.set_model("/no/such/folder/model.gguf");
  grpc::Status there = jobs_->SubmitJob(As(search_submitter_).get(), existing, &job);
  grpc::Status not_there = jobs_->SubmitJob(As(search_submitter_).get(), missing, &job);
  EXPECT_EQ(there.error_code(), not_there.error_code());
  EXPECT_THAT(not_there.error_message(), Not(HasSubstr("does not exist")));
}

TEST_F(GrpcAttack, AJobsInputCanOnlyBeTheCallersOwnUpload) {
  // Alice's inline input is kept among her uploads.
  v1::Job alices = MustSubmit(search_submitter_, 4);
  const std::string alices_input = StoreJob(alices.id()).spec.input_key;
  ASSERT_THAT(alices_input, ::testing::StartsWith(keys::Uploads("search", "alice")));
  // Eve (another team) cannot run it as her input, nor any other object of the store: another
  // job's results, or a path that climbs out.
  for (const std::string& key : {alices_input, keys::JobOutput(alices.id(), "0123456789abcdef"), std::string("inputs/whatever.jsonl"),
                                 keys::Uploads("ads", "eve") + "../../search/alice/x.jsonl"}) {
    v1::SubmitJobRequest request = Request(0);
    request.clear_input();
    request.set_input_key(key);
    v1::Job job;
    grpc::Status status = jobs_->SubmitJob(As(ads_submitter_).get(), request, &job);
    EXPECT_TRUE(status.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
                status.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
        << key << ": " << status.error_code() << " " << status.error_message();
  }
  // Nor can Bob, a teammate with another name.
  const std::string carol = Issue(Role::kSubmitter, "search", "carol");
  v1::SubmitJobRequest request = Request(0);
  request.clear_input();
  request.set_input_key(alices_input);
  v1::Job job;
  EXPECT_GRPC_CODE(jobs_->SubmitJob(As(carol).get(), request, &job), PERMISSION_DENIED);
  EXPECT_EQ(Must(store_->ListJobs({})).size(), 1u);
  // Alice herself can run it again.
  ASSERT_GRPC_OK(jobs_->SubmitJob(As(search_submitter_).get(), request, &job));
  EXPECT_EQ(job.request_counts().total(), 4);
}

TEST_F(GrpcAttack, AnExecutorCannotActAsAnotherAndTheVictimsLeaseIsUntouched) {
  Enrolled victim = Enrol("victim");
  Enrolled intruder = Enrol("intruder");
  v1::Job job = MustSubmit(search_submitter_, 2);  // one task
  std::vector<v1::TaskLease> leases = MustLeaseExactly(victim, 1);
  const v1::LeaseRef& ref = leases[0].ref();

  // Every call naming the victim with the intruder's credential is refused.
  v1::RegisterRequest registration;
  registration.set_executor_id(victim.id);
  v1::RegisterResponse registered;
  EXPECT_GRPC_CODE(executors_->Register(As(intruder.credential).get(), registration, &registered),
                   PERMISSION_DENIED);
  v1::HeartbeatRequest beat;
  beat.set_executor_id(victim.id);
  *beat.add_leases() = ref;
  v1::HeartbeatResponse answer;
  EXPECT_GRPC_CODE(executors_->Heartbeat(As(intruder.credential).get(), beat, &answer), PERMISSION_DENIED);
  v1::CompleteRequest complete;
  complete.set_executor_id(victim.id);
  *complete.mutable_ref() = ref;
  complete.mutable_ref()->set_records_done(2);
  v1::CompleteResponse completed;
  EXPECT_GRPC_CODE(executors_->Complete(As(intruder.credential).get(), complete, &completed), PERMISSION_DENIED);
  v1::FailRequest fail;
  fail.set_executor_id(victim.id);
  *fail.mutable_ref() = ref;
  fail.set_failure_class("permanent");
  v1::FailResponse failed;
  EXPECT_GRPC_CODE(executors_->Fail(As(intruder.credential).get(), fail, &failed), PERMISSION_DENIED);
  // As itself, the intruder's reports about the victim's lease fail the fence.
  complete.clear_executor_id();
  EXPECT_GRPC_CODE(executors_->Complete(As(intruder.credential).get(), complete, &completed), FAILED_PRECONDITION);
  fail.clear_executor_id();
  EXPECT_GRPC_CODE(executors_->Fail(As(intruder.credential).get(), fail, &failed), FAILED_PRECONDITION);

  // The victim's lease is as it was, and the victim finishes the job.
  Task task = Must(store_->ListTasks(job.id()))[0];
  EXPECT_EQ(task.state, TaskState::kRunning);
  EXPECT_EQ(task.executor_id, victim.id);
  EXPECT_EQ(task.failures, 0);
  ASSERT_GRPC_OK(CompleteLease(victim, leases[0]));
  EXPECT_EQ(Must(store_->ListTasks(job.id()))[0].state, TaskState::kSucceeded);
}

TEST_F(GrpcAttack, ARevokedExecutorIsCutOffAtOnceAndItsTasksGoToAnother) {
  Enrolled bad = Enrol("bad");
  Enrolled good = Enrol("good");
  v1::Job job = MustSubmit(search_submitter_, 4);  // two tasks
  std::vector<v1::TaskLease> taken = MustLeaseExactly(bad, 2);
  // A heartbeat stream it opened before (proto: Beats) beats until the revocation...
  auto stream_context = As(bad.credential);
  auto stream = executors_->Beats(stream_context.get());
  v1::HeartbeatRequest beat;
  beat.set_state("busy");
  for (const auto& lease : taken) *beat.add_leases() = lease.ref();
  v1::HeartbeatResponse beaten;
  ASSERT_TRUE(stream->Write(beat) && stream->Read(&beaten));
  EXPECT_EQ(beaten.renewed_size(), 2);
  v1::RevokeExecutorRequest revoke;
  revoke.set_executor_id(bad.id);
  v1::Executor revoked;
  ASSERT_GRPC_OK(admin_stub_->RevokeExecutor(As(admin_).get(), revoke, &revoked));
  EXPECT_EQ(revoked.state(), "revoked");
  // Its credential is refused at once; its completions would be stale anyway.
  v1::HeartbeatResponse answer;
  EXPECT_GRPC_CODE(executors_->Heartbeat(As(bad.credential).get(), v1::HeartbeatRequest(), &answer),
                   UNAUTHENTICATED);
  EXPECT_GRPC_CODE(CompleteLease(bad, taken[0]), UNAUTHENTICATED);
  // ... and is cut at its next beat, which renews nothing.
  EXPECT_FALSE(stream->Write(beat) && stream->Read(&beaten));
  EXPECT_GRPC_CODE(stream->Finish(), UNAUTHENTICATED);
  // Its tasks are pending again (not counted as failures) and the good executor does them.
  std::vector<v1::TaskLease> again = MustLeaseExactly(good, 2);
  for (const auto& lease : again) ASSERT_GRPC_OK(CompleteLease(good, lease));
  for (const Task& task : Must(store_->ListTasks(job.id()))) {
    EXPECT_EQ(task.state, TaskState::kSucceeded);
    EXPECT_EQ(task.failures, 0);
  }
}

// 40.3: where the server requires approval, a stolen join token yields an executor that gets no
// work: its lease is refused (saying why) until an admin approves it, and no one else may.
TEST_F(GrpcAttack, AnUnapprovedExecutorGetsNoWorkAndOnlyAnAdminApprovesIt) {
  server_->Shutdown();
  ServerOptions options = Options();
  options.require_executor_approval = true;
  StartServer(options);
  Enrolled stranger = Enrol("stranger");
  EXPECT_EQ(Must(store_->GetExecutor(stranger.id)).state, ExecutorState::kPending);
  v1::Job job = MustSubmit(search_submitter_, 2);
  v1::LeaseRequest lease;
  lease.set_max_tasks(1);
  v1::LeaseResponse leased;
  grpc::Status refused = executors_->Lease(As(stranger.credential).get(), lease, &leased);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(), HasSubstr("approv"));
  EXPECT_EQ(leased.leases_size(), 0);
  // Saying it is available changes nothing.
  v1::HeartbeatRequest beat;
  beat.set_state("available");
  v1::HeartbeatResponse answer;
  ASSERT_GRPC_OK(executors_->Heartbeat(As(stranger.credential).get(), beat, &answer));
  beat.set_state("pending");
  EXPECT_GRPC_CODE(executors_->Heartbeat(As(stranger.credential).get(), beat, &answer), INVALID_ARGUMENT);
  // Nobody but an admin approves: not a team's submitter, not the executor itself.
  v1::ApproveExecutorRequest approve;
  approve.set_executor_id(stranger.id);
  v1::Executor approved;
  EXPECT_GRPC_CODE(admin_stub_->ApproveExecutor(As(search_submitter_).get(), approve, &approved), PERMISSION_DENIED);
  EXPECT_GRPC_CODE(admin_stub_->ApproveExecutor(As(stranger.credential).get(), approve, &approved),
                   PERMISSION_DENIED);
  EXPECT_GRPC_CODE(admin_stub_->ApproveExecutor(As("").get(), approve, &approved), UNAUTHENTICATED);
  EXPECT_EQ(Must(store_->GetExecutor(stranger.id)).state, ExecutorState::kPending);
  EXPECT_EQ(Must(store_->ListTasks(job.id()))[0].state, TaskState::kPending);
  // An admin approves it once; then it works.
  ASSERT_GRPC_OK(admin_stub_->ApproveExecutor(As(admin_).get(), approve, &approved));
  EXPECT_EQ(approved.state(), "available");
  EXPECT_EQ(MustLease(stranger, 1).size(), 1u);
  EXPECT_GRPC_CODE(admin_stub_->ApproveExecutor(As(admin_).get(), approve, &approved), FAILED_PRECONDITION);
}

// 40.3: what an executor says of itself is checked, not stored as sent: tasks at once, runner
// names (and, where the pool has an allowlist, only those), accelerator, models and free text;
// each refused at enrolment and at registration, the stored executor unchanged.
TEST_F(GrpcAttack, AnExecutorsClaimedCapabilitiesAreBoundedAndItsRunnersAllowlisted) {
  server_->Shutdown();
  ServerOptions options = Options();
  options.runner_allowlist = {"llama", "embed"};
  StartServer(options);
  Enrolled honest = Enrol("honest");
  using Claim = std::function<void(v1::Capabilities*)>;
  const std::vector<std::pair<std::string, Claim>> claims = {
      {"tasks", [](v1::Capabilities* c) { c->set_max_tasks(100000); }},
      {"runner", [](v1::Capabilities* c) { c->add_runners("search-ranker"); }},  // another team's runner
      {"runner", [](v1::Capabilities* c) { c->add_runners("Evil Runner"); }},
      {"runners", [](v1::Capabilities* c) {
         for (int i = 0; i < 40; ++i) c->add_runners("llama");
       }},
      {"accelerator", [](v1::Capabilities* c) { c->set_accelerator("cuda\x1b[2J"); }},
      {"os", [](v1::Capabilities* c) { c->set_os("linux\x1b]0;owned\x07"); }},
      {"version", [](v1::Capabilities* c) { c->set_version(std::string(1000, 'v')); }},
      {"models", [](v1::Capabilities* c) {
         for (int i = 0; i < 5000; ++i) c->add_models("sha256:00");
       }},
  };
  const std::string join = Issue(Role::kJoin, "", "laptops", std::nullopt, 100);
  for (const auto& [what, claim] : claims) {
    v1::EnrolRequest request;
    request.mutable_capabilities()->set_name("liar");
    request.mutable_capabilities()->add_runners("llama");
    claim(request.mutable_capabilities());
    v1::EnrolResponse reply;
    grpc::Status status = executors_->Enrol(As(join).get(), request, &reply);
    EXPECT_GRPC_CODE(status, INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr(what == "tasks" ? "tasks at once" : what)) << what;
    EXPECT_TRUE(reply.credential().empty());
    v1::RegisterRequest registration;
    *registration.mutable_capabilities() = request.capabilities();
    registration.mutable_capabilities()->set_name("honest");
    v1::RegisterResponse registered;
    EXPECT_GRPC_CODE(executors_->Register(As(honest.credential).get(), registration, &registered), INVALID_ARGUMENT);
  }
  // The refusal names the allowlist and who sets it.
  v1::RegisterRequest ranker;
  ranker.mutable_capabilities()->set_name("honest");
  ranker.mutable_capabilities()->add_runners("search-ranker");
  v1::RegisterResponse registered;
  grpc::Status refused = executors_->Register(As(honest.credential).get(), ranker, &registered);
  EXPECT_THAT(refused.error_message(), HasSubstr("server.runner_allowlist"));
  ASSERT_EQ(Must(store_->ListExecutors()).size(), 1u);
  const Executor stored = Must(store_->GetExecutor(honest.id));
  EXPECT_EQ(stored.info.runners, std::vector<std::string>{"llama"});
  EXPECT_EQ(stored.info.max_tasks, 1);
  // Within the bounds and the allowlist: taken.
  ranker.mutable_capabilities()->clear_runners();
  ranker.mutable_capabilities()->add_runners("llama");
  ranker.mutable_capabilities()->add_runners("embed");
  ranker.mutable_capabilities()->set_max_tasks(8);
  ASSERT_GRPC_OK(executors_->Register(As(honest.credential).get(), ranker, &registered));
  EXPECT_EQ(Must(store_->GetExecutor(honest.id)).info.runners, (std::vector<std::string>{"llama", "embed"}));
  // Heartbeats replace what it holds of the models: bounded the same way.
  v1::HeartbeatRequest beat;
  beat.set_state("available");
  for (int i = 0; i < 5000; ++i) beat.mutable_holdings()->add_cached("sha256:00");
  v1::HeartbeatResponse answer;
  EXPECT_GRPC_CODE(executors_->Heartbeat(As(honest.credential).get(), beat, &answer), INVALID_ARGUMENT);
  beat.mutable_holdings()->clear_cached();
  beat.mutable_holdings()->set_loaded("model\x1b[2J");
  EXPECT_GRPC_CODE(executors_->Heartbeat(As(honest.credential).get(), beat, &answer), INVALID_ARGUMENT);
  EXPECT_TRUE(Must(store_->GetExecutor(honest.id)).info.models.empty());
  EXPECT_TRUE(Must(store_->GetExecutor(honest.id)).info.model_loaded.empty());
  beat.mutable_holdings()->set_loaded("");
  beat.mutable_holdings()->add_cached("sha256:00");
  ASSERT_GRPC_OK(executors_->Heartbeat(As(honest.credential).get(), beat, &answer));
}

TEST_F(GrpcAttack, OnlyAdminsAdministerAndDrain) {
  Enrolled worker = Enrol("worker");
  for (const std::string& token : {search_submitter_, search_viewer_, worker.credential}) {
    v1::IssueTokenRequest issue;
    issue.set_role("admin");
    issue.set_principal("me");
    v1::IssuedToken issued;
    EXPECT_GRPC_CODE(admin_stub_->IssueToken(As(token).get(), issue, &issued), PERMISSION_DENIED);
    v1::CreateTeamRequest team;
    team.mutable_team()->set_name("mine");
    v1::Team created;
    EXPECT_GRPC_CODE(admin_stub_->CreateTeam(As(token).get(), team, &created), PERMISSION_DENIED);
    // Nobody but an admin raises a team's fair-share weight or lifts its quotas.
    v1::UpdateTeamRequest raise;
    raise.mutable_team()->set_name("search");
    raise.mutable_team()->set_weight(100);
    raise.mutable_team()->set_max_running_tasks(0);
    EXPECT_GRPC_CODE(admin_stub_->UpdateTeam(As(token).get(), raise, &created), PERMISSION_DENIED);
    v1::RevokeExecutorRequest revoke;
    revoke.set_executor_id(worker.id);
    v1::Executor executor;
    EXPECT_GRPC_CODE(admin_stub_->RevokeExecutor(As(token).get(), revoke, &executor), PERMISSION_DENIED);
    v1::DrainExecutorRequest drain;
    drain.set_executor_id(worker.id);
    EXPECT_GRPC_CODE(jobs_->DrainExecutor(As(token).get(), drain, &executor), PERMISSION_DENIED);
    v1::ListTokensResponse tokens;
    EXPECT_GRPC_CODE(admin_stub_->ListTokens(As(token).get(), v1::ListTokensRequest(), &tokens), PERMISSION_DENIED);
  }
  // Nothing changed: no new admin, no new team, the executor serves on.
  EXPECT_EQ(Must(store_->ListTokens({"", Role::kAdmin, "", true})).size(), 1u);
  EXPECT_EQ(Must(store_->ListTeams()).size(), 3u);  // default, search, ads
  for (const Team& t : Must(store_->ListTeams())) EXPECT_EQ(t.weight, 1) << t.name;
  Executor executor = Must(store_->GetExecutor(worker.id));
  EXPECT_EQ(executor.state, ExecutorState::kAvailable);
  EXPECT_FALSE(executor.drain_requested);
  // Who am I: any valid credential may ask, and learns only about itself.
  v1::TokenInfo me;
  ASSERT_GRPC_OK(admin_stub_->WhoAmI(As(search_viewer_).get(), v1::WhoAmIRequest(), &me));
  EXPECT_EQ(me.role(), "viewer");
  EXPECT_EQ(me.principal(), "bob");
}

TEST_F(GrpcAttack, OnlyAnAdminReleasesAQuarantinedExecutorNotItselfNorATeam) {
  Enrolled bad = Enrol("bad");
  Enrolled good = Enrol("good");
  v1::Job job = MustSubmit(search_submitter_, 2);
  Verification failed;
  failed.job_id = job.id();
  failed.custom_id = "r0";
  failed.producer_id = bad.id;
  failed.verifier_id = good.id;
  failed.reason = "token 3 is 9.1 nats below the most likely";
  ASSERT_EQ(Must(store_->RecordVerification(failed, absl::Now())).state, ExecutorState::kQuarantined);
  EXPECT_THAT(MustLease(bad, 1), IsEmpty());
  // The job's team sees the check in its status: one record re-scored, failed, and by whom.
  v1::GetJobRequest get;
  get.set_job_id(job.id());
  v1::Job status;
  ASSERT_GRPC_OK(jobs_->GetJob(As(search_viewer_).get(), get, &status));
  EXPECT_EQ(status.verification().checked(), 1);
  EXPECT_EQ(status.verification().failed(), 1);
  EXPECT_THAT(status.verification().verifiers(), ::testing::ElementsAre(good.id));
  v1::ReleaseExecutorRequest release;
  release.set_executor_id(bad.id);
  v1::Executor executor;
  // The quarantined executor itself, another executor, a team's submitter or viewer: refused.
  for (const std::string& token : {bad.credential, good.credential, search_submitter_, search_viewer_}) {
    EXPECT_GRPC_CODE(admin_stub_->ReleaseExecutor(As(token).get(), release, &executor), PERMISSION_DENIED);
  }
  EXPECT_GRPC_CODE(admin_stub_->ReleaseExecutor(As("").get(), release, &executor), UNAUTHENTICATED);
  Executor still = Must(store_->GetExecutor(bad.id));
  EXPECT_EQ(still.state, ExecutorState::kQuarantined);
  EXPECT_THAT(still.state_reason, HasSubstr("9.1 nats"));
  EXPECT_THAT(MustLease(bad, 1), IsEmpty());
  // An admin releases it; it leases again. Releasing one that is not quarantined is refused.
  ASSERT_GRPC_OK(admin_stub_->ReleaseExecutor(As(admin_).get(), release, &executor));
  EXPECT_EQ(executor.state(), "available");
  EXPECT_THAT(MustLease(bad, 1), Not(IsEmpty()));
  EXPECT_GRPC_CODE(admin_stub_->ReleaseExecutor(As(admin_).get(), release, &executor), FAILED_PRECONDITION);
  release.set_executor_id("exe-000000000000");
  EXPECT_GRPC_CODE(admin_stub_->ReleaseExecutor(As(admin_).get(), release, &executor), NOT_FOUND);
}

TEST_F(GrpcAttack, AnExecutorsCredentialReachesNoJobAndAnAdminsNoLease) {
  Enrolled worker = Enrol("worker");
  v1::ListJobsResponse jobs;
  EXPECT_GRPC_CODE(jobs_->ListJobs(As(worker.credential).get(), v1::ListJobsRequest(), &jobs), PERMISSION_DENIED);
  v1::Job job;
  EXPECT_GRPC_CODE(jobs_->SubmitJob(As(worker.credential).get(), Request(2), &job), PERMISSION_DENIED);
  MustSubmit(search_submitter_);
  v1::LeaseResponse leases;
  EXPECT_GRPC_CODE(executors_->Lease(As(admin_).get(), v1::LeaseRequest(), &leases), PERMISSION_DENIED);
  EXPECT_THAT(Must(store_->ListRunningTasks()), IsEmpty());
}

TEST_F(GrpcAttack, ATeamOverItsQuotaOrRateIsRefusedAndOthersAreNot) {
  CreateTeam("small", /*max_priority=*/10, /*max_active_jobs=*/1, /*requests_per_second=*/2);
  const std::string small = Issue(Role::kSubmitter, "small", "sam");
  MustSubmit(small);
  v1::Job job;
  EXPECT_GRPC_ERROR(jobs_->SubmitJob(As(small).get(), Request(2), &job), RESOURCE_EXHAUSTED, "max-active-jobs");
  // Its burst (twice its rate) is spent by now; more calls are refused...
  int refused = 0;
  std::string why;
  for (int i = 0; i < 10; ++i) {
    v1::ListJobsResponse listed;
    grpc::Status status = jobs_->ListJobs(As(small).get(), v1::ListJobsRequest(), &listed);
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused;
      why = status.error_message();
    }
  }
  EXPECT_GE(refused, 5);
  EXPECT_THAT(why, HasSubstr("--requests-per-second"));  // the refusal says what to change
  // ...and another team is not held back.
  for (int i = 0; i < 10; ++i) {
    v1::ListJobsResponse listed;
    ASSERT_GRPC_OK(jobs_->ListJobs(As(search_viewer_).get(), v1::ListJobsRequest(), &listed));
  }
  EXPECT_EQ(Must(store_->ListJobs({std::nullopt, "small", 100})).size(), 1u);
}

// A pool that requires confined runners (ServerOptions::require_confined_executors): an executor
// whose runner would fail open is leased nothing, told why, and the work waits for one that is.
class ConfinementAttack : public SecureServer {
 protected:
  void Start(bool required) {
    ServerOptions options = Options();
    options.require_confined_executors = required;
    StartServer(options);
    CreateTeam("search");
    submitter_ = Issue(Role::kSubmitter, "search", "alice");
  }
  grpc::Status LeaseAs(const Enrolled& executor, v1::LeaseResponse* reply) {
    v1::LeaseRequest request;
    request.set_max_tasks(8);
    return executors_->Lease(As(executor.credential).get(), request, reply);
  }
  std::string submitter_;
};

TEST_F(ConfinementAttack, AnUnconfinedExecutorIsLeasedNothingWhereConfinementIsRequired) {
  Start(/*required=*/true);
  v1::Job job = MustSubmit(submitter_, 4);  // two tasks
  // Seccomp only (no Landlock), the sandbox off, saying nothing (an older executor), or a word
  // the server does not know: each refused, with why.
  for (const auto& [name, confinement, why] :
       std::vector<std::tuple<std::string, std::string, std::string>>{{"no-landlock", "partial", "seccomp only"},
                                                                     {"sandbox-off", "none", "turned off"},
                                                                     {"older", "", "nothing"},
                                                                     {"boasting", "totally", "nothing"}}) {
    Enrolled executor = Enrol(name, confinement);
    v1::LeaseResponse reply;
    grpc::Status refused = LeaseAs(executor, &reply);
    EXPECT_GRPC_CODE(refused, FAILED_PRECONDITION);
    EXPECT_THAT(refused.error_message(), HasSubstr(why)) << name;
    EXPECT_EQ(reply.leases_size(), 0) << name;
  }
  EXPECT_THAT(Must(store_->ListRunningTasks()), IsEmpty());
  // A confined executor takes the work.
  Enrolled confined = Enrol("confined", "full");
  EXPECT_EQ(MustLease(confined, 8).size(), 2u);
  // Everyone sees how each executor is confined.
  v1::ListExecutorsResponse fleet;
  ASSERT_GRPC_OK(jobs_->ListExecutors(As(submitter_).get(), v1::ListExecutorsRequest(), &fleet));
  std::map<std::string, std::string> shown;
  for (const auto& e : fleet.executors()) shown[e.name()] = e.confinement();
  EXPECT_EQ(shown["no-landlock"], "partial");
  EXPECT_EQ(shown["sandbox-off"], "none");
  EXPECT_EQ(shown["older"], "");
  EXPECT_EQ(shown["boasting"], "");
  EXPECT_EQ(shown["confined"], "full");
}

TEST_F(ConfinementAttack, ARequirementHeardAfterARestartStillHolds) {
  // An executor registered with a server that did not require confinement; the pool restarts
  // requiring it: what the executor said is read from the store, and it is refused.
  Start(/*required=*/false);
  Enrolled partial = Enrol("no-landlock", "partial");
  server_->Shutdown();
  ServerOptions options = Options();
  options.require_confined_executors = true;
  StartServer(options);
  MustSubmit(submitter_, 2);
  v1::LeaseResponse reply;
  EXPECT_GRPC_CODE(LeaseAs(partial, &reply), FAILED_PRECONDITION);
  EXPECT_EQ(reply.leases_size(), 0);
}

TEST_F(ConfinementAttack, WithoutTheRequirementEveryExecutorIsLeasedWork) {
  Start(/*required=*/false);
  MustSubmit(submitter_, 2);
  Enrolled partial = Enrol("no-landlock", "partial");
  EXPECT_EQ(MustLease(partial, 8).size(), 1u);
}

}  // namespace
}  // namespace minions::testing
