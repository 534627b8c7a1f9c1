// SpotCheckContract (spot_check_contract.h): every backend runs these with spot checks on.

#include "spot_check_contract.h"

#include <map>
#include <utility>

#include "model/verification.h"
#include "testing/even_tasks.h"

namespace minions {
namespace {

RecordVerdict Passed(int64_t record, const std::string& custom_id) {
  return RecordVerdict{record, custom_id, true, true, ""};
}
RecordVerdict Failed(int64_t record, const std::string& custom_id, const std::string& reason) {
  return RecordVerdict{record, custom_id, true, false, reason};
}

// The verdicts of a task: each record passed, named r<record>.
std::vector<RecordVerdict> AllPassed(const VerificationTask& task) {
  std::vector<RecordVerdict> verdicts;
  for (int64_t r : task.records) verdicts.push_back(Passed(r, absl::StrCat("r", r)));
  return verdicts;
}

TEST_P(SpotCheckContract, ChunksThatCommitGetVerificationTasks) {
  const std::string job_id = Submit(Spec(), 1);
  const std::string producer = Register("producer");
  std::vector<Lease> held = LeaseExactly(producer, 1);
  EXPECT_EQ(Must(store_->CountOpenVerifications(job_id), "CountOpenVerifications"), 0);
  // A heartbeat commits a chunk: a new executor's records are all drawn (at most 3 a task).
  LeaseProgress beat = Progress(held[0], 4);
  beat.chunks = {Chunk{1, 0, 0, 4, 0}};
  ASSERT_OK(store_->Heartbeat(producer, ExecutorState::kBusy, "", {beat}, kTtl, now_).status());
  EXPECT_EQ(Must(store_->CountOpenVerifications(job_id), "CountOpenVerifications"), 1);
  // The same chunk reported again draws nothing more; completing commits the rest as a chunk.
  ASSERT_OK(store_->Heartbeat(producer, ExecutorState::kBusy, "", {beat}, kTtl, now_).status());
  LeaseProgress done = Progress(held[0], kRecordsPerTask);
  done.chunks = {Chunk{1, 0, 0, 4, 0}, Chunk{1, 1, 4, 10, 0}};
  ASSERT_OK_AND_ASSIGN(auto outcomes, store_->CompleteTasks(producer, {done}, now_));
  ASSERT_OK(outcomes[0]);
  EXPECT_EQ(Must(store_->CountOpenVerifications(job_id), "CountOpenVerifications"), 2);
  EXPECT_THAT(GetTask(job_id, 0).chunks, ElementsAre(Chunk{1, 0, 0, 4, 0, producer}, Chunk{1, 1, 4, 10, 0, producer}));

  ASSERT_OK_AND_ASSIGN(VerificationTask second, store_->GetVerificationTask(VerificationTask{job_id, 0, 1, 1}));
  EXPECT_EQ(second.producer_id, producer);
  ASSERT_THAT(second.records, SizeIs(3));  // 3 of records 4..9, ascending
  for (size_t i = 0; i < second.records.size(); ++i) {
    EXPECT_GE(second.records[i], 4);
    EXPECT_LT(second.records[i], 10);
    if (i > 0) EXPECT_LT(second.records[i - 1], second.records[i]);
  }
  EXPECT_EQ(second.verifier_id, "");
  EXPECT_EQ(second.created_at, now_);
  EXPECT_CODE(store_->GetVerificationTask(VerificationTask{job_id, 0, 1, 7}).status(), kNotFound);
  EXPECT_CODE(store_->CountOpenVerifications("job-000000000000").status(), kNotFound);
}

TEST_P(SpotCheckContract, AVerificationTaskIsLeasedOnlyToAnotherExecutorAtATime) {
  const std::string job_id = Submit(Spec(), 1);
  const auto [producer, verifier, other] = RegisterAll({"producer", "verifier", "other"});
  std::vector<Lease> held = LeaseExactly(producer, 1);
  LeaseProgress done = Progress(held[0], kRecordsPerTask);
  ASSERT_OK_AND_ASSIGN(auto outcomes, store_->CompleteTasks(producer, {done}, now_));
  ASSERT_OK(outcomes[0]);
  // The producer never checks its own answers.
  EXPECT_THAT(Must(store_->LeaseVerifications(producer, 4, kTtl, now_), "LeaseVerifications"), IsEmpty());
  std::vector<VerificationTask> leased = Must(store_->LeaseVerifications(verifier, 4, kTtl, now_), "LeaseVerifications");
  ASSERT_THAT(leased, SizeIs(1));
  EXPECT_EQ(leased[0].verifier_id, verifier);
  EXPECT_EQ(leased[0].lease_expires_at, now_ + kTtl);
  EXPECT_EQ(leased[0].producer_id, producer);
  // Held: nobody else gets it until its lease expires.
  EXPECT_THAT(Must(store_->LeaseVerifications(other, 4, kTtl, now_), "LeaseVerifications"), IsEmpty());
  Advance(kTtl);
  std::vector<VerificationTask> again = Must(store_->LeaseVerifications(other, 4, kTtl, now_), "LeaseVerifications");
  ASSERT_THAT(again, SizeIs(1));
  EXPECT_EQ(again[0].verifier_id, other);
  EXPECT_EQ(again[0].records, leased[0].records);
  EXPECT_CODE(store_->LeaseVerifications("exe-000000000000", 1, kTtl, now_).status(), kNotFound);
}

// A verifier of another chip is the better witness: offered the checks of producers unlike it
// first, though they are younger.
TEST_P(SpotCheckContract, AVerifierIsOfferedTheChecksOfAProducerUnlikeItFirst) {
  const std::string job_id = Submit(Spec(), 2);
  auto register_on = [&](const std::string& name, const std::string& chip) {
    ExecutorInfo info;
    info.name = name;
    info.os = "linux";
    info.chip = chip;
    info.memory_bytes = 8 * kGiB;
    info.runners = {"llama"};
    info.max_tasks = 4;
    return Must(store_->RegisterExecutor("", info, now_), "RegisterExecutor").id;
  };
  const std::string alike = register_on("alike", "Xeon");
  const std::string unlike = register_on("unlike", "EPYC");
  const std::string verifier = register_on("verifier", "Xeon");
  std::vector<Lease> first = LeaseExactly(alike, 1);
  ASSERT_OK_AND_ASSIGN(auto done, store_->CompleteTasks(alike, {Progress(first[0], kRecordsPerTask)}, now_));
  ASSERT_OK(done[0]);
  Advance(absl::Seconds(1));
  std::vector<Lease> second = LeaseExactly(unlike, 1);
  ASSERT_OK_AND_ASSIGN(done, store_->CompleteTasks(unlike, {Progress(second[0], kRecordsPerTask)}, now_));
  ASSERT_OK(done[0]);

  std::vector<VerificationTask> leased = Must(store_->LeaseVerifications(verifier, 1, kTtl, now_), "LeaseVerifications");
  ASSERT_THAT(leased, SizeIs(1));
  EXPECT_EQ(leased[0].producer_id, unlike);
  // The alike producer's check is not starved: it is the next one.
  leased = Must(store_->LeaseVerifications(verifier, 1, kTtl, now_), "LeaseVerifications");
  ASSERT_THAT(leased, SizeIs(1));
  EXPECT_EQ(leased[0].producer_id, alike);
}

// Another owner's executor is the better witness still: a verifier is offered the checks of
// another owner's producer (though of its own chip, and younger) before those of its own owner's.
TEST_P(SpotCheckContract, AVerifierIsOfferedTheChecksOfAnotherOwnerFirstThenOfAnotherChip) {
  Submit(Spec(), 3);
  const std::string verifier = EnrolAs("alice", "verifier", "Xeon");
  const std::string own_unlike = EnrolAs("alice", "own-unlike", "EPYC");
  const std::string other_alike = EnrolAs("bob", "other-alike", "Xeon");
  const std::string own_alike = EnrolAs("alice", "own-alike", "Xeon");
  for (const std::string& producer : {own_alike, own_unlike, other_alike}) {
    std::vector<Lease> held = LeaseUpTo(producer, 1);
    ASSERT_THAT(held, SizeIs(1));
    ASSERT_OK(Must(store_->CompleteTasks(producer, {Progress(held[0], kRecordsPerTask)}, now_), "Complete")[0]);
    Advance(absl::Seconds(1));
  }
  for (const std::string& expected : {other_alike, own_unlike, own_alike}) {
    std::vector<VerificationTask> leased = Must(store_->LeaseVerifications(verifier, 1, kTtl, now_), "Lease");
    ASSERT_THAT(leased, SizeIs(1));
    EXPECT_EQ(leased[0].producer_id, expected);
  }
}

// The owner is the server's word, from the join token: registering again (with whatever the
// executor says of itself) keeps it, and a join token left with the default name is an owner of
// its own.
TEST_P(SpotCheckContract, AnExecutorsOwnerIsItsJoinTokensNameAndOutlivesWhatItSays) {
  const std::string named = EnrolAs("alice", "named");
  EXPECT_EQ(GetExecutor(named).owner, "alice");
  ExecutorInfo says = Info("named");
  says.name = "owner: bob";
  ASSERT_OK(store_->RegisterExecutor(named, says, now_).status());
  EXPECT_EQ(GetExecutor(named).owner, "alice");
  const std::string unnamed = EnrolAs(kDefaultJoinTokenName, "unnamed");
  EXPECT_EQ(GetExecutor(unnamed).owner, JoinTokenId(seeds_));
  EXPECT_EQ(GetExecutor(Register("registered")).owner, "");  // not enrolled: no owner known
}

// A team's verify_fraction replaces the fleet's (0 in these stores) once its producer is past its
// first records (all of which are drawn, whatever the team); a fraction out of bounds, written
// past the admin's checks, counts as the fleet's.
TEST_P(SpotCheckContract, ATeamsVerifyFractionReplacesTheFleetsInTheDraw) {
  for (const auto& [name, fraction] : {std::pair{"checked", 1.0}, std::pair{"fleet", 0.0}, std::pair{"bypass", 0.001}}) {
    Team team = NewTeam(name);
    team.verify_fraction = fraction;
    ASSERT_OK(store_->CreateTeam(team).status());
  }
  EXPECT_EQ(Must(store_->GetTeam("checked"), "GetTeam").verify_fraction, 1.0);
  Team changed = Must(store_->GetTeam("fleet"), "GetTeam");
  changed.verify_fraction = 0.05;
  ASSERT_OK(store_->UpdateTeam(changed).status());
  EXPECT_EQ(Must(store_->GetTeam("fleet"), "GetTeam").verify_fraction, 0.05);
  changed.verify_fraction = 0;
  ASSERT_OK(store_->UpdateTeam(changed).status());

  // The producer's first 1000 records: one task of 1000.
  const std::string producer = Register("producer");
  const Job warmup = Must(store_->CreateJob(Spec(), now_), "CreateJob");
  ASSERT_OK(store_->AddTasks(warmup.id, testing::EvenTasks(1, 1000), 1000, now_));
  std::vector<Lease> held = LeaseUpTo(producer, 1);
  ASSERT_THAT(held, SizeIs(1));
  ASSERT_OK(Must(store_->CompleteTasks(producer, {Progress(held[0], 1000)}, now_), "Complete")[0]);
  ASSERT_EQ(GetExecutor(producer).records_done, 1000);

  std::map<std::string, int64_t> open;
  for (const std::string team : {"checked", "fleet", "bypass"}) {
    JobSpec spec = Spec();
    spec.team = team;
    const std::string job_id = Submit(spec, 1);
    held = LeaseUpTo(producer, 1);
    ASSERT_THAT(held, SizeIs(1));
    ASSERT_OK(Must(store_->CompleteTasks(producer, {Progress(held[0], kRecordsPerTask)}, now_), "Complete")[0]);
    open[team] = Must(store_->CountOpenVerifications(job_id), "CountOpenVerifications");
  }
  EXPECT_EQ(open["checked"], 1);
  EXPECT_EQ(open["fleet"], 0);
  EXPECT_EQ(open["bypass"], 0);
}

TEST_P(SpotCheckContract, OnlyTheHolderOfAVerificationLeaseReportsItsVerdicts) {
  const std::string job_id = Submit(Spec(), 1);
  const auto [producer, verifier, other] = RegisterAll({"producer", "verifier", "other"});
  std::vector<Lease> held = LeaseExactly(producer, 1);
  ASSERT_OK_AND_ASSIGN(auto outcomes, store_->CompleteTasks(producer, {Progress(held[0], kRecordsPerTask)}, now_));
  ASSERT_OK(outcomes[0]);
  std::vector<VerificationTask> leased = Must(store_->LeaseVerifications(verifier, 1, kTtl, now_), "LeaseVerifications");
  ASSERT_THAT(leased, SizeIs(1));
  const VerificationTask& task = leased[0];
  const std::vector<RecordVerdict> passed = AllPassed(task);

  // The producer vouching for itself, or an executor that holds no lease on it: refused.
  EXPECT_CODE(store_->ReportVerifications(producer, task, passed, now_).status(), kPermissionDenied);
  EXPECT_CODE(store_->ReportVerifications(other, task, passed, now_).status(), kPermissionDenied);
  EXPECT_CODE(store_->ReportVerifications("exe-000000000000", task, passed, now_).status(), kPermissionDenied);
  // The holder, with verdicts that do not name the task's records: refused.
  std::vector<RecordVerdict> fewer(passed.begin(), passed.end() - 1);
  EXPECT_CODE(store_->ReportVerifications(verifier, task, fewer, now_).status(), kInvalidArgument);
  std::vector<RecordVerdict> elsewhere = passed;
  elsewhere[0].record = 1000;
  EXPECT_CODE(store_->ReportVerifications(verifier, task, elsewhere, now_).status(), kInvalidArgument);
  std::vector<RecordVerdict> unnamed = passed;
  unnamed[0].custom_id = "";
  EXPECT_CODE(store_->ReportVerifications(verifier, task, unnamed, now_).status(), kInvalidArgument);
  unnamed[0].passed = false;  // a failure naming no record: refused too, nobody quarantined
  EXPECT_CODE(store_->ReportVerifications(verifier, task, unnamed, now_).status(), kInvalidArgument);
  VerificationTask unknown = task;
  unknown.seq = 9;
  EXPECT_CODE(store_->ReportVerifications(verifier, unknown, passed, now_).status(), kNotFound);
  // Nothing of the refused reports was kept: the task is open, no verdict, nobody quarantined.
  EXPECT_EQ(Must(store_->CountOpenVerifications(job_id), "CountOpenVerifications"), 1);
  EXPECT_THAT(Must(store_->ListVerifications(job_id), "ListVerifications"), IsEmpty());
  EXPECT_NE(GetExecutor(producer).state, ExecutorState::kQuarantined);

  // A lease that expired no longer lets its former holder report.
  Advance(kTtl);
  EXPECT_CODE(store_->ReportVerifications(verifier, task, passed, now_).status(), kPermissionDenied);
  std::vector<VerificationTask> renewed = Must(store_->LeaseVerifications(verifier, 1, kTtl, now_), "LeaseVerifications");
  ASSERT_THAT(renewed, SizeIs(1));

  ASSERT_OK_AND_ASSIGN(Executor after, store_->ReportVerifications(verifier, task, passed, now_));
  EXPECT_EQ(after.id, producer);
  EXPECT_NE(after.state, ExecutorState::kQuarantined);
  EXPECT_EQ(Must(store_->CountOpenVerifications(job_id), "CountOpenVerifications"), 0);
  std::vector<Verification> verdicts = Must(store_->ListVerifications(job_id), "ListVerifications");
  ASSERT_THAT(verdicts, SizeIs(task.records.size()));
  for (const Verification& v : verdicts) {
    EXPECT_EQ(v.producer_id, producer);
    EXPECT_EQ(v.verifier_id, verifier);
    EXPECT_TRUE(v.passed);
  }
  // Reported once: a second report finds nothing open.
  EXPECT_CODE(store_->ReportVerifications(verifier, task, passed, now_).status(), kNotFound);
}

TEST_P(SpotCheckContract, AFailedVerdictQuarantinesTheProducerAndAnUncheckedOneSaysNothing) {
  const std::string job_id = Submit(Spec(), 2);
  const auto [producer, verifier] = RegisterAll({"producer", "verifier"});
  std::vector<Lease> held = LeaseExactly(producer, 2);
  ASSERT_OK_AND_ASSIGN(auto outcomes, store_->CompleteTasks(producer, {Progress(held[0], kRecordsPerTask),
                                                                       Progress(held[1], kRecordsPerTask)},
                                                            now_));
  ASSERT_OK(outcomes[0]);
  ASSERT_OK(outcomes[1]);
  std::vector<VerificationTask> leased = Must(store_->LeaseVerifications(verifier, 2, kTtl, now_), "LeaseVerifications");
  ASSERT_THAT(leased, SizeIs(2));

  // Not checkable (the verifier lacked what it needed): no verdict, no consequence. A record
  // whose input line is not JSON has no custom_id; its unchecked verdict names none.
  std::vector<RecordVerdict> unchecked = AllPassed(leased[0]);
  for (RecordVerdict& v : unchecked) v.checked = false;
  unchecked[0].custom_id = "";
  ASSERT_OK_AND_ASSIGN(Executor after, store_->ReportVerifications(verifier, leased[0], unchecked, now_));
  EXPECT_NE(after.state, ExecutorState::kQuarantined);
  EXPECT_THAT(Must(store_->ListVerifications(job_id), "ListVerifications"), IsEmpty());

  std::vector<RecordVerdict> verdicts = AllPassed(leased[1]);
  verdicts[1] = Failed(verdicts[1].record, verdicts[1].custom_id, "greedy: answer token 0 is 9 nats below");
  ASSERT_OK_AND_ASSIGN(after, store_->ReportVerifications(verifier, leased[1], verdicts, now_));
  EXPECT_EQ(after.state, ExecutorState::kQuarantined);
  EXPECT_THAT(after.state_reason, HasSubstr(verdicts[1].custom_id));
  EXPECT_THAT(after.state_reason, HasSubstr(verifier));
  EXPECT_EQ(GetExecutor(producer).state, ExecutorState::kQuarantined);
  const VerificationTally tally = Tally(Must(store_->ListVerifications(job_id), "ListVerifications"));
  EXPECT_EQ(tally.checked, 3);
  EXPECT_EQ(tally.failed, 1);
  EXPECT_EQ(Must(store_->CountOpenVerifications(job_id), "CountOpenVerifications"), 0);
  // A quarantined executor neither leases verification tasks nor has its verdicts taken.
  EXPECT_THAT(Must(store_->LeaseVerifications(producer, 4, kTtl, now_), "LeaseVerifications"), IsEmpty());
}

TEST_P(SpotCheckContract, AFailedVerdictRedoesTheProducersWorkInJobsNotYetPublished) {
  const auto [producer, honest, verifier] = RegisterAll({"producer", "honest", "verifier"});
  // Job a: the producer completes task 0, an honest executor task 1; the job is finalizing.
  const std::string a = Submit(Spec(), 2);
  std::vector<Lease> produced = LeaseExactly(producer, 1);
  std::vector<Lease> honestly = LeaseExactly(honest, 1);
  ASSERT_OK(Must(store_->CompleteTasks(producer, {Progress(produced[0], kRecordsPerTask)}, now_), "Complete")[0]);
  ASSERT_OK(Must(store_->CompleteTasks(honest, {Progress(honestly[0], kRecordsPerTask)}, now_), "Complete")[0]);
  ASSERT_EQ(GetJob(a).state, JobState::kFinalizing);
  // Job b: the producer is running its task and has committed a chunk.
  const std::string b = Submit(Spec(), 1);
  std::vector<Lease> running = LeaseExactly(producer, 1);
  LeaseProgress beat = Progress(running[0], 4);
  beat.chunks = {Chunk{running[0].task.attempt, 0, 0, 4, 0}};
  ASSERT_OK(store_->Heartbeat(producer, ExecutorState::kBusy, "", {beat}, kTtl, now_).status());
  ASSERT_EQ(Must(store_->CountOpenVerifications(b), "CountOpenVerifications"), 1);

  std::vector<VerificationTask> checks = Must(store_->LeaseVerifications(verifier, 4, kTtl, now_), "LeaseVerifications");
  ASSERT_THAT(checks, SizeIs(3));
  const VerificationTask* producers_in_a = nullptr;
  for (const VerificationTask& check : checks) {
    if (check.job_id == a && check.producer_id == producer) producers_in_a = &check;
  }
  ASSERT_NE(producers_in_a, nullptr);
  std::vector<RecordVerdict> verdicts = AllPassed(*producers_in_a);
  verdicts[0] = Failed(verdicts[0].record, verdicts[0].custom_id, "invented");
  ASSERT_OK_AND_ASSIGN(Executor after, store_->ReportVerifications(verifier, *producers_in_a, verdicts, now_));
  EXPECT_EQ(after.state, ExecutorState::kQuarantined);

  // Job a runs again: the producer's task is pending without its chunks, the honest one's stays.
  Job job_a = GetJob(a);
  EXPECT_EQ(job_a.state, JobState::kRunning);
  EXPECT_EQ(job_a.tasks_done, 1);
  EXPECT_EQ(job_a.tasks_succeeded, 1);
  EXPECT_EQ(job_a.counts.completed, kRecordsPerTask);
  Task redone = GetTask(a, produced[0].task.index);
  EXPECT_EQ(redone.state, TaskState::kPending);
  EXPECT_THAT(redone.chunks, IsEmpty());
  EXPECT_EQ(redone.records_done, 0);
  EXPECT_THAT(redone.last_error, HasSubstr(producer));
  EXPECT_EQ(GetTask(a, honestly[0].task.index).state, TaskState::kSucceeded);
  // Job b's running task is pending again, without the producer's chunk, and that chunk's spot
  // check is gone (the verifier's report of it finds nothing); the honest chunk's is still open.
  Task b_task = GetTask(b, 0);
  EXPECT_EQ(b_task.state, TaskState::kPending);
  EXPECT_THAT(b_task.chunks, IsEmpty());
  EXPECT_EQ(Must(store_->CountOpenVerifications(b), "CountOpenVerifications"), 0);
  EXPECT_EQ(Must(store_->CountOpenVerifications(a), "CountOpenVerifications"), 1);

  // Another executor redoes both; job a finalizes again with every record counted once.
  Advance(absl::Seconds(1));
  std::vector<Lease> again = LeaseExactly(honest, 2);
  for (const Lease& lease : again) {
    ASSERT_OK(Must(store_->CompleteTasks(honest, {Progress(lease, kRecordsPerTask)}, now_), "Complete")[0]);
  }
  job_a = GetJob(a);
  EXPECT_EQ(job_a.state, JobState::kFinalizing);
  EXPECT_EQ(job_a.tasks_done, 2);
  EXPECT_EQ(job_a.counts.completed, 2 * kRecordsPerTask);
  EXPECT_EQ(GetJob(b).state, JobState::kFinalizing);
  EXPECT_EQ(GetJob(b).counts.completed, kRecordsPerTask);
  // The producer leases nothing while quarantined.
  EXPECT_THAT(LeaseUpTo(producer, 1), IsEmpty());
}

}  // namespace
}  // namespace minions
