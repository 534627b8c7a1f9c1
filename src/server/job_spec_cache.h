#pragma once
// JobSpecCache: what a server needs of a job after one of its tasks completes (its team, its model
// and runner, its input) without a store read per completion: a job's spec never changes once it
// is created, so it is read from the store on a miss and kept. Bounded: at most `capacity` jobs,
// the one read longest ago forgotten first (read again if needed).
// Threads: thread-safe.

#include <cstddef>
#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "model/types.h"
#include "store/metadata_store.h"

namespace minions {

class JobSpecCache {
 public:
  explicit JobSpecCache(MetadataStore* store, size_t capacity = 10000) : store_(store), capacity_(capacity) {}

  // The spec of job `job_id`; the store's error (NotFound for an unknown job) on a miss it could
  // not fill.
  absl::StatusOr<std::shared_ptr<const JobSpec>> Get(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Store reads made so far (tests: a completion of a known job makes none).
  int64_t misses() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  MetadataStore* const store_;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const JobSpec>> specs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // the cached jobs, oldest first
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace minions
