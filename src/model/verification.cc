#include "model/verification.h"

#include <map>
#include <set>
#include <utility>

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

VerificationTally Tally(const std::vector<Verification>& verdicts) {
  VerificationTally tally;
  std::map<std::pair<int64_t, std::string>, bool> passed;  // record -> every verdict passed
  std::set<std::string> verifiers;
  for (const Verification& v : verdicts) {
    verifiers.insert(v.verifier_id);
    auto [it, added] = passed.emplace(std::make_pair(v.task_index, v.custom_id), v.passed);
    if (!v.passed && (added || it->second)) tally.failed_records.push_back(v.custom_id);
    if (!added) it->second = it->second && v.passed;
  }
  tally.checked = static_cast<int64_t>(passed.size());
  for (const auto& [record, ok] : passed) (ok ? tally.passed : tally.failed) += 1;
  tally.verifiers.assign(verifiers.begin(), verifiers.end());
  return tally;
}

}  // namespace minions
