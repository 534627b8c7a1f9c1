#include "store/common/job_operations.h"

#include <algorithm>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/state_machines.h"
#include "store/common/row_access.h"
#include "store/common/store_rules.h"

namespace minions {
namespace {

namespace rules = store_rules;
using row_access::LoadJob;

constexpr TransactionKind kRead = TransactionKind::kRead;
constexpr TransactionKind kWrite = TransactionKind::kWrite;

}  // namespace

absl::StatusOr<Job> JobOperations::CreateJob(const JobSpec& spec, absl::Time now) {
  return RunTransaction(store_, kWrite, [&](RowTransaction& t) -> absl::StatusOr<Job> {
    // The team's row, locked, serialises its submissions, so its quota cannot be overrun by
    // several at once.
    ASSIGN_OR_RETURN(std::optional<Team> team, row_access::FindTeam(t, spec.team));
    ASSIGN_OR_RETURN(int64_t active, t.CountActiveJobs(spec.team));
    RETURN_IF_ERROR(rules::CheckJobQuota(team, active));
    Job job = rules::NewJob(spec, now);
    RETURN_IF_ERROR(row_access::InsertWithFreshId(t, ids_, job));
    return job;
  });
}

absl::Status JobOperations::AddTasks(const std::string& job_id, const std::vector<Task>& tasks,
                                     int64_t total_records, absl::Time now) {
  return RunTransaction(store_, kWrite, [&](RowTransaction& t) -> absl::Status {
    ASSIGN_OR_RETURN(Job job, LoadJob(t, job_id));
    ASSIGN_OR_RETURN(std::vector<Task> fresh, rules::AddTasksToJob(job, tasks, total_records, now));
    if (!fresh.empty()) RETURN_IF_ERROR(t.Insert(RowWrites{.tasks = std::move(fresh)}));
    return t.Update(RowWrites{.jobs = {job}}, /*last=*/true);
  });
}

absl::StatusOr<Job> JobOperations::GetJob(const std::string& job_id) {
  return RunTransaction(store_, kRead, [&](RowTransaction& t) { return LoadJob(t, job_id); });
}

absl::StatusOr<std::vector<Job>> JobOperations::ListJobs(const JobFilter& filter) {
  return RunTransaction(store_, kRead, [&](RowTransaction& t) { return t.ListJobs(filter); });
}

absl::StatusOr<std::vector<Task>> JobOperations::ListTasks(const std::string& job_id) {
  return RunTransaction(store_, kRead, [&](RowTransaction& t) -> absl::StatusOr<std::vector<Task>> {
    RETURN_IF_ERROR(LoadJob(t, job_id).status());
    return t.TasksOfJob(job_id);
  });
}

absl::StatusOr<Task> JobOperations::GetTask(const std::string& job_id, int64_t task_index) {
  return RunTransaction(store_, kRead, [&](RowTransaction& t) { return row_access::LoadTask(t, job_id, task_index); });
}

absl::StatusOr<std::vector<Task>> JobOperations::GetTasks(const std::vector<TaskId>& keys) {
  if (keys.empty()) return std::vector<Task>{};
  return RunTransaction(store_, kRead, [&](RowTransaction& t) { return row_access::LoadTasks(t, keys); });
}

absl::StatusOr<TaskStateCounts> JobOperations::CountTasks(const std::string& job_id) {
  return RunTransaction(store_, kRead, [&](RowTransaction& t) -> absl::StatusOr<TaskStateCounts> {
    ASSIGN_OR_RETURN(Job job, LoadJob(t, job_id));
    ASSIGN_OR_RETURN(TaskStateCounts counts, t.CountTasks(job_id));
    counts.done = job.tasks_done;
    counts.succeeded = job.tasks_succeeded;
    return counts;
  });
}

absl::StatusOr<bool> JobOperations::AnyTaskPending() {
  return RunTransaction(store_, kRead, [&](RowTransaction& t) { return t.AnyTaskPending(); });
}

absl::StatusOr<std::vector<Task>> JobOperations::ListRunningTasks() {
  return RunTransaction(store_, kRead, [&](RowTransaction& t) { return t.RunningTasks(); });
}

absl::StatusOr<std::pair<Job, std::vector<Task>>> JobOperations::LoadJobAndTasks(RowTransaction& t,
                                                                                 const std::string& job_id) {
  RETURN_IF_ERROR(t.TasksOfJob(job_id).status());
  ASSIGN_OR_RETURN(Job job, LoadJob(t, job_id));
  ASSIGN_OR_RETURN(std::vector<Task> tasks, t.TasksOfJob(job_id));
  return std::make_pair(std::move(job), std::move(tasks));
}

absl::StatusOr<Job> JobOperations::EndJob(const std::string& job_id, JobState state, const std::string& error,
                                          absl::Time now) {
  return RunTransaction(store_, kWrite, [&](RowTransaction& t) -> absl::StatusOr<Job> {
    ASSIGN_OR_RETURN(auto loaded, LoadJobAndTasks(t, job_id));
    auto& [job, tasks] = loaded;
    std::map<int64_t, Task> before;
    for (const Task& task : tasks) before[task.index] = task;
    // Read before the rules clear the holders.
    ASSIGN_OR_RETURN(rules::ChargedUntil charged, row_access::ChargedUntilOfHolders(t, tasks));
    ASSIGN_OR_RETURN(std::vector<Task> cancelled, rules::EndJob(job, state, error, tasks, now));
    RETURN_IF_ERROR(t.Update(RowWrites{.jobs = {job}}));
    AttemptWrites writes;
    writes.tasks = std::move(cancelled);
    // The attempts it stopped used their machines until now: charged to the team like any other,
    // those queued on one executor one span in all (store_rules ChargedUntil, read, not moved:
    // the executors' rows are not this transaction's to lock).
    for (const Task& task : writes.tasks) {
      writes.charges[job_id] += rules::EndedAttemptTime(before[task.index], task, now, &charged);
    }
    JobSettler::CountEnded(writes, now);
    if (state == JobState::kCancelled) {
      for (const Task& task : writes.tasks) CountStoppedTask(writes.counts[job_id], task, /*unrun_failed=*/false);
    }
    RETURN_IF_ERROR(JobSettler::EndOnly(t, writes, now));  // it has ended: nothing to settle
    job.device_time += rules::DeviceTime(writes.charges[job_id], job.spec);  // (read before the charge)
    return job;
  });
}

absl::StatusOr<Job> JobOperations::ExpireJob(const std::string& job_id, absl::Time now) {
  return RunTransaction(store_, kWrite, [&](RowTransaction& t) -> absl::StatusOr<Job> {
    ASSIGN_OR_RETURN(auto loaded, LoadJobAndTasks(t, job_id));
    auto& [job, tasks] = loaded;
    const Job before = job;
    const std::vector<Task> was = tasks;
    RETURN_IF_ERROR(::minions::ExpireJob(job, tasks, now));
    RETURN_IF_ERROR(t.Update(RowWrites{.jobs = {job}}));
    AttemptWrites writes;
    ASSIGN_OR_RETURN(rules::ChargedUntil charged, row_access::ChargedUntilOfHolders(t, was));
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (tasks[i].state == was[i].state) continue;
      writes.tasks.push_back(tasks[i]);
      // The attempts it stopped used their machines until now, as a cancel's do.
      writes.charges[job_id] += rules::EndedAttemptTime(was[i], tasks[i], now, &charged);
    }
    // What the expiry counted, added to the job's counts.
    Job delta;
    delta.tasks_done = job.tasks_done - before.tasks_done;
    delta.tasks_succeeded = job.tasks_succeeded - before.tasks_succeeded;
    delta.counts.completed = job.counts.completed - before.counts.completed;
    delta.counts.failed = job.counts.failed - before.counts.failed;
    if (delta.tasks_done > 0) writes.counts[job_id] = delta;
    RETURN_IF_ERROR(JobSettler::EndOnly(t, writes, now));  // it is finalizing already
    job.device_time += rules::DeviceTime(writes.charges[job_id], job.spec);  // (read before the charge)
    return job;
  });
}

