#include "server/confinement_gate.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "model/types.h"

namespace minions {

absl::Status ConfinementGate::Check(const std::string& executor_id) {
  if (!required_) return absl::OkStatus();
  std::string confinement;
  bool known = false;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = reported_.find(executor_id); it != reported_.end() && absl::Now() - it->second.at < kRecheck) {
      confinement = it->second.confinement;
      known = true;
    }
  }
  if (!known) {
    absl::StatusOr<Executor> executor = store_->GetExecutor(executor_id);
    if (!executor.ok()) return executor.status();
    confinement = executor->info.confinement;
    Registered(executor_id, confinement);
  }
  if (confinement == kConfinementFull) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "this pool leases work only to executors whose runners are confined (Landlock and seccomp; macOS: "
      "sandbox-exec), and this one reports ",
      confinement.empty() ? "nothing (an older executor)"
      : confinement == kConfinementPartial
          ? "seccomp only (its kernel has no Landlock: Linux 5.13 or later, with landlock in lsm=)"
          : "its sandbox turned off (--runner-sandbox off)"));
}

void ConfinementGate::Registered(const std::string& executor_id, const std::string& confinement) {
  if (!required_) return;
  absl::MutexLock lock(&mu_);
  reported_[executor_id] = {confinement, absl::Now()};
}

}  // namespace minions
