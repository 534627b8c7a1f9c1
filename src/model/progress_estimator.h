#pragma once
// How far a job is and how fast it goes now: the one estimate behind `minions watch`, the
// dashboard and the metrics.
//
// - Done: the records of ended attempts (the job's counts) plus those running attempts have done
//   so far (their tasks' records_done, which heartbeats and checkpoints move record by record),
//   never more than the job's total. So progress moves per record, not a whole task at a time.
// - Rate: recent, not an average since the start: the records done over the last `window`,
//   measured between the latest sample at least `window` old and now. Until the estimator has
//   seen that far back, its oldest point is the job's start (nothing done at started_at): a young
//   job's rate is its average so far. A job that ended: its average over its whole run.
// - ETA: what is left at that rate; 0 once the job has ended; -1 while unknown (nothing done yet).
//
// ProgressEstimator follows one job: pure, no clock reads (each sample brings its `now`), not
// thread-safe. ProgressTracker keeps one per unfinished job for a whole server, so every reader
// (a watch stream, a dashboard refresh, a scrape) feeds and reads the same samples. Thread-safe.

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "model/types.h"

namespace minions {

struct ProgressEstimate {
  int64_t finished = 0;   // completed + failed records (ended attempts)
  int64_t in_flight = 0;  // done by running attempts, not yet reported complete
  int64_t done = 0;       // finished + in_flight, at most the job's total
  double fraction = 0;    // done / total, 0..1
  double records_per_second = 0;
  double eta_seconds = -1;  // -1: unknown; 0: ended
};

class ProgressEstimator {
 public:
  static constexpr absl::Duration kDefaultWindow = absl::Seconds(60);
  explicit ProgressEstimator(absl::Duration window = kDefaultWindow) : window_(window) {}

  // Takes a sample of `job` as of `now` (`in_flight`: the records_done of its running tasks) and
  // answers the estimate. Samples older than the window (but the one that spans it) are dropped.
  ProgressEstimate Observe(const Job& job, int64_t in_flight, absl::Time now);

 private:
  const absl::Duration window_;
  std::deque<std::pair<absl::Time, int64_t>> samples_;  // (when, done), oldest first
};

class ProgressTracker {
 public:
  explicit ProgressTracker(absl::Duration window = ProgressEstimator::kDefaultWindow) : window_(window) {}

  // ProgressEstimator::Observe on this job's estimator (made on first sight). A job that has ended
  // is answered and forgotten; so is, on the way, any job not sampled for a few windows.
  ProgressEstimate Observe(const Job& job, int64_t in_flight, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Followed {
    ProgressEstimator estimator;
    absl::Time last_seen;
  };
  const absl::Duration window_;
  absl::Mutex mu_;
  std::map<std::string, Followed> jobs_ ABSL_GUARDED_BY(mu_);
  absl::Time last_pruned_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace minions
