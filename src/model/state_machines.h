#pragma once
// The pure state machines of jobs and tasks: every transition the system makes goes through these
// functions, so the SQLite and PostgreSQL stores share one definition of the rules and tests can
// table-test them without a database. No I/O, no clock reads: `now` is an argument.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// Checks that a report comes from the current attempt of the task's current lease holder, or
// from its shadow (a straggling attempt racing its backup).
absl::Status CheckFence(const Task& task, const std::string& executor_id, int attempt);

// Stragglers: the running attempt becomes the task's shadow and the task goes back to pending, so
// another executor (never the shadow's) leases it as a backup attempt. The shadow keeps running
// and may still complete; the first completion wins and the loser is cancelled by its next
// heartbeat. While a shadow exists the committed chunks stay as they are (both attempts resume
// from them), so either attempt's completion fits. FailedPrecondition unless running without a
// shadow.
absl::Status RequestBackup(Task& task, absl::Time now);

// The report of `attempt` comes from the task's shadow.
bool FromShadow(const Task& task, int attempt);

// A report of failure from the shadow: it is dropped (the backup runs on); not counted. Returns
// whether `attempt` was the shadow.
bool DropShadow(Task& task, int attempt);

// Commits the chunks of the task's current attempt that extend its committed prefix (the caller
// has checked the fence). A chunk already committed is skipped, so an executor may repeat its list
// in every heartbeat; one that leaves a gap, overlaps or overruns the task is InvalidArgument.
// Returns how many were committed.
absl::StatusOr<int> CommitChunks(Task& task, const std::vector<Chunk>& chunks);

// A heartbeat from the current attempt (fence checked by the caller): extends the lease, records
// its progress and commits the chunks it lists. A chunk that cannot be committed is left out (the
// lease is still renewed; the completion will say what is wrong) and returned as the error.
absl::Status RenewLease(Task& task, const LeaseProgress& progress, absl::Duration ttl, absl::Time now);

// The number the current attempt's next chunk gets: one past its highest committed chunk.
int NextChunkSeq(const Task& task);

// The attempt succeeded. Its reported chunks are committed; the records they leave uncovered are
// the attempt's next chunk (numbered NextChunkSeq). `report.records_done` must be the task's
// n_records and `report.records_failed` the error lines among all of them.
absl::Status CompleteTask(Task& task, const LeaseProgress& report, absl::Time now);
// The same, for an attempt that reports no chunks.
absl::Status CompleteTask(Task& task, int64_t records_done, int64_t records_failed, absl::Time now);

// The attempt ended without success. Retryable: back to pending after a backoff, or failed once
// `max_attempts` real failures are reached. Permanent: failed now. Preempted: back to pending at
// once, not counted. Committed chunks are kept in every case: the next attempt resumes after them.
absl::Status FailTask(Task& task, FailureClass failure, const std::string& message,
                      int max_attempts, const RetryPolicy& policy, absl::Time now);

// An attempt reports its end without success (fence checked by the caller): a shadow is dropped
// (DropShadow); otherwise the chunks it uploaded are committed first (those that fit), so a
// preempted or failed attempt hands back everything it finished, then FailTask.
absl::Status FailAttempt(Task& task, int attempt, const std::vector<Chunk>& chunks, FailureClass failure,
                         const std::string& message, int max_attempts, const RetryPolicy& policy, absl::Time now);

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

// A task stopped by its job's cancel or expiry keeps what it finished: its committed chunks count
// (completed, and failed for their error lines). `unrun_failed`: every record it never ran counts
// failed too (an expired job's: its counts say what its results hold, completed = output lines,
// failed = error lines). A cancelled job's are left out (false): total - completed - failed is what
// never ran, each with a "batch_cancelled" error line, and its progress and rate are what ran.
// Adds to `job`'s counts only (the task is already in tasks_done through CountTerminalTask).
void CountStoppedTask(Job& job, const Task& task, bool unrun_failed);

// The settling half: a job whose tasks have all ended (tasks_done == n_tasks) and that has not
// ended itself moves to finalizing, or to failed (with `last_error`, of the task that ended last)
// when no task succeeded. Returns whether the job changed.
bool SettleJob(Job& job, const std::string& last_error, absl::Time now);

// A lease was granted: a queued job becomes running and records when it started. Returns false
// when nothing changed (the job was already running), so stores can skip writing the job row —
// the one row every lease of a job would otherwise contend for.
bool MarkJobStarted(Job& job, absl::Time now);

// The job carries a completion window that has passed and it has not finished.
bool DeadlinePassed(const Job& job, absl::Time now);

// The job's completion window passed: its unfinished tasks (among `tasks`, which must hold every
// task not yet terminal) are cancelled, keeping their committed chunks, and the job goes to
// finalizing, whose result merges what was finished and ends the job `expired` (the OpenAI Batch
// API's semantics). A job still validating expires at once. FailedPrecondition if the window has
// not passed or the job has ended.
absl::Status ExpireJob(Job& job, std::vector<Task>& tasks, absl::Time now);

}  // namespace minions
