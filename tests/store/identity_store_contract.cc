// The IdentityStore half of the store contract (see identity_store.h): teams, credentials,
// enrolment and revocation. Same fixture and instantiations as the MetadataStore contract, so
// every backend runs these stories too.

#include <set>

#include "identity_store_contract.h"

namespace minions {
namespace {

// Instantiated wherever MetadataStoreContract is (same factories).
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(IdentityStoreContract);

TEST_P(IdentityStoreContract, TeamsAreCreatedListedAndUpdated) {
  // Every store starts with the team "default".
  ASSERT_OK_AND_ASSIGN(std::vector<Team> teams, store_->ListTeams());
  ASSERT_THAT(teams, SizeIs(1));
  EXPECT_EQ(teams[0].name, kDefaultTeam);

  ASSERT_OK_AND_ASSIGN(Team search, store_->CreateTeam(NewTeam("search", 3)));
  EXPECT_EQ(search.max_active_jobs, 3);
  absl::StatusOr<Team> again = store_->CreateTeam(NewTeam("search"));
  EXPECT_CODE(again, kAlreadyExists);
  EXPECT_CODE(store_->CreateTeam(NewTeam("Bad Name")), kInvalidArgument);
  EXPECT_CODE(store_->CreateTeam(NewTeam("../x")), kInvalidArgument);

  EXPECT_THAT(search.runners, IsEmpty());
  EXPECT_FALSE(search.require_confined);
  Team changed = NewTeam("search", 7);
  changed.max_priority = 2;
  changed.runners = {"llama", "embed"};  // its runners and confinement (migration 22) are kept
  changed.require_confined = true;
  changed.created_at = now_ + absl::Hours(1);  // not changeable
  ASSERT_OK_AND_ASSIGN(Team updated, store_->UpdateTeam(changed));
  EXPECT_EQ(updated.max_active_jobs, 7);
  EXPECT_EQ(updated.max_priority, 2);
  EXPECT_EQ(updated.runners, (std::vector<std::string>{"llama", "embed"}));
  EXPECT_TRUE(updated.require_confined);
  EXPECT_EQ(updated.created_at, now_);
  ASSERT_OK_AND_ASSIGN(Team read, store_->GetTeam("search"));
  EXPECT_EQ(read, updated);
  EXPECT_CODE(store_->UpdateTeam(NewTeam("nobody")), kNotFound);
  EXPECT_CODE(store_->GetTeam("nobody"), kNotFound);
  ASSERT_OK_AND_ASSIGN(teams, store_->ListTeams());
  EXPECT_THAT(teams, SizeIs(2));
}

// 40.5b: a team's bytes of files and results are counted by the store; a charge that would pass
// the team's limit is refused whole, naming the verb that raises it; another team is untouched;
// an admin's update keeps the counts.
TEST_P(IdentityStoreContract, ATeamsBytesAreChargedWithinItsLimitAndAnUpdateKeepsTheCount) {
  Team small = NewTeam("small");
  small.max_file_bytes = 100;
  small.max_model_bytes = 300;
  small.max_result_bytes = 50;
  ASSERT_OK_AND_ASSIGN(Team created, store_->CreateTeam(small));
  EXPECT_EQ(created.max_file_bytes, 100);
  ASSERT_OK_AND_ASSIGN(Team other, store_->CreateTeam(NewTeam("other")));
  EXPECT_EQ(other.max_file_bytes, 0);  // none

  ASSERT_OK_AND_ASSIGN(Team charged, store_->ChargeTeamBytes("small", TeamBytes::kFiles, 60, /*enforce=*/true));
  EXPECT_EQ(charged.file_bytes, 60);
  absl::StatusOr<Team> over = store_->ChargeTeamBytes("small", TeamBytes::kFiles, 41, /*enforce=*/true);
  EXPECT_CODE(over, kResourceExhausted);
  EXPECT_THAT(Message(over.status()), HasSubstr("minions admin team set small --max-file-bytes"));
  ASSERT_OK_AND_ASSIGN(charged, store_->ChargeTeamBytes("small", TeamBytes::kFiles, 40, /*enforce=*/true));
  EXPECT_EQ(charged.file_bytes, 100);  // exactly the limit passes; the refused 41 left nothing
  EXPECT_CODE(store_->ChargeTeamBytes("small", TeamBytes::kFiles, 1, /*enforce=*/true), kResourceExhausted);
  // Results are counted past the limit when not enforced (finished work is kept).
  ASSERT_OK_AND_ASSIGN(charged, store_->ChargeTeamBytes("small", TeamBytes::kResults, 70, /*enforce=*/false));
  EXPECT_EQ(charged.result_bytes, 70);
  absl::StatusOr<Team> results = store_->ChargeTeamBytes("small", TeamBytes::kResults, 1, /*enforce=*/true);
  EXPECT_CODE(results, kResourceExhausted);
  EXPECT_THAT(Message(results.status()), HasSubstr("--max-result-bytes"));
  // Another team (no limit) is served; an unknown one is NotFound.
  ASSERT_OK_AND_ASSIGN(Team others, store_->ChargeTeamBytes("other", TeamBytes::kFiles, int64_t{1} << 40, true));
  EXPECT_EQ(others.file_bytes, int64_t{1} << 40);
  EXPECT_CODE(store_->ChargeTeamBytes("nobody", TeamBytes::kFiles, 1, true), kNotFound);

  // An admin's update changes the limits, never the counts; giving back never goes below 0.
  Team raised = created;
  raised.max_file_bytes = 1000;
  raised.file_bytes = 0;
  raised.result_bytes = 0;
  ASSERT_OK_AND_ASSIGN(Team updated, store_->UpdateTeam(raised));
  EXPECT_EQ(updated.file_bytes, 100);
  EXPECT_EQ(updated.result_bytes, 70);
  ASSERT_OK_AND_ASSIGN(Team read, store_->GetTeam("small"));
  EXPECT_EQ(read.max_file_bytes, 1000);
  EXPECT_EQ(read.max_model_bytes, 300);
  EXPECT_EQ(read.file_bytes, 100);
  ASSERT_OK(store_->ChargeTeamBytes("small", TeamBytes::kFiles, 1, /*enforce=*/true).status());
  ASSERT_OK_AND_ASSIGN(charged, store_->ChargeTeamBytes("small", TeamBytes::kFiles, -500, /*enforce=*/true));
  EXPECT_EQ(charged.file_bytes, 0);
}

TEST_P(IdentityStoreContract, CredentialsAreFoundByTheirHashAndRevokedOnce) {
  ASSERT_OK(store_->CreateTeam(NewTeam("search")));
  TokenRecord alice = Token("tok-alice0000001", Role::kSubmitter, "search", "alice", 1);
  ASSERT_OK(store_->AddToken(alice));
  ASSERT_OK(store_->AddToken(Token("tok-viewer000001", Role::kViewer, "search", "bob", 2)));
  ASSERT_OK(store_->AddToken(Token("tok-admin0000001", Role::kAdmin, "", "root", 3)));

  // Found by hash and by id, exactly as stored.
  ASSERT_OK_AND_ASSIGN(TokenRecord found, store_->FindToken(FakeHash(1)));
  EXPECT_EQ(found, alice);
  ASSERT_OK_AND_ASSIGN(TokenRecord by_id, store_->GetToken("tok-alice0000001"));
  EXPECT_EQ(by_id, alice);
  absl::StatusOr<TokenRecord> unknown = store_->FindToken(FakeHash(99));
  EXPECT_CODE(unknown, kNotFound);
  EXPECT_THAT(Message(unknown.status()), ::testing::Not(HasSubstr(FakeHash(99))));

  // Refused: an unknown team, a team role without a team, a clash of id or of hash.
  EXPECT_CODE(store_->AddToken(Token("tok-x00000000001", Role::kViewer, "nobody", "carol", 4)), kNotFound);
  EXPECT_CODE(store_->AddToken(Token("tok-x00000000002", Role::kViewer, "", "carol", 5)), kInvalidArgument);
  EXPECT_CODE(store_->AddToken(Token("tok-x00000000003", Role::kAdmin, "search", "carol", 6)), kInvalidArgument);
  EXPECT_CODE(store_->AddToken(Token("tok-alice0000001", Role::kViewer, "search", "carol", 7)), kAlreadyExists);
  EXPECT_CODE(store_->AddToken(Token("tok-x00000000004", Role::kViewer, "search", "carol", 1)), kAlreadyExists);

  // Listed newest first, by team, role and principal.
  ASSERT_OK_AND_ASSIGN(std::vector<TokenRecord> listed, store_->ListTokens({}));
  EXPECT_THAT(listed, SizeIs(3));
  ASSERT_OK_AND_ASSIGN(listed, store_->ListTokens({"search", std::nullopt, "", false}));
  EXPECT_THAT(listed, SizeIs(2));
  ASSERT_OK_AND_ASSIGN(listed, store_->ListTokens({"", Role::kAdmin, "", false}));
  ASSERT_THAT(listed, SizeIs(1));
  EXPECT_EQ(listed[0].principal, "root");
  ASSERT_OK_AND_ASSIGN(listed, store_->ListTokens({"", std::nullopt, "bob", false}));
  ASSERT_THAT(listed, SizeIs(1));
  EXPECT_EQ(listed[0].role, Role::kViewer);

  // Last use only moves forward.
  ASSERT_OK(store_->RecordTokenUse({"tok-alice0000001", "tok-unknown00001"}, now_ + absl::Minutes(2)));
  ASSERT_OK(store_->RecordTokenUse({"tok-alice0000001"}, now_ + absl::Minutes(1)));
  ASSERT_OK_AND_ASSIGN(found, store_->GetToken("tok-alice0000001"));
  EXPECT_EQ(found.last_used_at, now_ + absl::Minutes(2));

  // Revoked once: the first time stays; revoked tokens are listed only when asked for.
  Advance(absl::Minutes(5));
  ASSERT_OK_AND_ASSIGN(TokenRecord revoked, store_->RevokeToken("tok-alice0000001", now_));
  EXPECT_EQ(revoked.revoked_at, now_);
  const absl::Time first_revocation = now_;
  Advance(absl::Minutes(5));
  ASSERT_OK_AND_ASSIGN(revoked, store_->RevokeToken("tok-alice0000001", now_));
  EXPECT_EQ(revoked.revoked_at, first_revocation);
  ASSERT_OK_AND_ASSIGN(found, store_->FindToken(FakeHash(1)));
  EXPECT_CODE(CheckUsable(found, now_), kUnauthenticated);
  ASSERT_OK_AND_ASSIGN(listed, store_->ListTokens({"search", std::nullopt, "", false}));
  EXPECT_THAT(listed, SizeIs(1));
  ASSERT_OK_AND_ASSIGN(listed, store_->ListTokens({"search", std::nullopt, "", true}));
  EXPECT_THAT(listed, SizeIs(2));
  EXPECT_CODE(store_->RevokeToken("tok-unknown00001", now_), kNotFound);
}

TEST_P(IdentityStoreContract, RevocationsAreListedFromATimeOn) {
  ASSERT_OK(store_->CreateTeam(NewTeam("search")));
  ASSERT_OK(store_->AddToken(Token("tok-early0000001", Role::kViewer, "search", "a", 1)));
  ASSERT_OK(store_->AddToken(Token("tok-late00000001", Role::kViewer, "search", "b", 2)));
  ASSERT_OK(store_->AddToken(Token("tok-kept00000001", Role::kViewer, "search", "c", 3)));
  AddJoinToken();
  ASSERT_OK_AND_ASSIGN(Executor executor, Enrol(10, 11, "laptop"));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> revoked, store_->RevokedTokensSince(absl::InfinitePast()));
  EXPECT_THAT(revoked, IsEmpty());

