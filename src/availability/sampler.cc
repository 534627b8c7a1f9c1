#include "availability/sampler.h"

namespace minions::availability {

Sampler::Sampler(std::vector<std::unique_ptr<Probe>> probes) {
  for (auto& p : probes) probes_.push_back({std::move(p), absl::InfinitePast()});
}

void Sampler::ReportActivity(absl::Time when) {
  std::lock_guard<std::mutex> lock(mu_);
  activity_ = std::max(activity_, when);
}

Snapshot Sampler::Sample(absl::Time now, bool all) {
  next_due_ = absl::InfiniteFuture();
  for (auto& e : probes_) {
    if (all || now >= e.due) {
      e.probe->Fill(&snapshot_, now);
      e.due = now + e.probe->cadence();
    }
    next_due_ = std::min(next_due_, e.due);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (activity_ != absl::InfinitePast()) snapshot_.owner_activity.Set(activity_, now, "reported by hand");
  return snapshot_;
}

}  // namespace minions::availability
