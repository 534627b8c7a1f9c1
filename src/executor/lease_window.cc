#include "executor/lease_window.h"

#include <cmath>

namespace minions {

LeaseWindow::LeaseWindow(Options options) : options_(options) {}

int LeaseWindow::Size() const {
  // Enough tasks to cover prefetch_target beyond the one running; at least two so the runner
  // always has the next task queued.
  const int most = std::max(1, options_.max_prefetch);
  double want = 1 + absl::ToDoubleSeconds(options_.prefetch_target) / std::max(avg_task_seconds_, 1e-3);
  return std::clamp(static_cast<int>(std::ceil(want)), std::min(2, most), most);
}

void LeaseWindow::TaskTook(absl::Duration took) {
  avg_task_seconds_ = 0.8 * avg_task_seconds_ + 0.2 * absl::ToDoubleSeconds(took);
}

bool LeaseWindow::Due(int held, absl::Time now) const {
  // Top up when half the window is free (one lease call brings several tiny tasks); an
  // unanswered call is asked again (reclaimed) at once.
  if (held > Size() / 2 && !unheard_) return false;
  if (now < next_try_) return false;
  return !(held > 0 && now - last_empty_ < kDryQueueAsk);
}

absl::Time LeaseWindow::NextAsk(int held) const {
  if (held > Size() / 2 && !unheard_) return absl::InfiniteFuture();
  return std::max(next_try_, held > 0 ? last_empty_ + kDryQueueAsk : absl::InfinitePast());
}

AgentLeaseAsk LeaseWindow::Ask(int held) const {
  AgentLeaseAsk ask;
  ask.max_tasks = std::max(Size() - held, 1);
  // An idle executor long-polls: the server answers the moment a task is ready, so a submission
  // starts without a polling delay.
  if (held == 0) ask.wait = options_.lease_wait;
  ask.reclaim = unheard_;
  return ask;
}

void LeaseWindow::Failed(const absl::Status& why, absl::Time asked_at, absl::Time now) {
  // Unless the server refused the call, it may have granted tasks before the answer was lost.
  const absl::StatusCode code = why.code();
  if (code != absl::StatusCode::kNotFound && code != absl::StatusCode::kPermissionDenied &&
      code != absl::StatusCode::kUnauthenticated && code != absl::StatusCode::kInvalidArgument) {
    unheard_ = true;
  }
  last_empty_ = asked_at;
  next_try_ = now + options_.idle_poll;  // do not hammer a server that is down
}

void LeaseWindow::Answered(const AgentLeaseAsk& ask, size_t granted, absl::Time asked_at, absl::Time now) {
  unheard_ = false;
  if (granted > 0) return;
  last_empty_ = asked_at;
  // A server that answered a long poll early (an older one, or one shutting down) must not turn
  // the main loop into a busy one.
  if (ask.wait > absl::ZeroDuration() && now - asked_at < options_.lease_wait / 2) {
    next_try_ = now + options_.idle_poll;
  }
}

}  // namespace minions
