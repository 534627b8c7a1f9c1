#include "server/lease_wait_room.h"

namespace minions {

uint64_t LeaseWaitRoom::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

void LeaseWaitRoom::Announce() {
  absl::MutexLock lock(&mu_);
  ++generation_;
  WakeParkedLocked();
}

void LeaseWaitRoom::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  WakeParkedLocked();
}

bool LeaseWaitRoom::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void LeaseWaitRoom::Close() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  closed_ = true;
  WakeParkedLocked();
}

void LeaseWaitRoom::Enter(Call* call, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (call->idle) {
    Call*& latest = idle_polls_[call->executor_id];
    if (latest != nullptr) parked_idle_.erase(latest);  // an older poll no longer stands for it
    latest = call;
    if (next_scan_ == absl::InfiniteFuture()) next_scan_ = now + scan_period_;
  }
  MakeReadyLocked(call);
}

LeaseWaitRoom::Turn LeaseWaitRoom::Next() {
  absl::MutexLock lock(&mu_);
  while (true) {
    const absl::Time now = clock_->Now();
    while (!parked_.empty() && parked_.begin()->first <= now) {
      Call* due = parked_.begin()->second;
      UnparkLocked(due);
      MakeReadyLocked(due);
    }
    if (next_scan_ <= now) {
      Turn scan{nullptr, true, {}};
      scan.idle_polls.reserve(idle_polls_.size());
      for (const auto& [executor_id, call] : idle_polls_) scan.idle_polls.push_back(executor_id);
      next_scan_ = idle_polls_.empty() ? absl::InfiniteFuture() : now + scan_period_;
      return scan;
    }
    if (!ready_.empty()) {
      Call* call = ready_.front();
      ready_.pop_front();
      call->state = Call::State::kServing;
      return {call, false, {}};
    }
    if (closed_) return {};
    auto runnable = [this] {
      mu_.AssertHeld();
      return !ready_.empty() || closed_;
    };
    absl::Time due = next_scan_;
    if (!parked_.empty()) due = std::min(due, parked_.begin()->first);
    if (due == absl::InfiniteFuture()) {
      mu_.Await(absl::Condition(&runnable));  // nothing due on the clock: no clock waiter
    } else {
      clock_->AwaitWithDeadline(mu_, absl::Condition(&runnable), due);
    }
  }
}

void LeaseWaitRoom::ServingEnded(bool spreads) {
  if (!spreads) return;
  absl::MutexLock lock(&mu_);
  --spreading_;
}

LeaseWaitRoom::Look LeaseWaitRoom::BeginLook(Call* call) {
  absl::MutexLock lock(&mu_);
  Look look;
  look.cancelled = call->cancelled;
  look.others_spreading = spreading_ - (call->spreads ? 1 : 0);
  if (look.cancelled) return look;
  auto it = notices_.find(call->executor_id);
  if (it == notices_.end()) return look;
  // A renewal found it drained or unknown: it hears that now, instead of work.
  look.notice = it->second;
  notices_.erase(it);
  call->state = Call::State::kFinished;
  FinishLocked(call);
  return look;
}

LeaseWaitRoom::AfterLook LeaseWaitRoom::EndLook(Call* call, uint64_t generation,
                                                std::optional<absl::Time> wait_until) {
  absl::MutexLock lock(&mu_);
  if (!call->cancelled && wait_until && !stopping_) {
    if (generation != generation_ || notices_.contains(call->executor_id)) {
      // Work was announced while it looked (it looks again), or a renewal found something the
      // executor must hear (told at its next look).
      MakeReadyLocked(call);
      return AfterLook::kWaiting;
    }
    ParkLocked(call, *wait_until);
    return AfterLook::kWaiting;
  }
  call->state = Call::State::kFinished;
  FinishLocked(call);
  return call->cancelled ? AfterLook::kCancelled : AfterLook::kAnswer;
}

