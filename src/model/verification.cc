#include "model/verification.h"

#include "absl/strings/str_cat.h"

namespace minions {

void Quarantine(Executor& producer, const Verification& failed) {
  if (producer.state == ExecutorState::kRevoked) return;
  producer.state = ExecutorState::kQuarantined;
  std::string reason = absl::StrCat("failed verification of ", failed.job_id, " record ", failed.custom_id,
                                    " (checked by ", failed.verifier_id, "): ", failed.reason);
  if (reason.size() > kMaxVerificationReason) reason.resize(kMaxVerificationReason);
  producer.state_reason = std::move(reason);
}

absl::Status Release(Executor& executor) {
  if (executor.state != ExecutorState::kQuarantined) {
    return absl::FailedPreconditionError(absl::StrCat("executor ", executor.id, " is ",
                                                      std::string(ExecutorStateName(executor.state)), ", not quarantined"));
  }
  executor.state = ExecutorState::kAvailable;
  executor.state_reason.clear();
  return absl::OkStatus();
}

}  // namespace minions
