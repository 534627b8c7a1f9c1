#pragma once
// FleetView: what the fleet looks like now, read from the store and cached briefly, so scrapes,
// dashboard polls and several browsers cost one set of store reads per `max_age`. Feeds the
// gauges on /metrics (jobs, tasks and executors by state; each unfinished job's progress, rate
// and ETA; each team's fair-share weight, usage and running tasks) and the dashboard's JSON. Each refresh samples every unfinished job into the server's
// ProgressTracker (model/progress_estimator.h), the estimate `minions watch` reads too.
//
// Gauges derived here are the same on every server of a fleet (they read the shared store): in
// Prometheus use max() or pick one instance, never sum(), for the minions_jobs/tasks/executors
// families.
//
// Ownership: borrows the store, the clock and the progress tracker.
// It also records the fleet's history (executors by state, the queue's depth, each job's rate,
// each team's usage) for the dashboard's charts: a point per history_step, in the store
// (fleet_history.h), whether or not anyone watches: the server's history thread calls
// RecordHistory every step. Stored, the history outlives a restart and every server of a fleet
// shows the same one (each step is recorded once, by the first server to reach it); points older
// than kHistorySpan are removed as new ones come, so it stays bounded.
//
// Threads: thread-safe; one refresh at a time, callers during a refresh get its result.

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "dashboard/fleet_history.h"
#include "metrics/metrics.h"
#include "model/progress_estimator.h"
#include "model/types.h"
#include "store/metadata_store.h"

namespace minions {

struct FleetSnapshot {
  absl::Time taken_at;
  // Every job that has not ended, and the newest FleetView::kRecentJobs of the others; newest
  // first.
  std::vector<Job> jobs;
  std::vector<Executor> executors;
  std::map<std::string, std::vector<Task>> running_by_executor;  // executor id -> tasks it runs
  std::map<std::string, GangLease> gang_of;  // executor id -> the living gang it sits in (gang_store.h)
  std::map<std::string, int64_t> records_in_flight;              // job id -> progress of its running tasks
  std::map<std::string, ProgressEstimate> progress;               // job id -> its estimate, every job here
  std::map<std::string, std::map<TaskState, int64_t>> job_tasks; // unfinished job -> its tasks by state
  std::map<JobState, int64_t> jobs_by_state;  // ended states: as of the last terminal count
  std::map<TaskState, int64_t> tasks_by_state;  // tasks of jobs that have not ended
  std::map<ExecutorState, int64_t> executors_by_state;
  std::vector<TeamUsage> teams;  // every team's fair-share standing (model/fair_share.h)
  std::vector<ModelRecord> models;  // the registry, every team's (executors' models are shown by name)
};

class FleetView {
 public:
  static constexpr int kMaxJobs = 100000;  // per state listed
  static constexpr int kRecentJobs = 200;  // ended jobs shown on the dashboard
  static constexpr absl::Duration kStaleRecount = absl::Seconds(5);
  // How far back History() reaches.
  static constexpr absl::Duration kHistorySpan = absl::Hours(6);

  // Jobs that have not ended, executors and tasks are read every `max_age`. Counting the ended
  // jobs reads the whole job history, so it happens when a job has ended since the last count (at
  // most every kStaleRecount), and every `terminal_max_age` regardless.
  // A refresh in a later step (a multiple of `history_step` since the epoch) than the last point
  // recorded records one (RecordHistory).
  FleetView(MetadataStore* store, Clock* clock, ProgressTracker* progress, absl::Duration max_age = absl::Seconds(1),
            absl::Duration terminal_max_age = absl::Seconds(30), absl::Duration history_step = absl::Seconds(15))
      : store_(store),
        clock_(clock),
        progress_(progress),
        max_age_(max_age),
        terminal_max_age_(terminal_max_age),
        history_step_(history_step) {}

  absl::StatusOr<std::shared_ptr<const FleetSnapshot>> Get() ABSL_LOCKS_EXCLUDED(mu_);
  // Reads the fleet afresh unless this step has been read already, and records this step's point
  // (the server's history thread, every step). Errors: the store's.
  absl::Status RecordHistory() ABSL_LOCKS_EXCLUDED(mu_);
  // The fleet over the last kHistorySpan, oldest first: the stored points (one per step while a
  // server ran; none for a time when none did) and, when newer, the newest refresh last.
  absl::StatusOr<std::vector<FleetHistoryPoint>> History() ABSL_LOCKS_EXCLUDED(mu_);
  // Adds to the store's tokens per step what this server admitted since its last call
  // (`admitted_so_far`: team -> every token this process admitted), under the step that begins
  // now: the tokens of the step that has just ended, which every server adds its own to. A
  // failed write is retried whole at the next call: nothing is dropped. Called by the history
  // thread once a step. `stopping`: the server stops in the middle of a step, and what it
  // admitted since the step began would go with it: written now, under the step that ends next
  // (where the other servers add theirs of this step), so the chart misses none of it.
  absl::Status RecordTokens(const std::map<std::string, TokenUsage>& admitted_so_far, bool stopping = false)
      ABSL_LOCKS_EXCLUDED(tokens_mu_);
  absl::Duration history_step() const { return history_step_; }
  // Adds the store-derived gauges to `registry` (a collector reading Get()); minions_store_up is 0
  // when the store cannot be read.
  void ExportMetrics(metrics::Registry* registry);

 private:
  absl::StatusOr<std::shared_ptr<const FleetSnapshot>> Read() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the store into cached_ and records the step's point when it is a new step.
  absl::Status Refresh() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static FleetHistoryPoint PointOf(const FleetSnapshot& snapshot);
  void Collect(std::vector<metrics::FamilySnapshot>* out) ABSL_LOCKS_EXCLUDED(mu_);

  MetadataStore* store_;
  Clock* clock_;
  ProgressTracker* progress_;
  const absl::Duration max_age_;
  const absl::Duration terminal_max_age_;
  const absl::Duration history_step_;
  absl::Mutex tokens_mu_;
  std::map<std::string, TokenUsage> tokens_written_ ABSL_GUARDED_BY(tokens_mu_);  // RecordTokens's last total
  absl::Mutex mu_;  // held across a refresh: one at a time
  std::shared_ptr<const FleetSnapshot> cached_ ABSL_GUARDED_BY(mu_);
  // cached_ was read by RecordHistory, not for a request: Get reads afresh.
  bool cached_by_history_ ABSL_GUARDED_BY(mu_) = false;
  std::map<JobState, int64_t> terminal_counts_ ABSL_GUARDED_BY(mu_);
  absl::Time terminal_counted_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::set<std::string> active_ids_ ABSL_GUARDED_BY(mu_);  // jobs not ended at the last read
  bool terminal_stale_ ABSL_GUARDED_BY(mu_) = false;       // a job ended since terminal_counts_ was read
  absl::Time last_step_recorded_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Jobs seen running by the refreshes since the last point kept, with their last rate: a job that
  // starts and ends between two points is in the next one, not missing from the charts.
  std::map<std::string, FleetHistoryPoint::JobRate> jobs_since_point_ ABSL_GUARDED_BY(mu_);
};

}  // namespace minions