bool LeaseWaitRoom::Cancel(Call* call) {
  absl::MutexLock lock(&mu_);
  call->cancelled = true;
  if (call->state != Call::State::kParked) return false;  // whoever holds it answers it
  UnparkLocked(call);
  call->state = Call::State::kFinished;
  FinishLocked(call);
  return true;
}

void LeaseWaitRoom::Tell(const std::string& executor_id, Notice notice) {
  absl::MutexLock lock(&mu_);
  // Kept only while an idle poll of the executor is held here (a later renewal tells a later poll
  // again): never told to a poll made after the executor has moved on.
  auto it = idle_polls_.find(executor_id);
  if (it == idle_polls_.end()) return;
  Notice& kept = notices_[executor_id];
  kept.drain = kept.drain || notice.drain;
  kept.reregister = kept.reregister || notice.reregister;
  Call* call = it->second;
  if (call->state != Call::State::kParked) return;  // heard at its next look
  UnparkLocked(call);
  MakeReadyLocked(call);
}

void LeaseWaitRoom::ForgetNotice(const std::string& executor_id) {
  absl::MutexLock lock(&mu_);
  notices_.erase(executor_id);
}

bool LeaseWaitRoom::Polling(const std::string& executor_id) const {
  absl::MutexLock lock(&mu_);
  return idle_polls_.contains(executor_id);
}

bool LeaseWaitRoom::AnyParkedIdlePollBut(const std::string& producer) const {
  absl::MutexLock lock(&mu_);
  // O(1): at most one parked idle poll is the producer's (its latest).
  if (parked_idle_.size() != 1) return !parked_idle_.empty();
  return (*parked_idle_.begin())->executor_id != producer;
}

bool LeaseWaitRoom::WakeOneIdlePollBut(const std::string& producer) {
  absl::MutexLock lock(&mu_);
  // Looks at two at most: only one of them may be the producer's.
  for (Call* call : parked_idle_) {
    if (call->executor_id == producer) continue;
    notices_[call->executor_id];  // an empty notice: answered at once, with no work
    UnparkLocked(call);
    MakeReadyLocked(call);
    return true;
  }
  return false;
}

bool LeaseWaitRoom::AwaitAnnouncement(uint64_t generation, absl::Time wake) {
  absl::MutexLock lock(&mu_);
  auto notified = [&] {
    mu_.AssertHeld();
    return generation_ != generation || stopping_;
  };
  clock_->AwaitWithDeadline(mu_, absl::Condition(&notified), wake);
  return stopping_;
}

int64_t LeaseWaitRoom::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(parked_.size());
}

void LeaseWaitRoom::MakeReadyLocked(Call* call) {
  call->state = Call::State::kReady;
  if (call->spreads) ++spreading_;  // until its serving ends (ServingEnded)
  ready_.push_back(call);
}

void LeaseWaitRoom::WakeParkedLocked() {
  for (const auto& [wake, call] : parked_) MakeReadyLocked(call);
  parked_.clear();
  parked_idle_.clear();
}

void LeaseWaitRoom::ParkLocked(Call* call, absl::Time wake_at) {
  call->state = Call::State::kParked;
  call->wake_at = wake_at;
  parked_.emplace(wake_at, call);
  if (call->idle) {
    auto it = idle_polls_.find(call->executor_id);
    if (it != idle_polls_.end() && it->second == call) parked_idle_.insert(call);
  }
}

void LeaseWaitRoom::UnparkLocked(Call* call) {
  parked_.erase({call->wake_at, call});
  parked_idle_.erase(call);
}

void LeaseWaitRoom::FinishLocked(Call* call) {
  if (!call->idle) return;
  auto it = idle_polls_.find(call->executor_id);
  if (it == idle_polls_.end() || it->second != call) return;
  idle_polls_.erase(it);
  notices_.erase(call->executor_id);  // not heard: a later poll's renewal tells it again
}

}  // namespace minions
