#pragma once
// CompletionPipeline: the ends of executors' attempts on their way to the store, and what follows
// from them. Completions of every executor that arrive while one batch commits are checked against
// one read of their tasks and written in one store transaction (group commit:
// ChunkChecker::CompleteMany), each caller answered with its own outcomes; a failure is written
// alone. After the store answers it does what follows, without reading the jobs (their specs come
// from the ChunkChecker's JobSpecCache): metrics, task-size samples (server/task_sizer.h), work
// announced when a task of a team with a running-task quota ended (its place may let the team's
// queued tasks be leased), and the jobs left ready to finalise reported.
// Owns: the completions' committer thread ("done-commit"), the sampler, and what it knows of the
// teams' quotas (under its own lock).
// Threads: thread-safe. The follow-ups of a completion run on the committer's thread; those of a
// failure on its caller's.

#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "server/chunk_check.h"
#include "server/group_commit.h"
#include "server/server_metrics.h"
#include "server/task_sizer.h"
#include "store/metadata_store.h"

namespace minions {

class CompletionPipeline {
 public:
  // What follows from the store's answers, told to the service: `work_arrived` when a freed place
  // may let queued tasks be leased (or a failed task went back to pending), `job_ready` when a job
  // is ready to finalise. `metrics` may be null. `batch`: most executors' completions in one store
  // transaction (1: each alone).
  struct Hooks {
    std::function<void()> work_arrived;
    std::function<void(const std::string& job_id)> job_ready;
  };
  CompletionPipeline(MetadataStore* store, Clock* clock, ChunkChecker* chunks, ServerMetrics* metrics, int batch,
                     Hooks hooks);

  // Completes `reports` of `executor_id` without waiting: `done` gets one status per report (or
  // why none was committed) when their batch commits, on the committer's thread.
  using Outcomes = std::vector<absl::Status>;
  void Submit(const std::string& executor_id, std::vector<LeaseProgress> reports,
              absl::AnyInvocable<void(absl::StatusOr<Outcomes>) &&> done);
  // The same, waiting for the answer on this thread.
  absl::StatusOr<Outcomes> Complete(const std::string& executor_id, const std::vector<LeaseProgress>& reports);
  // Fails the attempt `ref` of `executor_id` (its chunks committed first, when they extend the
  // task's prefix); the task as it is afterwards.
  absl::StatusOr<Task> Fail(const std::string& executor_id, const LeaseProgress& ref, FailureClass failure,
                            const std::string& message);

  // Whether a team's quota is looked up again (QuotaFreed) at most this often.
  static constexpr absl::Duration kTeamQuotaRecheck = absl::Seconds(10);
  // Store lookups of teams' quotas so far (tests).
  int64_t quota_lookups() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Commits `calls` (chunks checked, one store transaction) and does what follows. One answer per
  // call; an error when the batch as a whole failed.
  absl::StatusOr<std::vector<absl::StatusOr<Outcomes>>> Commit(const std::vector<CompletionCall>& calls);
  // A task of a job of `team` ended (completed, or failed for good). When the team has a
  // running-task quota, the place it freed may let the team's queued tasks be leased: announced as
  // work. Whether a team has a quota is looked up at most once per kTeamQuotaRecheck.
  void QuotaFreed(const std::string& team) ABSL_LOCKS_EXCLUDED(mu_);

  MetadataStore* const store_;
  Clock* const clock_;
  ChunkChecker* const chunks_;
  ServerMetrics* const metrics_;
  const Hooks hooks_;
  // Which completions are measured for task sizes (server/task_sizer.h).
  CompletionSampler sampler_;
  mutable absl::Mutex mu_;
  // Whether each team has a running-task quota, as of checked_at.
  struct TeamQuota {
    bool limited = false;
    absl::Time checked_at;
  };
  absl::flat_hash_map<std::string, TeamQuota> team_quotas_ ABSL_GUARDED_BY(mu_);
  int64_t quota_lookups_ ABSL_GUARDED_BY(mu_) = 0;
  // Last: built after, and ended (its queue committed) before, what its commits use.
  GroupCommitter<CompletionCall, Outcomes> completions_;
};

}  // namespace minions
