// The tally of a job's verdicts (model/verification.h): what `minions status` and the manifest show.

#include "model/verification.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace minions {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

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

}  // namespace
}  // namespace minions
