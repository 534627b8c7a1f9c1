#include "model/progress_estimator.h"

#include <algorithm>

#include "model/state_machines.h"

namespace minions {

ProgressEstimate ProgressEstimator::Observe(const Job& job, int64_t in_flight, absl::Time now) {
  ProgressEstimate e;
  const bool ended = IsTerminal(job.state);
  e.finished = job.counts.completed + job.counts.failed;
  e.in_flight = ended ? 0 : std::max<int64_t>(0, in_flight);
  e.done = std::min(job.counts.total, e.finished + e.in_flight);
  e.fraction = job.counts.total > 0 ? static_cast<double>(e.done) / static_cast<double>(job.counts.total)
                                    : (job.state == JobState::kCompleted ? 1.0 : 0.0);
  if (ended) {
    // Its whole run, start to end.
    samples_.clear();
    e.eta_seconds = 0;
    if (job.started_at) {
      const double seconds = absl::ToDoubleSeconds(job.finished_at.value_or(now) - *job.started_at);
      if (seconds > 0) e.records_per_second = static_cast<double>(e.done) / seconds;
    }
    return e;
  }
  if (!samples_.empty() && now <= samples_.back().first) {
    samples_.back().second = e.done;  // the same instant, seen again
  } else {
    samples_.emplace_back(now, e.done);
  }
  // Keep one sample at least a window old (the anchor), and every newer one.
  while (samples_.size() >= 2 && samples_[1].first <= now - window_) samples_.pop_front();
  std::pair<absl::Time, int64_t> anchor = samples_.front();
  // Less than a window seen: from the job's start, when that is further back.
  if (anchor.first > now - window_ && job.started_at && *job.started_at < anchor.first) anchor = {*job.started_at, 0};
  if (now > anchor.first) {
    e.records_per_second = static_cast<double>(std::max<int64_t>(0, e.done - anchor.second)) /
                           absl::ToDoubleSeconds(now - anchor.first);
  }
  const int64_t left = job.counts.total - e.done;
  if (job.counts.total > 0 && left <= 0) {
    e.eta_seconds = 0;
  } else if (e.records_per_second > 0) {
    e.eta_seconds = static_cast<double>(left) / e.records_per_second;
  }
  return e;
}

ProgressEstimate ProgressTracker::Observe(const Job& job, int64_t in_flight, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (now - last_pruned_ >= window_) {
    // Jobs nobody asked about for a while (ended through another server, deleted).
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      it = now - it->second.last_seen > 3 * window_ ? jobs_.erase(it) : std::next(it);
    }
    last_pruned_ = now;
  }
  auto it = jobs_.try_emplace(job.id, Followed{ProgressEstimator(window_), now}).first;
  it->second.last_seen = now;
  ProgressEstimate estimate = it->second.estimator.Observe(job, in_flight, now);
  if (IsTerminal(job.state)) jobs_.erase(it);
  return estimate;
}

}  // namespace minions
