// SpotCheckContract's arbitration scenarios (docs/verification.md, "Arbitration by a third"): a
// verifier that fails a record is judged by a third executor, which upholds the producer's
// quarantine or overrules the verifier. Every backend runs them (spot_check_contract.h).

#include "model/verification.h"
#include "spot_check_contract.h"

namespace minions {
namespace {

TEST_P(SpotCheckContract, ArbitrationAVerifiersFailureGoesToAThirdExecutorAndHoldsNoJobBack) {
  const std::string producer = Register("producer");
  const std::string verifier = Register("verifier");
  const std::string arbiter = Register("arbiter");
  const VerificationTask check = ProduceAndFail(producer, verifier);
  ASSERT_FALSE(check.records.empty());
  // The producer's records are redone; the arbitration does not hold the job's publication.
  EXPECT_EQ(GetTask(job_id_, 0).state, TaskState::kPending);
  EXPECT_EQ(Must(store_->CountOpenVerifications(job_id_), "CountOpenVerifications"), 0);
  // Neither party to the dispute judges it.
  EXPECT_THAT(LeaseChecks(verifier), IsEmpty());
  EXPECT_THAT(LeaseChecks(producer), IsEmpty());
  std::vector<VerificationTask> leased = LeaseChecks(arbiter);
  ASSERT_THAT(leased, SizeIs(1));
  EXPECT_EQ(leased[0].disputed_verifier, verifier);
  EXPECT_EQ(leased[0].producer_id, producer);
  EXPECT_EQ(leased[0].records, std::vector<int64_t>{check.records[0]});  // only what it failed
  // The chunk its task no longer holds.
  EXPECT_EQ(leased[0].chunk_begin, 0);
  EXPECT_EQ(leased[0].chunk_end, kRecordsPerTask);
  EXPECT_EQ(leased[0].attempt, check.attempt);
  EXPECT_EQ(leased[0].seq, check.seq);
  // The disputed verifier cannot report the arbitration either.
  EXPECT_CODE(store_->ReportVerifications(verifier, leased[0], Verdicts(leased[0], true), now_).status(),
              kPermissionDenied);
}

TEST_P(SpotCheckContract, ArbitrationAnArbiterThatPassesTheRecordsQuarantinesTheVerifierAndReleasesTheProducer) {
  const std::string producer = Register("producer");
  const std::string verifier = Register("liar");
  const std::string arbiter = Register("arbiter");
  ProduceAndFail(producer, verifier);
  std::vector<VerificationTask> leased = LeaseChecks(arbiter);
  ASSERT_THAT(leased, SizeIs(1));
  ASSERT_OK_AND_ASSIGN(Executor released,
                       store_->ReportVerifications(arbiter, leased[0], Verdicts(leased[0], true), now_));
  EXPECT_EQ(released.id, producer);
  EXPECT_NE(released.state, ExecutorState::kQuarantined);
  EXPECT_EQ(GetExecutor(producer).state, ExecutorState::kAvailable);
  const Executor overruled = GetExecutor(verifier);
  EXPECT_EQ(overruled.state, ExecutorState::kQuarantined);
  EXPECT_THAT(overruled.state_reason, HasSubstr("arbitration"));
  EXPECT_THAT(overruled.state_reason, HasSubstr(arbiter));
  EXPECT_THAT(overruled.state_reason, HasSubstr(producer));
  // The producer's redone work stays redone (nothing lost); the arbitration is over.
  EXPECT_EQ(GetTask(job_id_, 0).state, TaskState::kPending);
  EXPECT_THAT(LeaseChecks(Register("another")), IsEmpty());
  // The arbiter's verdict is kept beside the overruled one.
  int by_arbiter = 0;
  for (const Verification& v : Must(store_->ListVerifications(job_id_), "ListVerifications")) {
    if (v.verifier_id == arbiter) {
      ++by_arbiter;
      EXPECT_TRUE(v.passed);
    }
  }
  EXPECT_EQ(by_arbiter, 1);
  // Released, the producer leases again; the overruled verifier leases nothing.
  EXPECT_THAT(LeaseUpTo(producer, 1), SizeIs(1));
  EXPECT_THAT(LeaseUpTo(verifier, 1), IsEmpty());
}

TEST_P(SpotCheckContract, ArbitrationAnArbiterThatFailsTheRecordTooUpholdsTheQuarantine) {
  const std::string producer = Register("producer");
  const std::string verifier = Register("verifier");
  const std::string arbiter = Register("arbiter");
  ProduceAndFail(producer, verifier);
  std::vector<VerificationTask> leased = LeaseChecks(arbiter);
  ASSERT_THAT(leased, SizeIs(1));
  std::vector<RecordVerdict> verdicts = Verdicts(leased[0], true);
  verdicts[0].passed = false;
  verdicts[0].reason = "invented";
  ASSERT_OK_AND_ASSIGN(Executor upheld, store_->ReportVerifications(arbiter, leased[0], verdicts, now_));
  EXPECT_EQ(upheld.state, ExecutorState::kQuarantined);
  EXPECT_THAT(upheld.state_reason, HasSubstr(arbiter));
  EXPECT_EQ(GetExecutor(verifier).state, ExecutorState::kAvailable);
  EXPECT_THAT(LeaseChecks(Register("another")), IsEmpty());
}

TEST_P(SpotCheckContract, ArbitrationAnArbiterThatCannotCheckChangesNothing) {
  const std::string producer = Register("producer");
  const std::string verifier = Register("verifier");
  const std::string arbiter = Register("arbiter");
  ProduceAndFail(producer, verifier);
  const std::string reason = GetExecutor(producer).state_reason;
  std::vector<VerificationTask> leased = LeaseChecks(arbiter);
  ASSERT_THAT(leased, SizeIs(1));
  ASSERT_OK_AND_ASSIGN(Executor after,
                       store_->ReportVerifications(arbiter, leased[0], Verdicts(leased[0], false), now_));
  EXPECT_EQ(after.state, ExecutorState::kQuarantined);
  EXPECT_EQ(after.state_reason, reason);
  EXPECT_EQ(GetExecutor(verifier).state, ExecutorState::kAvailable);
}

// An overturned ruling lifts only the quarantine the overruled verifier's failure put the producer
// in: one another verifier's failure put it in since stands.
TEST_P(SpotCheckContract, ArbitrationAnOverturnedRulingLiftsOnlyTheOverruledVerifiersQuarantine) {
  const std::string producer = Register("producer");
  const std::string liar = Register("liar");
  const std::string other = Register("other");
  const std::string arbiter = Register("arbiter");
  const std::string first_job = Submit(Spec(), 1);
  const std::string second_job = Submit(Spec(), 1);
  std::vector<Lease> held = LeaseUpTo(producer, 2);
  ASSERT_THAT(held, SizeIs(2));
  ASSERT_EQ(held[0].task.job_id, first_job);
  ASSERT_OK(Must(store_->CompleteTasks(producer, {Progress(held[0], kRecordsPerTask)}, now_), "Complete")[0]);
  Advance(absl::Seconds(1));  // the first job's spot check is the older
  ASSERT_OK(Must(store_->CompleteTasks(producer, {Progress(held[1], kRecordsPerTask)}, now_), "Complete")[0]);
  // The second job published: the first failure redoes nothing of it, so its spot check stays.
  ASSERT_OK(store_->FinishJob(second_job, "o", "e", "m", now_, JobState::kCompleted, TokenUsage{}).status());
  std::vector<VerificationTask> by_liar = Must(store_->LeaseVerifications(liar, 1, kTtl, now_), "Lease");
  std::vector<VerificationTask> by_other = Must(store_->LeaseVerifications(other, 1, kTtl, now_), "Lease");
  ASSERT_THAT(by_liar, SizeIs(1));
  ASSERT_THAT(by_other, SizeIs(1));
  ASSERT_EQ(by_liar[0].job_id, first_job);
  ASSERT_EQ(by_other[0].job_id, second_job);
  for (auto& [verifier, check] : {std::pair{liar, by_liar[0]}, std::pair{other, by_other[0]}}) {
    std::vector<RecordVerdict> verdicts = Verdicts(check, true);
    verdicts[0].passed = false;
    verdicts[0].reason = "failed";
    ASSERT_OK(store_->ReportVerifications(verifier, check, verdicts, now_).status());
    Advance(absl::Seconds(1));
  }
  ASSERT_THAT(GetExecutor(producer).state_reason, HasSubstr(other));
  std::vector<VerificationTask> disputes = LeaseChecks(arbiter);
  ASSERT_THAT(disputes, SizeIs(2));
  const VerificationTask& of_liar = disputes[0].disputed_verifier == liar ? disputes[0] : disputes[1];
  ASSERT_EQ(of_liar.disputed_verifier, liar);
  ASSERT_OK_AND_ASSIGN(Executor after, store_->ReportVerifications(arbiter, of_liar, Verdicts(of_liar, true), now_));
  EXPECT_EQ(after.state, ExecutorState::kQuarantined);
  EXPECT_THAT(after.state_reason, HasSubstr(other));
  EXPECT_EQ(GetExecutor(liar).state, ExecutorState::kQuarantined);
}

// Think like an owner of several machines: its second machine must not judge a dispute about its
// first (it would release its forger, or uphold its lying verifier, at will).
TEST_P(SpotCheckContract, ArbitrationNoOwnerJudgesADisputeOfItsOwnMachine) {
  const std::string forger = EnrolAs("mallory", "forger");
  const std::string verifier = EnrolAs("alice", "verifier");
  const std::string accomplice = EnrolAs("mallory", "accomplice");
  const std::string verifiers_colleague = EnrolAs("alice", "colleague");
  const std::string third = EnrolAs("carol", "third");
  ASSERT_EQ(GetExecutor(forger).owner, "mallory");
  ProduceAndFail(forger, verifier);
  EXPECT_THAT(LeaseChecks(accomplice), IsEmpty());
  EXPECT_THAT(LeaseChecks(verifiers_colleague), IsEmpty());
  std::vector<VerificationTask> leased = LeaseChecks(third);
  ASSERT_THAT(leased, SizeIs(1));
  EXPECT_EQ(leased[0].disputed_verifier, verifier);
}

// A dispute within one owner's machines (one join token for the whole fleet) may be judged by any
// third executor, of that owner or not.
TEST_P(SpotCheckContract, ArbitrationADisputeWithinOneOwnerGoesToAnyThird) {
  const std::string producer = EnrolAs("lab", "producer");
  const std::string verifier = EnrolAs("lab", "verifier");
  const std::string third = EnrolAs("lab", "third");
  ProduceAndFail(producer, verifier);
  EXPECT_THAT(LeaseChecks(third), SizeIs(1));
}

}  // namespace
}  // namespace minions
