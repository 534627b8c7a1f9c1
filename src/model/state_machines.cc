#include "model/state_machines.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace minions {

bool IsAllowed(JobState from, JobState to) {
  using S = JobState;
  if (IsTerminal(from)) return false;
  switch (to) {
    case S::kValidating: return false;
    case S::kQueued: return from == S::kValidating;
    case S::kRunning: return from == S::kQueued;
    case S::kFinalizing: return from == S::kQueued || from == S::kRunning;
    case S::kCompleted: return from == S::kFinalizing;
    case S::kFailed: return true;
    case S::kCancelled: return true;
    case S::kExpired: return from == S::kQueued || from == S::kRunning || from == S::kValidating;
  }
  return false;
}

bool IsAllowed(TaskState from, TaskState to) {
  using S = TaskState;
  switch (from) {
    case S::kPending: return to == S::kRunning || to == S::kCancelled || to == S::kFailed;
    case S::kRunning:
      return to == S::kPending || to == S::kSucceeded || to == S::kFailed || to == S::kCancelled;
    default: return false;
  }
}

absl::Status GrantTask(Task& task, const std::string& executor_id, absl::Duration ttl, absl::Time now) {
  if (task.state != TaskState::kPending) {
    return absl::FailedPreconditionError(absl::StrCat("task ", task.job_id, "/", task.index, " is ",
                                                      std::string(TaskStateName(task.state)), ", not pending"));
  }
  if (task.not_before && *task.not_before > now) {
    return absl::FailedPreconditionError("task is backing off after a failure");
  }
  task.state = TaskState::kRunning;
  task.attempt += 1;
  task.executor_id = executor_id;
  task.lease_expires_at = now + ttl;
  task.not_before.reset();
  task.records_done = 0;
  task.records_failed = 0;
  task.started_at = now;
  return absl::OkStatus();
}

absl::Status CheckFence(const Task& task, const std::string& executor_id, int attempt) {
  if (task.state != TaskState::kRunning) {
    return absl::FailedPreconditionError(absl::StrCat(
        "task ", task.job_id, "/", task.index, " is ", std::string(TaskStateName(task.state)),
        "; attempt ", attempt, " no longer holds a lease"));
  }
  if (task.attempt != attempt || task.executor_id != executor_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stale attempt: task ", task.job_id, "/", task.index, " is on attempt ", task.attempt,
        " held by ", task.executor_id, "; this report is for attempt ", attempt, " from ", executor_id));
  }
  return absl::OkStatus();
}

absl::Status CompleteTask(Task& task, int64_t records_done, int64_t records_failed, absl::Time now) {
  if (task.state != TaskState::kRunning) {
    return absl::FailedPreconditionError(absl::StrCat("task ", task.job_id, "/", task.index, " is ",
                                                      std::string(TaskStateName(task.state)),
                                                      "; only a running task can complete"));
  }
  if (records_done != task.n_records || records_failed < 0 || records_failed > records_done) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a completed task must account for all ", task.n_records, " records (got ", records_done,
        " done, ", records_failed, " failed)"));
  }
  task.state = TaskState::kSucceeded;
  task.records_done = records_done;
  task.records_failed = records_failed;
  task.lease_expires_at.reset();
  task.finished_at = now;
  return absl::OkStatus();
}

absl::Status FailTask(Task& task, FailureClass failure, const std::string& message, int max_attempts,
                      const RetryPolicy& policy, absl::Time now) {
  if (task.state != TaskState::kRunning) {
    return absl::FailedPreconditionError("only a running task can fail");
  }
  task.last_error = message;
  task.lease_expires_at.reset();
  task.records_done = 0;
  task.records_failed = 0;
  switch (failure) {
    case FailureClass::kPreempted:
      task.preemptions += 1;
      task.state = TaskState::kPending;
      task.not_before.reset();
      return absl::OkStatus();
    case FailureClass::kPermanent:
      task.failures += 1;
      task.state = TaskState::kFailed;
      task.finished_at = now;
      return absl::OkStatus();
    case FailureClass::kRetryable:
      task.failures += 1;
      if (task.failures >= max_attempts) {
        task.state = TaskState::kFailed;
        task.finished_at = now;
        task.last_error = absl::StrCat("failed ", task.failures, " times; last: ", message);
        return absl::OkStatus();
      }
      task.state = TaskState::kPending;
      absl::Duration wait = policy.backoff_base;
      for (int i = 1; i < task.failures && wait < policy.backoff_cap; ++i) wait *= 2;
      task.not_before = now + std::min(wait, policy.backoff_cap);
      return absl::OkStatus();
  }
  return absl::InternalError("unknown failure class");
}

absl::Status ExpireLease(Task& task, int max_attempts, const RetryPolicy& policy, absl::Time now) {
  if (task.state != TaskState::kRunning || !task.lease_expires_at || *task.lease_expires_at > now) {
    return absl::FailedPreconditionError("lease has not expired");
  }
  std::string holder = task.executor_id;
  return FailTask(task, FailureClass::kRetryable,
                  absl::StrCat("lease of attempt ", task.attempt, " expired (executor ", holder,
                               " stopped heartbeating)"),
                  max_attempts, policy, now);
}

void CancelTask(Task& task, absl::Time now) {
  if (IsTerminal(task.state)) return;
  task.state = TaskState::kCancelled;
  task.lease_expires_at.reset();
  task.finished_at = now;
}

void AccountTerminalTask(Job& job, const Task& task, absl::Time now) {
  CountTerminalTask(job, task, now);
  SettleJob(job, task.last_error, now);
}

void CountTerminalTask(Job& job, const Task& task, absl::Time now) {
  job.tasks_done += 1;
  if (task.state == TaskState::kSucceeded) job.tasks_succeeded += 1;
  job.updated_at = now;
  if (task.state == TaskState::kSucceeded) {
    job.counts.completed += task.records_done - task.records_failed;
    job.counts.failed += task.records_failed;
  } else if (task.state == TaskState::kFailed) {
    job.counts.failed += task.n_records;
  }
}

bool SettleJob(Job& job, const std::string& last_error, absl::Time now) {
  if (job.tasks_done < job.n_tasks || IsTerminal(job.state) || job.state == JobState::kFinalizing) return false;
  if (job.tasks_succeeded == 0 && job.state != JobState::kCancelled) {
    job.state = JobState::kFailed;
    job.error = absl::StrCat("every task failed; last error: ", last_error);
    job.finished_at = now;
  } else {
    job.state = JobState::kFinalizing;
  }
  job.updated_at = now;
  return true;
}

bool MarkJobStarted(Job& job, absl::Time now) {
  if (job.state != JobState::kQueued && job.started_at) return false;
  if (job.state == JobState::kQueued) job.state = JobState::kRunning;
  if (!job.started_at) job.started_at = now;
  job.updated_at = now;
  return true;
}

}  // namespace minions
