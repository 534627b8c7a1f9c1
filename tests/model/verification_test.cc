// The tally of a job's verdicts (model/verification.h): what `minions status` and the manifest show.

#include "model/verification.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/identity.h"

namespace minions {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

Verification Verdict(int64_t task, const std::string& record, const std::string& verifier, bool passed) {
  Verification v;
  v.job_id = "job-1";
  v.task_index = task;
  v.custom_id = record;
  v.producer_id = "exe-producer";
  v.verifier_id = verifier;
  v.passed = passed;
  if (!passed) v.reason = "forged";
  return v;
}

TEST(VerificationTally, NoVerdictsIsNothingChecked) {
  EXPECT_EQ(Tally({}), VerificationTally{});
}

TEST(VerificationTally, ARecordCountsOnceAndFailsWhenAnyVerifierFailedIt) {
  VerificationTally tally = Tally({Verdict(0, "a", "exe-v2", true), Verdict(0, "a", "exe-v1", true),
                                   Verdict(0, "b", "exe-v1", true), Verdict(0, "b", "exe-v3", false),
                                   Verdict(1, "c", "exe-v1", false), Verdict(1, "c", "exe-v2", false)});
  EXPECT_EQ(tally.checked, 3);
  EXPECT_EQ(tally.passed, 1);
  EXPECT_EQ(tally.failed, 2);
  EXPECT_THAT(tally.verifiers, ElementsAre("exe-v1", "exe-v2", "exe-v3"));
  EXPECT_THAT(tally.failed_records, ElementsAre("b", "c"));  // each once
}

TEST(VerificationTally, TheSameCustomIdInTwoTasksIsTwoRecords) {
  // custom_ids are unique per job in checked input, but the tally does not lean on it.
  VerificationTally tally = Tally({Verdict(0, "a", "exe-v1", true), Verdict(1, "a", "exe-v1", true)});
  EXPECT_EQ(tally.checked, 2);
  EXPECT_EQ(tally.passed, 2);
  EXPECT_THAT(tally.failed_records, IsEmpty());
}

// A deterministic "random" source: the numbers of `values`, over and over.
std::function<double()> Cycle(std::vector<double> values) {
  auto i = std::make_shared<size_t>(0);
  return [values, i] { return values[(*i)++ % values.size()]; };
}

TEST(DrawRecords, DrawsEachRecordWithTheFractionAndAllOfANewExecutors) {
  VerificationPolicy policy;
  policy.fraction = 0.5;
  policy.all_until_records = 100;
  const Chunk chunk{1, 0, 10, 16, 0};
  // Seasoned: a record is drawn when the uniform number falls below the fraction.
  EXPECT_THAT(DrawRecords(chunk, policy, 100, Cycle({0.1, 0.9})), ElementsAre(10, 12, 14));
  EXPECT_THAT(DrawRecords(chunk, policy, 500, Cycle({0.7})), IsEmpty());
  // New (fewer records than all_until_records): every record.
  EXPECT_THAT(DrawRecords(chunk, policy, 99, Cycle({0.9})), ElementsAre(10, 11, 12, 13, 14, 15));
  // Off: a zero fraction draws nothing from a seasoned executor.
  policy.fraction = 0;
  EXPECT_THAT(DrawRecords(chunk, policy, 100, Cycle({0.0})), IsEmpty());
}

TEST(DrawRecords, KeepsAtMostMaxRecordsAscending) {
  VerificationPolicy policy;
  policy.all_until_records = 1000;
  policy.max_records = 3;
  const Chunk chunk{1, 0, 0, 50, 0};
  for (double u : {0.0, 0.3, 0.99}) {
    std::vector<int64_t> drawn = DrawRecords(chunk, policy, 0, Cycle({u, 0.5, 0.2}));
    ASSERT_THAT(drawn, SizeIs(3));
    EXPECT_TRUE(std::is_sorted(drawn.begin(), drawn.end()));
    EXPECT_EQ(std::adjacent_find(drawn.begin(), drawn.end()), drawn.end());  // each once
    for (int64_t r : drawn) {
      EXPECT_GE(r, 0);
      EXPECT_LT(r, 50);
    }
  }
}

TEST(VerificationRecords, RoundTripAndRefuseJunk) {
  EXPECT_EQ(EncodeRecords({3, 17, 40}), "3,17,40");
  EXPECT_THAT(*DecodeRecords("3,17,40"), ElementsAre(3, 17, 40));
  EXPECT_THAT(*DecodeRecords(""), IsEmpty());
  EXPECT_EQ(DecodeRecords("3,x").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeRecords("-1").status().code(), absl::StatusCode::kDataLoss);
}

TEST(VerificationPolicyForTeam, ATeamsFractionWithinItsBoundsReplacesTheFleetsAndNothingElseDoes) {
  VerificationPolicy fleet;
  fleet.fraction = 0.02;
  EXPECT_EQ(PolicyForTeam(fleet, 0).fraction, 0.02);  // the fleet's
  EXPECT_EQ(PolicyForTeam(fleet, 0.5).fraction, 0.5);
  EXPECT_EQ(PolicyForTeam(fleet, 0.01).fraction, 0.01);
  EXPECT_EQ(PolicyForTeam(fleet, 1).fraction, 1);
  // Out of bounds (written past the admin's checks): the fleet's, never off.
  for (double bad : {0.001, -1.0, 2.0, std::nan("")}) EXPECT_EQ(PolicyForTeam(fleet, bad).fraction, 0.02) << bad;
  EXPECT_EQ(PolicyForTeam(fleet, 0.5).all_until_records, fleet.all_until_records);
}

RecordVerdict Judged(int64_t record, bool checked, bool passed) {
  return RecordVerdict{record, absl::StrCat("r", record), checked, passed, passed ? "" : "forged"};
}

TEST(Arbitration, TheRulingUpholdsOnAnyFailureOverturnsOnlyWhenAllPassed) {
  EXPECT_EQ(Rule({Judged(1, true, true), Judged(2, true, true)}), Ruling::kOverturned);
  EXPECT_EQ(Rule({Judged(1, true, true), Judged(2, true, false)}), Ruling::kUpheld);
  EXPECT_EQ(Rule({Judged(1, false, false), Judged(2, true, false)}), Ruling::kUpheld);
  // Not all checked, none failed: nothing is known.
  EXPECT_EQ(Rule({Judged(1, true, true), Judged(2, false, false)}), Ruling::kUndecided);
  EXPECT_EQ(Rule({}), Ruling::kUndecided);
  EXPECT_EQ(RulingName(Ruling::kOverturned), "overturned");
}

TEST(Arbitration, NoOwnerJudgesItsOwnDispute) {
  EXPECT_TRUE(MayArbitrate("carol", "mallory", "alice"));
  EXPECT_FALSE(MayArbitrate("mallory", "mallory", "alice"));  // the producer's owner
  EXPECT_FALSE(MayArbitrate("alice", "mallory", "alice"));    // the verifier's owner
  EXPECT_TRUE(MayArbitrate("lab", "lab", "lab"));             // one owner's dispute: any third
  EXPECT_TRUE(MayArbitrate("carol", "lab", "lab"));
  // An executor that did not enrol has no owner known: "" is an owner like any other.
  EXPECT_FALSE(MayArbitrate("", "", "alice"));
  EXPECT_TRUE(MayArbitrate("carol", "", "alice"));
}

TEST(Arbitration, AnOverturnedRulingLiftsOnlyTheQuarantineTheOverruledVerifierCaused) {
  Executor producer;
  producer.id = "exe-p";
  Verification failed = Verdict(0, "r7", "exe-liar", false);
  Quarantine(producer, failed);
  EXPECT_TRUE(QuarantinedBy(producer, "job-1", "r7", "exe-liar"));
  EXPECT_FALSE(QuarantinedBy(producer, "job-1", "r7", "exe-li"));  // another verifier's id, a prefix of it
  EXPECT_FALSE(QuarantinedBy(producer, "job-1", "r70", "exe-liar"));
  EXPECT_FALSE(QuarantinedBy(producer, "job-2", "r7", "exe-liar"));
  Quarantine(producer, Verdict(0, "r8", "exe-other", false));  // quarantined since by another
  EXPECT_FALSE(QuarantinedBy(producer, "job-1", "r7", "exe-liar"));
  Executor available;
  EXPECT_FALSE(QuarantinedBy(available, "job-1", "r7", "exe-liar"));

  VerificationTask dispute = ArbitrationOf(VerificationTask{"job-1", 0, 1, 2, "exe-p", {3, 7}}, "exe-liar", {7}, 0,
                                           10, absl::UnixEpoch());
  EXPECT_EQ(dispute.disputed_verifier, "exe-liar");
  EXPECT_THAT(dispute.records, ElementsAre(7));
  EXPECT_EQ(dispute.verifier_id, "");
  EXPECT_EQ(dispute.chunk_end, 10);
  Executor liar;
  liar.id = "exe-liar";
  QuarantineOverruled(liar, dispute, "exe-arbiter", "r7");
  EXPECT_EQ(liar.state, ExecutorState::kQuarantined);
  EXPECT_THAT(liar.state_reason, ::testing::HasSubstr("exe-arbiter"));
  Executor revoked;
  revoked.state = ExecutorState::kRevoked;
  QuarantineOverruled(revoked, dispute, "exe-arbiter", "r7");
  EXPECT_EQ(revoked.state, ExecutorState::kRevoked);
}

TEST(ExecutorOwnerTest, IsTheJoinTokensNameOrTheTokenWhenItHasTheDefaultName) {
  TokenRecord join;
  join.id = "tok-0123456789ab";
  join.principal = "alice";
  EXPECT_EQ(ExecutorOwner(join), "alice");
  join.principal = kDefaultJoinTokenName;
  EXPECT_EQ(ExecutorOwner(join), "tok-0123456789ab");
}

}  // namespace
}  // namespace minions
