#pragma once
// The pure state machines of jobs and tasks: every transition the system makes goes through these
// functions, so the SQLite and PostgreSQL stores share one definition of the rules and tests can
// table-test them without a database. No I/O, no clock reads: `now` is an argument.

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "model/types.h"

namespace minions {

bool IsAllowed(JobState from, JobState to);
bool IsAllowed(TaskState from, TaskState to);

struct RetryPolicy {
  absl::Duration backoff_base = absl::Seconds(2);  // first retry waits this, doubling per failure
  absl::Duration backoff_cap = absl::Minutes(5);
};

// Leasing: pending -> running under a new attempt (the fencing token).
absl::Status GrantTask(Task& task, const std::string& executor_id, absl::Duration ttl, absl::Time now);

// Checks that a report comes from the current attempt of the task's current lease holder.
absl::Status CheckFence(const Task& task, const std::string& executor_id, int attempt);

// The attempt succeeded with its final counts.
absl::Status CompleteTask(Task& task, int64_t records_done, int64_t records_failed, absl::Time now);

// The attempt ended without success. Retryable: back to pending after a backoff, or failed once
// `max_attempts` real failures are reached. Permanent: failed now. Preempted: back to pending at
// once, not counted.
absl::Status FailTask(Task& task, FailureClass failure, const std::string& message,
                      int max_attempts, const RetryPolicy& policy, absl::Time now);

// The lease ran out (the executor vanished or cannot reach us): a retryable failure.
absl::Status ExpireLease(Task& task, int max_attempts, const RetryPolicy& policy, absl::Time now);

// The job was cancelled: a pending or running task is cancelled.
void CancelTask(Task& task, absl::Time now);

// A task reached a terminal state: adds its records to the job's counts and, when it was the last
// task, moves the job to finalizing (or failed when no task succeeded). A job whose tasks partly
// failed still completes: the failed tasks' records are listed in its error file.
// It is CountTerminalTask then SettleJob.
void AccountTerminalTask(Job& job, const Task& task, absl::Time now);

// The counting half of AccountTerminalTask: adds the task to tasks_done (and tasks_succeeded) and
// its records to the counts, and sets updated_at. Applied to a zeroed Job it gives the change a
// store adds to the job's counts (the PostgreSQL store keeps them in counter rows, not the job row).
void CountTerminalTask(Job& job, const Task& task, absl::Time now);

// The settling half: a job whose tasks have all ended (tasks_done == n_tasks) and that has not
// ended itself moves to finalizing, or to failed (with `last_error`, of the task that ended last)
// when no task succeeded. Returns whether the job changed.
bool SettleJob(Job& job, const std::string& last_error, absl::Time now);

// A lease was granted: a queued job becomes running and records when it started. Returns false
// when nothing changed (the job was already running), so stores can skip writing the job row —
// the one row every lease of a job would otherwise contend for.
bool MarkJobStarted(Job& job, absl::Time now);

}  // namespace minions
