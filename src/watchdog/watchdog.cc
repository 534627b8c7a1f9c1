#include "watchdog/watchdog.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace minions {

void Watchdog::Resume(std::unique_ptr<WatchdogLock> lock) {
  lock_ = std::move(lock);
  active_since_.reset();
}

absl::StatusOr<WatchdogPass> Watchdog::Tick(absl::Time now) {
  if (lock_ == nullptr) {
    return absl::FailedPreconditionError("this process does not hold the watchdog lock; it acts no more");
  }
  if (absl::Status held = lock_->Check(); !held.ok()) {
    lock_.reset();
    MINIONS_LOG(Warning) << "watchdog stopped: " << held.message();
    return absl::FailedPreconditionError(absl::StrCat("this process lost the watchdog lock: ", held.message()));
  }
  WatchdogPass pass;
  std::set<std::string> jobs;
  if (!active_since_) active_since_ = now;
  pass.in_grace = now < *active_since_ + options_.takeover_grace;
  auto expired = pass.in_grace ? absl::StatusOr<std::vector<Task>>(std::vector<Task>{})
                               : store_->ExpireLeases(now, options_.batch);
  if (!expired.ok()) return expired.status();
  for (const Task& task : *expired) {
    ++pass.leases_expired;
    if (task.state == TaskState::kFailed) ++pass.tasks_failed;
    jobs.insert(task.job_id);
    MINIONS_LOG(Info) << "job=" << task.job_id << " task=" << task.index << " lease expired; now "
                      << TaskStateName(task.state) << " (" << task.last_error << ")";
  }
  auto lost = pass.in_grace ? absl::StatusOr<std::vector<Executor>>(std::vector<Executor>{})
                            : store_->MarkLostExecutors(now - options_.executor_timeout, now);
  if (!lost.ok()) return lost.status();
  for (const Executor& e : *lost) {
    ++pass.executors_lost;
    MINIONS_LOG(Warning) << "executor=" << e.id << " (" << e.info.name << ") lost: no heartbeat since "
                         << absl::FormatTime(e.last_heartbeat_at);
  }
  // Deadlines (a job whose completion window has passed ends `expired` with what it finished) and
  // stragglers: a sweep over every unfinished job, so not on every pass; both act on a scale of
  // minutes, the pass runs twice a second.
  const bool sweep = now - last_job_sweep_ >= options_.job_sweep_interval;
  if (sweep) last_job_sweep_ = now;
  for (JobState state : {JobState::kValidating, JobState::kQueued, JobState::kRunning}) {
    if (!sweep) break;
    JobFilter filter;
    filter.state = state;
    filter.limit = 10000;
    auto active = store_->ListJobs(filter);
    if (!active.ok()) return active.status();
    for (const Job& job : *active) {
      if (state == JobState::kValidating && now - job.created_at >= options_.validation_timeout) {
        if (absl::Status s = FailOrphanedValidation(job, now, pass); !s.ok()) return s;
        continue;
      }
      if (state == JobState::kRunning && options_.backups && !DeadlinePassed(job, now)) {
        if (absl::Status s = BackUpStragglers(job, now, pass); !s.ok()) return s;
      }
      if (!DeadlinePassed(job, now)) continue;
      auto expired_job = store_->ExpireJob(job.id, now);
      if (absl::IsFailedPrecondition(expired_job.status())) continue;  // it finished meanwhile
      if (!expired_job.ok()) return expired_job.status();
      ++pass.jobs_expired;
      jobs.insert(job.id);
      MINIONS_LOG(Info) << "job=" << job.id << " expired: " << expired_job->error << "; "
                        << expired_job->counts.completed << " records finished";
    }
  }
  pass.jobs_touched.assign(jobs.begin(), jobs.end());
  if (leases_expired_) {
    leases_expired_->Increment(pass.leases_expired);
    actions_->With({"requeue_task"})->Increment(pass.leases_expired - pass.tasks_failed);
    actions_->With({"fail_task"})->Increment(pass.tasks_failed);
    actions_->With({"mark_executor_lost"})->Increment(pass.executors_lost);
    actions_->With({"expire_job"})->Increment(pass.jobs_expired);
    actions_->With({"fail_orphaned_validation"})->Increment(pass.jobs_orphaned);
    actions_->With({"back_up_straggler"})->Increment(pass.backups_requested);
  }
  return pass;
}

absl::Status Watchdog::FailOrphanedValidation(const Job& job, absl::Time now, WatchdogPass& pass) {
  std::string reason = absl::StrCat("validation did not finish within ", absl::FormatDuration(options_.validation_timeout),
                                    " of submission (the server validating the input stopped before it ended); "
                                    "submit the job again");
  auto failed = store_->FailJob(job.id, reason, now);
  if (absl::IsFailedPrecondition(failed.status())) return absl::OkStatus();  // it ended meanwhile
  if (!failed.ok()) return failed.status();
  ++pass.jobs_orphaned;
  MINIONS_LOG(Warning) << "job=" << job.id << " failed: " << reason;
  return absl::OkStatus();
}

absl::Status Watchdog::BackUpStragglers(const Job& job, absl::Time now, WatchdogPass& pass) {
  // Only near the end of a job: nothing pending, something running (cheap counts first).
  auto counts = store_->CountTasks(job.id);
  if (!counts.ok()) return counts.status();
  if (counts->pending > 0 || counts->running == 0) return absl::OkStatus();
  auto tasks = store_->ListTasks(job.id);
  if (!tasks.ok()) return tasks.status();
  for (int64_t index : FindStragglers(*tasks, options_.stragglers, now)) {
    auto it = std::find_if(tasks->begin(), tasks->end(), [&](const Task& t) { return t.index == index; });
    if (it == tasks->end()) continue;
    const Task& task = *it;
    auto backed = store_->RequestBackup(job.id, index, task.attempt, now);
    if (absl::IsFailedPrecondition(backed.status())) continue;  // it finished or moved meanwhile
    if (!backed.ok()) return backed.status();
    ++pass.backups_requested;
    MINIONS_LOG(Info) << "job=" << job.id << " task=" << index << " attempt=" << task.attempt << " on executor="
                      << task.executor_id << " straggles (" << absl::FormatDuration(now - *task.started_at)
                      << "); a backup attempt may run elsewhere";
  }
  return absl::OkStatus();
}

void Watchdog::ExportMetrics(metrics::Registry* registry) {
  leases_expired_ = registry->AddCounter("minions_leases_expired_total",
                                         "Leases the watchdog found expired (their holder stopped heartbeating).");
  actions_ = registry->AddCounterFamily(
      "minions_watchdog_actions_total",
      "What the watchdog did: requeue_task (an expired lease, retried elsewhere), fail_task (an expired "
      "lease that used up the task's attempts), mark_executor_lost (missed heartbeats), expire_job (its "
      "completion window passed), back_up_straggler (a backup attempt for a task far slower than its peers), "
      "fail_orphaned_validation (a job left validating by a server that stopped).",
      {"action"});
  // Zero series from the start, so rate() and dashboards see them before the first action.
  for (const char* action :
       {"requeue_task", "fail_task", "mark_executor_lost", "expire_job", "back_up_straggler",
        "fail_orphaned_validation"}) {
    actions_->With({action});
  }
}

}  // namespace minions