  ASSERT_OK(store_->RevokeToken("tok-early0000001", now_));
  Advance(absl::Seconds(10));
  const absl::Time later = now_;
  ASSERT_OK(store_->RevokeToken("tok-late00000001", now_));
  ASSERT_OK(store_->RevokeExecutor(executor.id, now_));  // its credential with it
  ASSERT_OK_AND_ASSIGN(revoked, store_->RevokedTokensSince(later));
  EXPECT_THAT(revoked, UnorderedElementsAre("tok-late00000001", "tok-cred11"));
  ASSERT_OK_AND_ASSIGN(revoked, store_->RevokedTokensSince(absl::InfinitePast()));
  EXPECT_THAT(revoked, UnorderedElementsAre("tok-early0000001", "tok-late00000001", "tok-cred11"));
  ASSERT_OK_AND_ASSIGN(revoked, store_->RevokedTokensSince(later + absl::Microseconds(1)));
  EXPECT_THAT(revoked, IsEmpty());
}

TEST_P(IdentityStoreContract, AJoinTokenIsTradedForExecutorsUntilItsUsesRunOut) {
  const auto [first, second] = EnrolTwo("mac-1", "mac-2");  // the join token has 2 uses
  // The server names executors: fresh ids, each bound to its own credential.
  EXPECT_THAT(first.id, ::testing::MatchesRegex("exe-[0-9a-f]{12}"));
  EXPECT_NE(first.id, second.id);
  EXPECT_EQ(first.info.name, "mac-1");
  EXPECT_EQ(first.state, ExecutorState::kAvailable);
  ASSERT_OK_AND_ASSIGN(TokenRecord credential, store_->FindToken(FakeHash(11)));
  EXPECT_EQ(credential.role, Role::kExecutor);
  EXPECT_EQ(ExecutorIdOf(credential), first.id);
  EXPECT_EQ(credential.created_by, "tok-join00000001");
  ASSERT_OK_AND_ASSIGN(TokenRecord join, store_->GetToken("tok-join00000001"));
  EXPECT_EQ(join.uses_left, 0);
  EXPECT_EQ(join.last_used_at, now_);

  // Used up: refused, and nothing else changed (no executor, no credential).
  absl::StatusOr<Executor> third = Enrol(10, 13, "mac-3");
  EXPECT_CODE(third, kUnauthenticated);
  EXPECT_THAT(Message(third.status()), HasSubstr("used up"));
  EXPECT_CODE(store_->FindToken(FakeHash(13)), kNotFound);
  ASSERT_OK_AND_ASSIGN(std::vector<Executor> executors, store_->ListExecutors());
  EXPECT_THAT(executors, SizeIs(2));

  // An unknown join token, an expired one, a revoked one, and a token of another kind: refused.
  EXPECT_CODE(Enrol(77, 14, "x"), kUnauthenticated);
  TokenRecord expiring = Token("tok-join00000002", Role::kJoin, "", "laptops", 20);
  expiring.expires_at = now_ + absl::Hours(1);
  ASSERT_OK(store_->AddToken(expiring));
  Advance(absl::Hours(1));
  absl::StatusOr<Executor> late = Enrol(20, 15, "x");
  EXPECT_CODE(late, kUnauthenticated);
  EXPECT_THAT(Message(late.status()), HasSubstr("expired"));
  ASSERT_OK(store_->AddToken(Token("tok-join00000003", Role::kJoin, "", "laptops", 30)));
  ASSERT_OK(store_->RevokeToken("tok-join00000003", now_));
  EXPECT_CODE(Enrol(30, 16, "x"), kUnauthenticated);
  ASSERT_OK(store_->AddToken(Token("tok-admin0000001", Role::kAdmin, "", "root", 40)));
  EXPECT_CODE(Enrol(40, 17, "x"), kUnauthenticated);
  ASSERT_OK_AND_ASSIGN(executors, store_->ListExecutors());
  EXPECT_THAT(executors, SizeIs(2));
  for (int seed : {14, 15, 16, 17}) EXPECT_CODE(store_->FindToken(FakeHash(seed)), kNotFound) << seed;
}

TEST_P(IdentityStoreContract, RevokingAnExecutorHandsItsTasksBackAndCutsItOffForGood) {
  const auto [bad, good] = EnrolTwo("bad", "good");
  const std::string job_id = Submit(Spec(), 3);
  std::vector<Lease> bad_leases = LeaseExactly(bad.id, 2);
  std::vector<Lease> good_leases = LeaseExactly(good.id, 1);
  // The bad executor commits a checkpoint of task 0 (records [0, 4)) before it is caught.
  LeaseProgress progress = Progress(bad_leases[0], 4);
  progress.chunks.push_back({bad_leases[0].task.attempt, 0, 0, 4, 0});
  ASSERT_OK(store_->Heartbeat(bad.id, ExecutorState::kBusy, "", {progress}, kTtl, now_));

  Advance(absl::Seconds(1));
  ASSERT_OK_AND_ASSIGN(Executor revoked, store_->RevokeExecutor(bad.id, now_));
  EXPECT_EQ(revoked.state, ExecutorState::kRevoked);
  // Its tasks are pending again at once, not counted as failures; the checkpoint stays.
  for (const Lease& lease : bad_leases) {
    Task task = GetTask(job_id, lease.task.index);
    EXPECT_EQ(task.state, TaskState::kPending) << task.index;
    EXPECT_EQ(task.failures, 0);
  }
  EXPECT_EQ(CommittedRecords(GetTask(job_id, bad_leases[0].task.index)), 4);
  // It held two attempts for a second, one running, one queued: a second charged to the job
  // (the good one's still runs).
  EXPECT_EQ(GetJob(job_id).device_time, absl::Seconds(1));
  // Its credential is revoked.
  ASSERT_OK_AND_ASSIGN(TokenRecord credential, store_->FindToken(FakeHash(11)));
  EXPECT_EQ(credential.revoked_at, now_);
  // The other executor's lease and credential are untouched.
  Task good_task = GetTask(job_id, good_leases[0].task.index);
  EXPECT_EQ(good_task.state, TaskState::kRunning);
  EXPECT_EQ(good_task.executor_id, good.id);
  ASSERT_OK_AND_ASSIGN(TokenRecord good_credential, store_->FindToken(FakeHash(12)));
  EXPECT_FALSE(good_credential.revoked_at.has_value());

  // Whatever it tries next, it stays cut off: its reports are refused, a heartbeat renews
  // nothing and does not revive it, it leases nothing, registering again changes nothing, and
  // the watchdog does not count it as lost.
  EXPECT_CODE(store_->CompleteTask(bad.id, job_id, bad_leases[1].task.index, bad_leases[1].task.attempt, 10, 0, now_),
              kFailedPrecondition);
  ASSERT_OK_AND_ASSIGN(HeartbeatReply reply,
                       store_->Heartbeat(bad.id, ExecutorState::kAvailable, "", {Progress(bad_leases[1], 5)}, kTtl, now_));
  EXPECT_THAT(reply.renewed, IsEmpty());
  EXPECT_THAT(reply.cancel, SizeIs(1));
  EXPECT_EQ(GetExecutor(bad.id).state, ExecutorState::kRevoked);
  EXPECT_THAT(LeaseUpTo(bad.id, 3), IsEmpty());
  ASSERT_OK_AND_ASSIGN(Executor registered, store_->RegisterExecutor(bad.id, Info("bad"), now_));
  EXPECT_EQ(registered.state, ExecutorState::kRevoked);
  EXPECT_THAT(LeaseUpTo(bad.id, 3), IsEmpty());
  Advance(absl::Hours(1));
  ASSERT_OK_AND_ASSIGN(std::vector<Executor> lost, store_->MarkLostExecutors(now_ - absl::Minutes(1), now_));
  for (const Executor& e : lost) EXPECT_NE(e.id, bad.id);
  EXPECT_EQ(GetExecutor(bad.id).state, ExecutorState::kRevoked);

  // The handed-back tasks go to the good executor, resuming after the checkpoint.
  ASSERT_OK(store_->Heartbeat(good.id, ExecutorState::kBusy, "", {Progress(good_leases[0], 1)}, kTtl, now_));
  std::vector<Lease> taken = LeaseExactly(good.id, 2);
  for (const Lease& lease : taken) EXPECT_EQ(lease.task.executor_id, good.id);

  // Idempotent; an unknown executor is NotFound.
  ASSERT_OK_AND_ASSIGN(revoked, store_->RevokeExecutor(bad.id, now_));
  EXPECT_EQ(revoked.state, ExecutorState::kRevoked);
  EXPECT_EQ(GetJob(job_id).device_time, absl::Seconds(1)) << "a second revocation charges nothing more";
  EXPECT_CODE(store_->RevokeExecutor("exe-000000000000", now_), kNotFound);
}

// 40.3: where approval is required, an enrolled executor is pending: it leases nothing (the
// refusal says why), and nothing it does (registering, heartbeats, silence) makes it available;
// only ApproveExecutor does, once.
TEST_P(IdentityStoreContract, APendingExecutorLeasesNothingUntilApproved) {
  AddJoinToken();
  TokenRecord credential = Token("tok-cred11", Role::kExecutor, "", "", 11);
  ASSERT_OK_AND_ASSIGN(Executor pending,
                       store_->EnrolExecutor(FakeHash(10), credential, Info("stranger"), now_, /*await_approval=*/true));
  EXPECT_EQ(pending.state, ExecutorState::kPending);
  const std::string job_id = Submit(Spec(), 2);
  EXPECT_CODE(store_->LeaseTasks(pending.id, 2, kTtl, now_), kPermissionDenied);
  ASSERT_OK_AND_ASSIGN(Executor registered, store_->RegisterExecutor(pending.id, Info("stranger"), now_));
  EXPECT_EQ(registered.state, ExecutorState::kPending);
  ASSERT_OK(store_->Heartbeat(pending.id, ExecutorState::kAvailable, "", {}, kTtl, now_));
  EXPECT_EQ(GetExecutor(pending.id).state, ExecutorState::kPending);
  Advance(absl::Hours(1));
  ASSERT_OK_AND_ASSIGN(std::vector<Executor> lost, store_->MarkLostExecutors(now_ - absl::Minutes(1), now_));
  for (const Executor& e : lost) EXPECT_NE(e.id, pending.id);
  EXPECT_EQ(GetExecutor(pending.id).state, ExecutorState::kPending);
  EXPECT_EQ(GetTask(job_id, 0).state, TaskState::kPending);

  ASSERT_OK_AND_ASSIGN(Executor approved, store_->ApproveExecutor(pending.id, now_));
  EXPECT_EQ(approved.state, ExecutorState::kAvailable);
  EXPECT_THAT(LeaseUpTo(pending.id, 2), SizeIs(2));
  EXPECT_CODE(store_->ApproveExecutor(pending.id, now_), kFailedPrecondition);
  EXPECT_CODE(store_->ApproveExecutor("exe-000000000000", now_), kNotFound);
  // An executor enrolled without approval is available at once and has nothing to approve.
  ASSERT_OK_AND_ASSIGN(Executor trusted, Enrol(10, 12, "trusted"));
  EXPECT_EQ(trusted.state, ExecutorState::kAvailable);
  EXPECT_CODE(store_->ApproveExecutor(trusted.id, now_), kFailedPrecondition);
}

// 40.3: an executor's usable credential is exchanged for a new one of the same executor and
// scopes, in one transaction; the old one then expires at the grace's end at the latest.
TEST_P(IdentityStoreContract, AnExecutorCredentialIsExchangedOnlyWhileUsable) {
  AddJoinToken();
  ASSERT_OK_AND_ASSIGN(Executor executor, Enrol(10, 11, "mac-1"));
  ASSERT_OK_AND_ASSIGN(TokenRecord old, store_->FindToken(FakeHash(11)));
  TokenRecord fresh = Token("tok-fresh000001", Role::kExecutor, "", executor.id, 12);
  fresh.expires_at = now_ + absl::Hours(24);
  ASSERT_OK(store_->RotateCredential(old.id, fresh, now_, now_ + absl::Minutes(10)));
  EXPECT_EQ(fresh.principal, executor.id);
  EXPECT_EQ(fresh.scopes, old.scopes);
  EXPECT_EQ(fresh.created_by, old.id);
  ASSERT_OK_AND_ASSIGN(TokenRecord stored, store_->FindToken(FakeHash(12)));
  EXPECT_EQ(stored, fresh);
  ASSERT_OK_AND_ASSIGN(TokenRecord ended, store_->GetToken(old.id));
  EXPECT_EQ(ended.expires_at, now_ + absl::Minutes(10));
  EXPECT_FALSE(ended.revoked_at.has_value());

  // Refused, storing nothing: another role's token, another executor's name, an expired one.
  ASSERT_OK(store_->AddToken(Token("tok-admin000001", Role::kAdmin, "", "ops", 13)));
  TokenRecord more = Token("tok-fresh000002", Role::kExecutor, "", executor.id, 14);
  EXPECT_CODE(store_->RotateCredential("tok-admin000001", more, now_, now_), kFailedPrecondition);
  more.principal = "exe-000000000000";
  EXPECT_CODE(store_->RotateCredential(stored.id, more, now_, now_), kNotFound);
  more.principal = executor.id;
  Advance(absl::Minutes(10));
  EXPECT_CODE(store_->RotateCredential(old.id, more, now_, now_), kUnauthenticated);
  EXPECT_CODE(store_->FindToken(FakeHash(14)), kNotFound);
  // A revoked executor's credential, though not expired, exchanges nothing.
  ASSERT_OK(store_->RevokeExecutor(executor.id, now_).status());
  EXPECT_CODE(store_->RotateCredential(stored.id, more, now_, now_), kUnauthenticated);
  EXPECT_CODE(store_->FindToken(FakeHash(14)), kNotFound);
}

TEST_P(IdentityStoreContract, RevokingAStragglersExecutorDropsItsShadowAndKeepsTheBackup) {
  const auto [slow, fast] = EnrolTwo("slow", "fast");
  const std::string job_id = Submit(Spec(), 1);
  std::vector<Lease> first = LeaseExactly(slow.id, 1);
  Advance(absl::Seconds(20));
  ASSERT_OK(store_->RequestBackup(job_id, 0, first[0].task.attempt, now_));
  std::vector<Lease> backup = LeaseExactly(fast.id, 1);

  EXPECT_EQ(GetJob(job_id).device_time, absl::Seconds(20)) << "the straggler's time up to the backup request";
  Advance(absl::Seconds(5));
  ASSERT_OK(store_->RevokeExecutor(slow.id, now_));
  // A dropped shadow adds nothing after the request; the backup runs on.
  EXPECT_EQ(GetJob(job_id).device_time, absl::Seconds(20));
  Task task = GetTask(job_id, 0);
  EXPECT_FALSE(task.shadow.has_value());
  EXPECT_EQ(task.state, TaskState::kRunning);
  EXPECT_EQ(task.executor_id, fast.id);
  EXPECT_EQ(task.attempt, backup[0].task.attempt);
  // The shadow's completion no longer counts.
  EXPECT_CODE(store_->CompleteTask(slow.id, job_id, 0, first[0].task.attempt, 10, 0, now_), kFailedPrecondition);
  ASSERT_OK(store_->CompleteTask(fast.id, job_id, 0, backup[0].task.attempt, 10, 0, now_));
}

TEST_P(IdentityStoreContract, ATeamsJobsThatHaveNotEndedAreCappedByItsQuota) {
  ASSERT_OK(store_->CreateTeam(NewTeam("search", 2)));
  const std::string one = Submit(Spec(), 1);
  const std::string two = Submit(Spec(), 1);
  absl::StatusOr<Job> three = store_->CreateJob(Spec(), now_);
  EXPECT_CODE(three, kResourceExhausted);
  EXPECT_THAT(Message(three.status()), HasSubstr("--max-active-jobs"));
  // Refused means refused: no job was created.
  ASSERT_OK_AND_ASSIGN(std::vector<Job> jobs, store_->ListJobs({std::nullopt, "search", 100}));
  EXPECT_THAT(jobs, SizeIs(2));
  // Other teams are not affected; an ended job frees its place.
  JobSpec other = Spec();
  other.team = kDefaultTeam;
  ASSERT_OK(store_->CreateJob(other, now_));
  ASSERT_OK(store_->CancelJob(one, now_));
  ASSERT_OK(store_->CreateJob(Spec(), now_));
  EXPECT_CODE(store_->CreateJob(Spec(), now_), kResourceExhausted);
  (void)two;
}

}  // namespace
}  // namespace minions
