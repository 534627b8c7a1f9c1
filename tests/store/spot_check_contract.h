#pragma once
// The MetadataStore contract's spot-check scenarios (issue 38, docs/verification.md "Spot
// checks"): verification tasks drawn when chunks commit, leased only to another executor, and
// reported only by the holder of their lease. A backend instantiates SpotCheckContract with a
// factory whose stores have StoreOptions::spot_checks on and SpotCheckOptions' policy.

#include "absl/strings/str_format.h"
#include "identity_store_contract.h"
#include "model/verification.h"

namespace minions {

// What the factories of SpotCheckContract give their stores: spot checks on, every record of an
// executor's first 1000 drawn (the draws are then certain), at most 3 records a task.
inline StoreOptions SpotCheckOptions() {
  StoreOptions options;
  options.spot_checks = true;
  options.verification.fraction = 0;
  options.verification.all_until_records = 1000;
  options.verification.max_records = 3;
  return options;
}

// (An IdentityStoreContract for its helpers: executors enrolled with join tokens have owners.)
class SpotCheckContract : public IdentityStoreContract {
 protected:
  // An executor enrolled with a join token named `owner` (its Executor::owner), id
  // JoinTokenId(its seed), on `chip`.
  std::string EnrolAs(const std::string& owner, const std::string& name, const std::string& chip = "") {
    const int seed = ++seeds_;
    Must(store_->AddToken(Token(JoinTokenId(seed), Role::kJoin, "", owner, seed)), "AddToken");
    TokenRecord credential = Token(absl::StrCat("tok-cred", seed), Role::kExecutor, "", "", 1000 + seed);
    ExecutorInfo info = Info(name);
    info.chip = chip;
    return Must(store_->EnrolExecutor(FakeHash(seed), credential, info, now_, /*await_approval=*/false), "Enrol").id;
  }
  static std::string JoinTokenId(int seed) { return absl::StrFormat("tok-join%08d", seed); }

  // `producer` completes a one-task job and `verifier` fails its first record drawn: the producer
  // is quarantined, and the spot check's failure waits for an arbiter. Returns the spot check.
  VerificationTask ProduceAndFail(const std::string& producer, const std::string& verifier) {
    job_id_ = Submit(Spec(), 1);
    std::vector<Lease> held = LeaseUpTo(producer, 1);
    EXPECT_THAT(held, SizeIs(1));
    if (held.empty()) return {};
    EXPECT_OK(Must(store_->CompleteTasks(producer, {Progress(held[0], kRecordsPerTask)}, now_), "Complete")[0]);
    std::vector<VerificationTask> checks = Must(store_->LeaseVerifications(verifier, 1, kTtl, now_), "Lease");
    EXPECT_THAT(checks, SizeIs(1));
    if (checks.empty()) return {};
    std::vector<RecordVerdict> verdicts = Verdicts(checks[0], true);
    verdicts[0].passed = false;
    verdicts[0].reason = "greedy: answer token 0 is 9 nats below";
    Executor after = Must(store_->ReportVerifications(verifier, checks[0], verdicts, now_), "Report");
    EXPECT_EQ(after.state, ExecutorState::kQuarantined);
    return checks[0];
  }

  // One verdict per record of `task`, named r<record>: passed, or not checked.
  static std::vector<RecordVerdict> Verdicts(const VerificationTask& task, bool checked) {
    std::vector<RecordVerdict> verdicts;
    for (int64_t r : task.records) verdicts.push_back(RecordVerdict{r, absl::StrCat("r", r), checked, checked, ""});
    return verdicts;
  }

  std::vector<VerificationTask> LeaseChecks(const std::string& executor) {
    return Must(store_->LeaseVerifications(executor, 4, kTtl, now_), "LeaseVerifications");
  }

  std::string job_id_;
  int seeds_ = 0;
};

}  // namespace minions
