#include "server/idle_renewals.h"

namespace minions {

IdleRenewals::IdleRenewals(absl::Duration idle_heartbeat, absl::Duration scan_period)
    : idle_heartbeat_(idle_heartbeat), scan_period_(scan_period) {}

void IdleRenewals::Written(const std::string& executor_id, absl::Time now,
                           const std::function<bool(const std::string&)>& polling) {
  absl::MutexLock lock(&mu_);
  renewed_at_[executor_id] = now;
  if (renewed_at_.size() < swept_size_ * 2 + 1024) return;
  ForgetSilentLocked(now, polling);
  swept_size_ = renewed_at_.size();
}

void IdleRenewals::NotWritten(const std::string& executor_id) {
  absl::MutexLock lock(&mu_);
  renewed_at_.erase(executor_id);
}

bool IdleRenewals::Due(const std::string& executor_id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto [it, first] = renewed_at_.try_emplace(executor_id, now);
  if (first) return true;
  // Due a scan early, so that renewals come at most an idle beat apart however the scans fall.
  if (now - it->second < idle_heartbeat_ - scan_period_) return false;
  it->second = now;
  return true;
}

void IdleRenewals::ForgetSilent(absl::Time now, const std::function<bool(const std::string&)>& polling) {
  absl::MutexLock lock(&mu_);
  ForgetSilentLocked(now, polling);
}

void IdleRenewals::ForgetSilentLocked(absl::Time now, const std::function<bool(const std::string&)>& polling) {
  const absl::Duration forget_after = idle_heartbeat_ * 2;
  for (auto it = renewed_at_.begin(); it != renewed_at_.end();) {
    auto here = it++;
    if (now - here->second > forget_after && !polling(here->first)) renewed_at_.erase(here);
  }
}

void IdleRenewals::Counted(int64_t n, bool in_flight) {
  absl::MutexLock lock(&mu_);
  count_ += n;
  if (in_flight) in_flight_ += n;
}

void IdleRenewals::Answered() {
  absl::MutexLock lock(&mu_);
  --in_flight_;
}

void IdleRenewals::AwaitAnswered() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(+[](int64_t* in_flight) { return *in_flight == 0; }, &in_flight_));
}

int64_t IdleRenewals::count() const {
  absl::MutexLock lock(&mu_);
  return count_;
}

size_t IdleRenewals::size() const {
  absl::MutexLock lock(&mu_);
  return renewed_at_.size();
}

}  // namespace minions
