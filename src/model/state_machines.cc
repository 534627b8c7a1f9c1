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
    // Expiring goes through finalizing (the partial output is merged); a job still validating
    // has no output to merge.
    case S::kExpired: return from == S::kFinalizing || from == S::kValidating;
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
  if (task.shadow && task.shadow->executor_id == executor_id) {
    return absl::FailedPreconditionError("this executor runs the straggling attempt; its backup goes elsewhere");
  }
  task.state = TaskState::kRunning;
  task.attempt += 1;
  task.executor_id = executor_id;
  task.lease_expires_at = now + ttl;
  task.not_before.reset();
  task.records_done = CommittedRecords(task);
  task.records_failed = CommittedFailed(task);
  task.started_at = now;
  return absl::OkStatus();
}

bool FromShadow(const Task& task, int attempt) {
  return task.shadow && task.shadow->attempt == attempt &&
         (task.state == TaskState::kPending || (task.state == TaskState::kRunning && task.attempt != attempt));
}

bool DropShadow(Task& task, int attempt) {
  if (!FromShadow(task, attempt)) return false;
  task.shadow.reset();
  return true;
}

absl::Status RequestBackup(Task& task, absl::Time now) {
  if (task.state != TaskState::kRunning || task.shadow) {
    return absl::FailedPreconditionError(absl::StrCat("task ", task.job_id, "/", task.index, " is ",
                                                      std::string(TaskStateName(task.state)),
                                                      task.shadow ? " and has a backup already" : "",
                                                      "; only a running task gets a backup"));
  }
  task.shadow = Task::Shadow{task.attempt, task.executor_id, now};
  task.state = TaskState::kPending;
  task.executor_id.clear();
  task.lease_expires_at.reset();
  task.not_before.reset();
  task.records_done = CommittedRecords(task);
  task.records_failed = CommittedFailed(task);
  return absl::OkStatus();
}

absl::Status CheckFence(const Task& task, const std::string& executor_id, int attempt) {
  if (FromShadow(task, attempt) && task.shadow->executor_id == executor_id) return absl::OkStatus();
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

int NextChunkSeq(const Task& task) {
  int next = 0;
  for (const Chunk& c : task.chunks) {
    if (c.attempt == task.attempt) next = std::max(next, c.seq + 1);
  }
  return next;
}

absl::StatusOr<int> CommitChunks(Task& task, const std::vector<Chunk>& chunks) {
  int committed = 0;
  for (const Chunk& chunk : chunks) {
    bool repeat = false;
    for (const Chunk& c : task.chunks) repeat |= c.attempt == chunk.attempt && c.seq == chunk.seq;
    if (repeat) continue;
    if (chunk.attempt != task.attempt) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk.seq, " names attempt ", chunk.attempt,
                                                     "; the task is on attempt ", task.attempt));
    }
    const int64_t end = CommittedRecords(task);
    if (chunk.begin != end || chunk.end <= chunk.begin || chunk.end > task.n_records || chunk.seq < NextChunkSeq(task) ||
        chunk.records_failed < 0 || chunk.records_failed > chunk.end - chunk.begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", chunk.seq, " of attempt ", chunk.attempt, " covers records [", chunk.begin, ", ", chunk.end,
          ") with ", chunk.records_failed, " failed; the task has ", task.n_records, " records, ", end,
          " committed, next chunk number ", NextChunkSeq(task)));
    }
    task.chunks.push_back(chunk);
    ++committed;
  }
  return committed;
}

absl::Status RenewLease(Task& task, const LeaseProgress& progress, absl::Duration ttl, absl::Time now) {
  if (FromShadow(task, progress.attempt)) return absl::OkStatus();  // it holds no lease to renew
  task.lease_expires_at = now + ttl;
  if (task.shadow) {
    // Two attempts race: the committed chunks stay put until one of them completes.
    task.records_done = std::max(progress.records_done, CommittedRecords(task));
    return absl::OkStatus();
  }
  absl::Status chunks = CommitChunks(task, progress.chunks).status();
  task.records_done = std::max(progress.records_done, CommittedRecords(task));
  task.records_failed = std::max(progress.records_failed, CommittedFailed(task));
  return chunks;
}

absl::Status CompleteTask(Task& task, int64_t records_done, int64_t records_failed, absl::Time now) {
  LeaseProgress report;
  report.attempt = task.attempt;
  report.records_done = records_done;
  report.records_failed = records_failed;
  return CompleteTask(task, report, now);
}

