#pragma once
// ServerMetrics: the control plane's in-process counters and histograms, declared in one place,
// and what it must remember to observe them: when each lease it granted began, each job's team
// and submission time, whether each executor has a GPU. Counters are per server process; with
// several servers Prometheus sums them (sum(rate(...))).
//
// Observed where the events happen: JobService calls JobSubmitted, ExecutorService calls
// LeaseGranted / AttemptCompleted / AttemptFailed. Gauges read from the store (jobs, tasks, executors by state) live in
// dashboard/FleetView, not here.
//
// Ownership: registers its metrics in the Registry it is given (which must outlive it); borrows
// the store for the team and device look-ups (once per job / executor, then cached).
// Threads: thread-safe.

#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "metrics/metrics.h"
#include "model/types.h"
#include "store/metadata_store.h"

namespace minions {

class ServerMetrics {
 public:
  ServerMetrics(metrics::Registry* registry, MetadataStore* store);

  // A job was submitted here: its team's record counters exist from now on (at zero), so that
  // rate() over them sees the job's first records.
  void JobSubmitted(const Job& job) ABSL_LOCKS_EXCLUDED(mu_);
  // A lease this server granted at `now` (`task` as granted: attempt already bumped).
  void LeaseGranted(const Task& task, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // The store accepted a completion.
  void AttemptCompleted(const std::string& executor_id, const LeaseProgress& report, absl::Time now);
  // The store accepted a failure report; `after` is the task as it is now.
  void AttemptFailed(const std::string& executor_id, const Task& after, FailureClass failure, absl::Time now);
  // A heartbeat was answered `took` (wall time) after its handler started: its wait for a batch
  // and the batch's write (the server's part of the executor's heartbeat latency).
  void HeartbeatAnswered(absl::Duration took);
  // The chunk check admitted a chunk of `team`'s job whose output lines state `tokens` (their
  // response.body.usage): tokens per second by team, as the answers come in.
  void TokensAdmitted(const std::string& team, const TokenUsage& tokens) ABSL_LOCKS_EXCLUDED(mu_);
  // Every token admitted by this process so far, by team (the dashboard's tokens per step).
  std::map<std::string, TokenUsage> TokensAdmittedSoFar() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct JobInfo {
    std::string team;
    absl::Time created_at;
  };
  struct Granted {
    absl::Time at;
    std::string team;
  };
  using AttemptKey = std::tuple<std::string, int64_t, int>;  // job, task index, attempt

  JobInfo JobInfoOf(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  void RememberJob(const std::string& job_id, const JobInfo& info) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The executor's device class ("gpu" or "cpu") and kind (its reported accelerator: "metal",
  // "cuda", "cpu"), from the capabilities it registered with.
  struct Device {
    std::string device;
    std::string kind;
  };
  Device DeviceOf(const std::string& executor_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets the attempt; its grant, if this server granted it.
  std::optional<Granted> TakeGrant(const AttemptKey& key) ABSL_LOCKS_EXCLUDED(mu_);
  void ObserveAttemptTime(const std::string& executor_id, const std::optional<Granted>& grant, absl::Time now,
                          bool completed);

  MetadataStore* store_;
  metrics::Counter* leases_granted_;
  metrics::Family<metrics::Counter>* attempts_;
  metrics::Family<metrics::Counter>* records_succeeded_;
  metrics::Family<metrics::Counter>* records_failed_;
  metrics::Family<metrics::Counter>* harvested_seconds_;
  metrics::Family<metrics::Counter>* tokens_;
  metrics::Histogram* task_duration_;
  metrics::Histogram* queue_wait_;
  metrics::Histogram* heartbeat_time_;

  absl::Mutex mu_;
  std::map<AttemptKey, Granted> grants_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, JobInfo> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Device> devices_ ABSL_GUARDED_BY(mu_);  // executor id -> its device
  // Executor id -> when the last attempt of it observed here ended: an executor runs one attempt
  // at a time, so an attempt that waited in its queue counts from then, not from its grant (as
  // the store charges device time, store_rules ChargedUntil).
  std::map<std::string, absl::Time> charged_until_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, TokenUsage> tokens_admitted_ ABSL_GUARDED_BY(mu_);  // team -> tokens so far
};

}  // namespace minions
