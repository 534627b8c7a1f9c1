#include "server/idle_looks.h"

#include <algorithm>

namespace minions {

void IdleLooks::Announced(absl::Time now, absl::Duration warm_wait) {
  if (warm_wait <= absl::ZeroDuration()) return;
  absl::MutexLock lock(&mu_);
  // Rounded up to 100 ms (never early): a busy server keeps a few dozen of them at most.
  while (!warm_wait_ends_.empty() && *warm_wait_ends_.begin() <= now) warm_wait_ends_.erase(warm_wait_ends_.begin());
  const absl::Duration step = absl::Milliseconds(100);
  warm_wait_ends_.insert(absl::UnixEpoch() + absl::Ceil(now + warm_wait - absl::UnixEpoch(), step));
}

bool IdleLooks::Spared(const std::string& executor_id, uint64_t generation, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = marks_.find(executor_id);
  if (it != marks_.end() && it->second.generation == generation && now < it->second.recheck_at) return true;
  if (NonePendingLocked(generation, now)) {
    ++spared_;
    Mark& mark = marks_[executor_id];
    mark.generation = generation;
    mark.recheck_at = none_pending_->recheck_at;
    return true;
  }
  ++lookups_;
  return false;
}

bool IdleLooks::StartPendingCheck(uint64_t generation, uint64_t current, absl::Time now) {
  absl::MutexLock lock(&mu_);
  // Another look of this announcement may have asked already; an answer whose recheck has passed
  // is asked again (kept for ever, every later look of the announcement went to the store: a 40 s
  // job's 5,000 task ends were 5,000 lease lookups). One look asks at a time (the others' answers,
  // found nothing too, add nothing to its): a batch of empty answers would wake up to one asking
  // lease thread each.
  if (generation != current || pending_check_running_ || NonePendingLocked(generation, now)) return false;
  pending_check_running_ = true;
  ++pending_checks_;
  return true;
}

void IdleLooks::FoundNothing(const std::string& executor_id, uint64_t generation, absl::Time now, bool asked,
                             bool none_pending) {
  absl::MutexLock lock(&mu_);
  Mark& mark = marks_[executor_id];
  mark.generation = generation;
  mark.recheck_at = NextRecheckLocked(now);
  if (none_pending) none_pending_ = Mark{generation, mark.recheck_at, std::nullopt};
  if (asked) pending_check_running_ = false;  // with its answer in place: no gap for another to ask
}

void IdleLooks::Forget(const std::string& executor_id) {
  absl::MutexLock lock(&mu_);
  marks_.erase(executor_id);
}

void IdleLooks::Reported(const std::string& executor_id, ExecutorState state) {
  absl::MutexLock lock(&mu_);
  auto it = marks_.find(executor_id);
  if (it == marks_.end()) return;
  if (it->second.reported && *it->second.reported != state) {
    marks_.erase(it);
  } else {
    it->second.reported = state;
  }
}

std::optional<absl::Time> IdleLooks::RecheckAt(const std::string& executor_id) const {
  absl::MutexLock lock(&mu_);
  auto it = marks_.find(executor_id);
  if (it == marks_.end()) return std::nullopt;
  return it->second.recheck_at;
}

absl::Time IdleLooks::NextRecheckLocked(absl::Time now) {
  while (!warm_wait_ends_.empty() && *warm_wait_ends_.begin() <= now) warm_wait_ends_.erase(warm_wait_ends_.begin());
  const absl::Time recheck = now + idle_recheck_;
  return warm_wait_ends_.empty() ? recheck : std::min(recheck, *warm_wait_ends_.begin());
}

int64_t IdleLooks::lookups() const {
  absl::MutexLock lock(&mu_);
  return lookups_;
}

int64_t IdleLooks::spared() const {
  absl::MutexLock lock(&mu_);
  return spared_;
}

int64_t IdleLooks::pending_checks() const {
  absl::MutexLock lock(&mu_);
  return pending_checks_;
}

}  // namespace minions