absl::Status CompleteTask(Task& task, const LeaseProgress& report, absl::Time now) {
  if (FromShadow(task, report.attempt)) {
    // The straggler finished first: it becomes the attempt that completes; its backup loses.
    Task promoted = task;
    promoted.state = TaskState::kRunning;
    promoted.attempt = task.shadow->attempt;
    promoted.executor_id = task.shadow->executor_id;
    promoted.shadow.reset();
    absl::Status done = CompleteTask(promoted, report, now);
    if (done.ok()) task = std::move(promoted);
    return done;
  }
  if (task.state != TaskState::kRunning) {
    return absl::FailedPreconditionError(absl::StrCat("task ", task.job_id, "/", task.index, " is ",
                                                      std::string(TaskStateName(task.state)),
                                                      "; only a running task can complete"));
  }
  const int64_t records_done = report.records_done, records_failed = report.records_failed;
  if (records_done != task.n_records || records_failed < 0 || records_failed > records_done) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a completed task must account for all ", task.n_records, " records (got ", records_done,
        " done, ", records_failed, " failed)"));
  }
  // Validate on a copy: a refused completion changes nothing.
  Task done = task;
  auto committed = CommitChunks(done, report.chunks);
  if (!committed.ok()) return committed.status();
  if (CommittedRecords(done) < done.n_records) {
    Chunk last{done.attempt, NextChunkSeq(done), CommittedRecords(done), done.n_records,
               records_failed - CommittedFailed(done)};
    if (last.records_failed < 0 || last.records_failed > last.end - last.begin) {
      return absl::InvalidArgumentError(absl::StrCat("the completion reports ", records_failed,
                                                     " failed records, which its chunks contradict"));
    }
    done.chunks.push_back(last);
  }
  task = std::move(done);
  task.shadow.reset();  // a shadow that loses the race is told to stop by its next heartbeat
  task.state = TaskState::kSucceeded;
  task.records_done = records_done;
  task.records_failed = CommittedFailed(task);
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
  task.records_done = CommittedRecords(task);
  task.records_failed = CommittedFailed(task);
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

absl::Status FailAttempt(Task& task, int attempt, const std::vector<Chunk>& chunks, FailureClass failure,
                         const std::string& message, int max_attempts, const RetryPolicy& policy, absl::Time now) {
  if (DropShadow(task, attempt)) return absl::OkStatus();
  if (!task.shadow) (void)CommitChunks(task, chunks);  // a chunk that does not fit is left out
  return FailTask(task, failure, message, max_attempts, policy, now);
}

absl::Status ExpireLease(Task& task, int max_attempts, const RetryPolicy& policy, absl::Time now) {
  if (task.state != TaskState::kRunning || !task.lease_expires_at || *task.lease_expires_at > now) {
    return absl::FailedPreconditionError("lease has not expired");
  }
  std::string holder = task.executor_id;
  absl::Status failed = FailTask(task, FailureClass::kRetryable,
                                 absl::StrCat("lease of attempt ", task.attempt, " expired (executor ", holder,
                                              " stopped heartbeating)"),
                                 max_attempts, policy, now);
  if (!failed.ok()) return failed;
  // A vanished executor says nothing about the task: the first time, it runs elsewhere at once
  // (failover within a TTL). Backoff starts with the second failure, in case the task is what
  // takes its executors down.
  if (task.state == TaskState::kPending && task.failures == 1) task.not_before.reset();
  return absl::OkStatus();
}

void CancelTask(Task& task, absl::Time now) {
  if (IsTerminal(task.state)) return;
  task.shadow.reset();
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
    // Its committed chunks still count (they are in the output); every other record gets an
    // error line.
    const int64_t committed = CommittedRecords(task), committed_failed = CommittedFailed(task);
    job.counts.completed += committed - committed_failed;
    job.counts.failed += task.n_records - committed + committed_failed;
  }
}

void CountStoppedTask(Job& job, const Task& task, bool unrun_failed) {
  const int64_t committed = CommittedRecords(task), committed_failed = CommittedFailed(task);
  job.counts.completed += committed - committed_failed;
  job.counts.failed += committed_failed + (unrun_failed ? task.n_records - committed : 0);
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

bool DeadlinePassed(const Job& job, absl::Time now) {
  return job.spec.completion_window && !IsTerminal(job.state) && job.state != JobState::kFinalizing &&
         now >= job.created_at + *job.spec.completion_window;
}

absl::Status ExpireJob(Job& job, std::vector<Task>& tasks, absl::Time now) {
  if (!DeadlinePassed(job, now)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job.id, " is ", std::string(JobStateName(job.state)),
                                                      " and its completion window has not passed"));
  }
  job.error = absl::StrCat("the completion window of ", absl::FormatDuration(*job.spec.completion_window),
                           " passed before the job finished");
  job.updated_at = now;
  if (job.state == JobState::kValidating) {
    job.state = JobState::kExpired;
    job.finished_at = now;
    return absl::OkStatus();
  }
  for (Task& task : tasks) {
    if (IsTerminal(task.state)) continue;
    CancelTask(task, now);
    task.last_error = job.error;
    AccountTerminalTask(job, task, now);
    CountStoppedTask(job, task, /*unrun_failed=*/true);  // cut off by the deadline: its chunks are served, the rest are errors
  }
  // Whatever the tasks' outcome, the job's finished records are merged and it ends expired.
  job.error = absl::StrCat("the completion window of ", absl::FormatDuration(*job.spec.completion_window),
                           " passed before the job finished");
  job.state = JobState::kFinalizing;
  job.finished_at.reset();
  return absl::OkStatus();
}

}  // namespace minions
