// The MetadataStore contract's verification scenarios (issue 38, docs/verification.md): verdicts
// recorded per record, a failed one quarantining its producer (no leases, no renewals, sticky
// across heartbeats, registrations and the watchdog) until an admin releases it. Every backend
// runs them (metadata_store_contract.h).

#include "metadata_store_contract.h"
#include "model/verification.h"

namespace minions {
namespace {

Verification Verdict(const std::string& job_id, const std::string& custom_id, const std::string& producer,
                     const std::string& verifier, bool passed, const std::string& reason = "") {
  Verification v;
  v.job_id = job_id;
  v.task_index = 0;
  v.custom_id = custom_id;
  v.producer_id = producer;
  v.verifier_id = verifier;
  v.passed = passed;
  v.reason = reason;
  return v;
}

TEST_P(MetadataStoreContract, VerdictsAreRecordedPerRecord) {
  const std::string job_id = Submit(Spec(), 2);
  const auto [producer, verifier] = RegisterAll({"producer", "verifier"});
  ASSERT_OK_AND_ASSIGN(Executor after, store_->RecordVerification(Verdict(job_id, "r1", producer, verifier, true),
                                                                   now_));
  EXPECT_EQ(after.state, ExecutorState::kAvailable);
  Advance(absl::Seconds(1));
  ASSERT_OK(store_->RecordVerification(Verdict(job_id, "r2", producer, verifier, true, "ignored"), now_).status());
  ASSERT_OK_AND_ASSIGN(std::vector<Verification> verdicts, store_->ListVerifications(job_id));
  ASSERT_THAT(verdicts, SizeIs(2));
  EXPECT_EQ(verdicts[0].custom_id, "r1");
  EXPECT_EQ(verdicts[0].producer_id, producer);
  EXPECT_EQ(verdicts[0].verifier_id, verifier);
  EXPECT_TRUE(verdicts[0].passed);
  EXPECT_EQ(verdicts[1].custom_id, "r2");
  EXPECT_EQ(verdicts[1].reason, "");  // a passed verdict keeps no reason
  EXPECT_EQ(verdicts[1].at, now_);
  // One verdict per record and verifier; another verifier (an arbiter) may add its own.
  EXPECT_CODE(store_->RecordVerification(Verdict(job_id, "r1", producer, verifier, true), now_).status(),
              kAlreadyExists);
  const std::string arbiter = Register("arbiter");
  ASSERT_OK(store_->RecordVerification(Verdict(job_id, "r1", producer, arbiter, true), now_).status());
  EXPECT_THAT(Must(store_->ListVerifications(job_id), "ListVerifications"), SizeIs(3));
  EXPECT_EQ(GetExecutor(producer).state, ExecutorState::kAvailable);
}

TEST_P(MetadataStoreContract, BadVerdictsAreRefused) {
  const std::string job_id = Submit(Spec(), 1);
  const auto [producer, verifier] = RegisterAll({"producer", "verifier"});
  EXPECT_CODE(store_->RecordVerification(Verdict(job_id, "r1", producer, producer, false, "x"), now_).status(),
              kInvalidArgument);
  EXPECT_CODE(store_->RecordVerification(Verdict(job_id, "", producer, verifier, true), now_).status(),
              kInvalidArgument);
  EXPECT_CODE(store_->RecordVerification(Verdict("job-nope", "r1", producer, verifier, true), now_).status(),
              kNotFound);
  EXPECT_CODE(store_->RecordVerification(Verdict(job_id, "r1", "exe-000000000000", verifier, true), now_).status(),
              kNotFound);
  EXPECT_CODE(store_->RecordVerification(Verdict(job_id, "r1", producer, "exe-000000000000", true), now_).status(),
              kNotFound);
  EXPECT_CODE(store_->ListVerifications("job-nope").status(), kNotFound);
  // Nothing of the refused calls was kept, and nobody was quarantined.
  EXPECT_THAT(Must(store_->ListVerifications(job_id), "ListVerifications"), IsEmpty());
  EXPECT_EQ(GetExecutor(producer).state, ExecutorState::kAvailable);
}

TEST_P(MetadataStoreContract, AFailedVerdictQuarantinesTheProducerUntilReleased) {
  const std::string job_id = Submit(Spec(), 4);
  const auto [producer, verifier] = RegisterAll({"producer", "verifier"});
  std::vector<Lease> held = LeaseExactly(producer, 1);

  ASSERT_OK_AND_ASSIGN(Executor quarantined,
                       store_->RecordVerification(
                           Verdict(job_id, "r7", producer, verifier, false, "greedy: answer token 3 is 7 nats below"),
                           now_));
  EXPECT_EQ(quarantined.state, ExecutorState::kQuarantined);
  EXPECT_THAT(quarantined.state_reason, HasSubstr("r7"));
  EXPECT_THAT(quarantined.state_reason, HasSubstr("7 nats below"));
  EXPECT_THAT(quarantined.state_reason, HasSubstr(verifier));
  EXPECT_EQ(GetExecutor(producer).state, ExecutorState::kQuarantined);
  ASSERT_OK_AND_ASSIGN(std::vector<Verification> verdicts, store_->ListVerifications(job_id));
  ASSERT_THAT(verdicts, SizeIs(1));
  EXPECT_FALSE(verdicts[0].passed);

  // No new leases, and the one it holds is not renewed: it must stop it (the task goes to others
  // when its lease expires).
  EXPECT_THAT(LeaseUpTo(producer, 2), IsEmpty());
  ASSERT_OK_AND_ASSIGN(HeartbeatReply reply,
                       store_->Heartbeat(producer, ExecutorState::kAvailable, "", {Progress(held[0])}, kTtl, now_));
  EXPECT_THAT(reply.renewed, IsEmpty());
  ASSERT_THAT(reply.cancel, SizeIs(1));
  // What it says, a restart and the watchdog all leave it quarantined.
  EXPECT_EQ(GetExecutor(producer).state, ExecutorState::kQuarantined);
  ExecutorInfo info;
  info.memory_bytes = 8 * kGiB;
  info.runners = {"llama"};
  ASSERT_OK_AND_ASSIGN(Executor again, store_->RegisterExecutor(producer, info, now_));
  EXPECT_EQ(again.state, ExecutorState::kQuarantined);
  EXPECT_THAT(LeaseUpTo(producer, 1), IsEmpty());
  Advance(absl::Minutes(5));
  ASSERT_OK(store_->Heartbeat(verifier, ExecutorState::kAvailable, "", {}, kTtl, now_).status());
  ASSERT_OK(store_->MarkLostExecutors(now_ - absl::Minutes(1), now_).status());
  EXPECT_EQ(GetExecutor(producer).state, ExecutorState::kQuarantined);
  ASSERT_OK(store_->RequestDrain(producer, now_));
  EXPECT_EQ(GetExecutor(producer).state, ExecutorState::kQuarantined);
  // Its held task goes to the verifier once the lease expires.
  ASSERT_OK(store_->ExpireLeases(now_, 100).status());
  EXPECT_THAT(LeaseUpTo(verifier, 4), SizeIs(4));

  // An admin releases it: back in service.
  ASSERT_OK_AND_ASSIGN(Executor released, store_->ReleaseExecutor(producer, now_));
  EXPECT_NE(released.state, ExecutorState::kQuarantined);
  EXPECT_EQ(released.state_reason.find("verification"), std::string::npos);
  EXPECT_CODE(store_->ReleaseExecutor(producer, now_).status(), kFailedPrecondition);
  EXPECT_CODE(store_->ReleaseExecutor("exe-000000000000", now_).status(), kNotFound);
}

TEST_P(MetadataStoreContract, ARevokedProducerStaysRevoked) {
  const std::string job_id = Submit(Spec(), 1);
  const auto [producer, verifier] = RegisterAll({"producer", "verifier"});
  ASSERT_OK(store_->RevokeExecutor(producer, now_).status());
  ASSERT_OK_AND_ASSIGN(Executor after,
                       store_->RecordVerification(Verdict(job_id, "r1", producer, verifier, false, "forged"), now_));
  EXPECT_EQ(after.state, ExecutorState::kRevoked);
  EXPECT_CODE(store_->ReleaseExecutor(producer, now_).status(), kFailedPrecondition);
}

}  // namespace
}  // namespace minions
