#include "server/job_spec_cache.h"

#include <utility>

namespace minions {

absl::StatusOr<std::shared_ptr<const JobSpec>> JobSpecCache::Get(const std::string& job_id) {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = specs_.find(job_id); it != specs_.end()) return it->second;
    ++misses_;
  }
  absl::StatusOr<Job> job = store_->GetJob(job_id);
  if (!job.ok()) return job.status();
  auto spec = std::make_shared<const JobSpec>(std::move(job->spec));
  absl::MutexLock lock(&mu_);
  if (specs_.emplace(job_id, spec).second) {
    order_.push_back(job_id);
    while (order_.size() > capacity_) {
      specs_.erase(order_.front());
      order_.pop_front();
    }
  }
  return spec;
}

int64_t JobSpecCache::misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}

}  // namespace minions