absl::StatusOr<std::vector<Job>> JobOperations::JobsToFinalize(int limit, absl::Time now) {
  // Where settling follows the commit, first the sweep: jobs whose last tasks ended in
  // transactions that could not see each other and whose settling did not happen (the process
  // died in between). Elsewhere the transaction that ended a job's last task settled it.
  const bool sweep = store_.settling() == Settling::kAfterCommit;
  return RunTransaction(store_, sweep ? kWrite : kRead, [&](RowTransaction& t) -> absl::StatusOr<std::vector<Job>> {
    if (sweep) RETURN_IF_ERROR(settler_.SweepUnsettled(t, now));
    return t.JobsInState(JobState::kFinalizing, limit);
  });
}

absl::StatusOr<Job> JobOperations::FinishJob(const std::string& job_id, const std::string& output_key,
                                             const std::string& errors_key, const std::string& manifest_key,
                                             absl::Time now, JobState outcome, const TokenUsage& tokens) {
  return RunTransaction(store_, kWrite, [&](RowTransaction& t) -> absl::StatusOr<Job> {
    ASSIGN_OR_RETURN(Job job, LoadJob(t, job_id));
    RETURN_IF_ERROR(rules::FinishJob(job, output_key, errors_key, manifest_key, now, outcome, tokens));
    RETURN_IF_ERROR(t.Update(RowWrites{.jobs = {job}}));
    RETURN_IF_ERROR(t.SetJobTokens(job_id, tokens));
    return job;
  });
}

absl::StatusOr<Task> JobOperations::RequestBackup(const std::string& job_id, int64_t task_index, int attempt,
                                                  absl::Time now) {
  return RunTransaction(store_, kWrite, [&](RowTransaction& t) -> absl::StatusOr<Task> {
    ASSIGN_OR_RETURN(Task task, row_access::LoadTask(t, job_id, task_index));
    if (task.attempt != attempt) {
      return absl::FailedPreconditionError(absl::StrCat("task ", job_id, "/", task_index, " is on attempt ",
                                                        task.attempt, ", not ", attempt));
    }
    const Task before = task;
    RETURN_IF_ERROR(::minions::RequestBackup(task, now));
    // The straggler's time so far is charged now (the rest only if it wins); nothing ends.
    AttemptWrites writes;
    writes.tasks = {task};
    writes.charges[job_id] = rules::EndedAttemptTime(before, task, now);
    RETURN_IF_ERROR(JobSettler::EndOnly(t, writes, now));
    return task;
  });
}

}  // namespace minions
