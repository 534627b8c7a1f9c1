#include "store/common/attempt_operations.h"

#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/state_machines.h"
#include "store/common/row_access.h"
#include "store/common/store_rules.h"
#include "store/common/verification_operations.h"

namespace minions {
namespace {

namespace rules = store_rules;

// The keys of every report of `calls`, and their executors' ids.
RowKeys ReportedRows(const std::vector<CompletionCall>& calls) {
  RowKeys keys;
  keys.executor_ids_only = true;
  for (const CompletionCall& call : calls) {
    keys.executors.push_back(call.executor_id);
    for (const LeaseProgress& report : call.reports) keys.tasks.emplace_back(report.job_id, report.task_index);
  }
  return keys;
}

}  // namespace

absl::StatusOr<AttemptOperations::Outcomes> AttemptOperations::FinishAttempts(
    RowTransaction& t, const std::vector<CompletionCall>& calls, Transition transition, absl::Time now,
    std::vector<Task>* finished, Settlement& settlement) {
  // The reported tasks are locked in key order, then the executors in id order.
  ASSIGN_OR_RETURN(Rows rows, t.Read(ReportedRows(calls)));
  // Where each executor's charged time ends (store_rules ChargedUntil): its reported attempts are
  // charged from there on, so the tasks it queued beside the one it ran are not charged twice.
  std::vector<std::string> reporters;
  for (const CompletionCall& call : calls) reporters.push_back(call.executor_id);
  ASSIGN_OR_RETURN(rules::ChargedUntil charged, t.ChargedUntil(reporters));
  AttemptWrites writes;
  std::vector<std::string> writers;  // the executor of each of writes.tasks
  Outcomes answers;
  std::vector<size_t> written;  // index in writes.tasks of each report's task, or npos
  // A producer's records so far (its first tasks are all re-scored), read only with spot checks on.
  std::map<std::string, int64_t> records_of;
  auto producer_records = [&](const std::string& executor_id) -> absl::StatusOr<int64_t> {
    if (!options_.spot_checks) return int64_t{0};
    auto known = records_of.find(executor_id);
    if (known != records_of.end()) return known->second;
    ASSIGN_OR_RETURN(Rows producer, t.Read(RowKeys{.executors = {executor_id}}, Locking::kNone));
    const int64_t done = producer.executors.contains(executor_id) ? producer.executors.at(executor_id).records_done : 0;
    records_of.emplace(executor_id, done);
    return done;
  };
  for (const CompletionCall& call : calls) {
    if (!rows.executors.contains(call.executor_id)) {
      answers.push_back(row_access::NoExecutor(call.executor_id));
      written.insert(written.end(), call.reports.size(), std::string::npos);
      continue;
    }
    std::vector<absl::Status> outcomes;
    for (const LeaseProgress& report : call.reports) {
      auto it = rows.tasks.find(TaskId{report.job_id, report.task_index});
      if (it == rows.tasks.end()) {
        outcomes.push_back(row_access::NoTask(report.job_id, report.task_index));
        written.push_back(std::string::npos);
        continue;
      }
      Task updated = it->second;  // as loaded: a refused report leaves the row as it is
      absl::Status fence = CheckFence(updated, call.executor_id, report.attempt);
      if (fence.ok()) fence = transition(updated, report);
      if (fence.ok()) {
        // The chunks it committed: stamped with their producer, and spot checks drawn.
        ASSIGN_OR_RETURN(int64_t records_done, producer_records(call.executor_id));
        RETURN_IF_ERROR(VerificationOperations::DrawSpotChecks(t, options_, it->second, updated, call.executor_id,
                                                               records_done, now));
      }
      outcomes.push_back(fence);
      if (!fence.ok()) {
        written.push_back(std::string::npos);
        continue;
      }
      writes.charges[updated.job_id] += rules::EndedAttemptTime(it->second, updated, now, &charged);
      it->second = updated;  // a second report of the same attempt is then refused
      written.push_back(writes.tasks.size());
      writes.tasks.push_back(std::move(updated));
      writers.push_back(call.executor_id);
    }
    answers.push_back(std::move(outcomes));
  }
  // One row per task written: a task reported twice in the batch is written as it ended last.
  std::set<TaskId> keys;
  for (const Task& task : writes.tasks) keys.insert({task.job_id, task.index});
  if (keys.size() != writes.tasks.size()) return absl::InternalError("a task ended twice in one batch of completions");
  for (size_t i = 0; i < writes.tasks.size(); ++i) {
    if (writes.tasks[i].state == TaskState::kSucceeded) writes.records[writers[i]] += writes.tasks[i].records_done;
  }
  // Written back only for the reporters, whose rows this transaction holds (an attempt's other
  // executor, a backup's when its shadow wins, is bounded by what was read, not moved).
  for (const std::string& executor_id : reporters) {
    if (auto moved = charged.find(executor_id); moved != charged.end()) writes.charged_until[executor_id] = moved->second;
  }
  JobSettler::CountEnded(writes, now);
  RETURN_IF_ERROR(settler_.EndAndSettle(t, writes, now, settlement));
  if (finished != nullptr) {
    for (size_t i : written) finished->push_back(i == std::string::npos ? Task{} : writes.tasks[i]);
  }
  return answers;
}

absl::StatusOr<Task> AttemptOperations::FinishOne(RowTransaction& t, const std::string& executor_id,
                                                  const LeaseProgress& report, Transition transition, absl::Time now,
                                                  Settlement& settlement) {
  std::vector<Task> finished;
  ASSIGN_OR_RETURN(Outcomes answers,
                   FinishAttempts(t, {CompletionCall{executor_id, {report}}}, transition, now, &finished, settlement));
  ASSIGN_OR_RETURN(std::vector<absl::Status> outcomes, std::move(answers.front()));
  RETURN_IF_ERROR(outcomes.front());
  return finished.front();
}

absl::StatusOr<Task> AttemptOperations::CompleteTask(const std::string& executor_id, const std::string& job_id,
                                                     int64_t task_index, int attempt, int64_t records_done,
                                                     int64_t records_failed, absl::Time now) {
  Settlement settlement;
  absl::StatusOr<Task> task = RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) {
    settlement.Reset();
    return FinishOne(
        t, executor_id, LeaseProgress{job_id, task_index, attempt, records_done, records_failed},
        [&](Task& ended, const LeaseProgress&) { return ::minions::CompleteTask(ended, records_done, records_failed, now); },
        now, settlement);
  });
  if (task.ok()) settler_.Settle(settlement, now);
  return task;
}

absl::StatusOr<CompletionReply> AttemptOperations::CompleteMany(const std::vector<CompletionCall>& calls,
                                                                absl::Time now) {
  if (calls.empty()) return CompletionReply{};
  Settlement settlement;
  CompletionReply reply;
  RETURN_IF_ERROR(RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::Status {
    settlement.Reset();
    ASSIGN_OR_RETURN(reply.outcomes, FinishAttempts(
                                         t, calls,
                                         [&](Task& ended, const LeaseProgress& report) {
                                           return ::minions::CompleteTask(ended, report, now);
                                         },
                                         now, nullptr, settlement));
    return absl::OkStatus();
  }));
  reply.finalizing = settler_.Settle(settlement, now);
  return reply;
}

absl::StatusOr<Task> AttemptOperations::FailTask(const std::string& executor_id, const std::string& job_id,
                                                 int64_t task_index, int attempt, FailureClass failure,
                                                 const std::string& message, absl::Time now,
                                                 const std::vector<Chunk>& chunks) {
  Settlement settlement;
  absl::StatusOr<Task> task = RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::StatusOr<Task> {
    settlement.Reset();
    // The job is only read (for max_attempts): its row is not what this writes.
    absl::StatusOr<Job> job = row_access::LoadJob(t, job_id, Locking::kNone);
    if (!job.ok() && !absl::IsNotFound(job.status())) return job.status();
    return FinishOne(
        t, executor_id, LeaseProgress{job_id, task_index, attempt, 0, 0},
        [&](Task& ended, const LeaseProgress&) -> absl::Status {
          if (!job.ok()) return job.status();
          return FailAttempt(ended, attempt, chunks, failure, message, job->spec.max_attempts, options_.retry, now);
        },
        now, settlement);
  });
  if (task.ok()) settler_.Settle(settlement, now);
  return task;
}

absl::StatusOr<std::vector<Task>> AttemptOperations::ExpireLeases(absl::Time now, int limit) {
  Settlement settlement;
  absl::StatusOr<std::vector<Task>> expired =
      RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::StatusOr<std::vector<Task>> {
        settlement.Reset();
        AttemptWrites writes;
        ASSIGN_OR_RETURN(writes.tasks, t.ExpiredLeases(now, limit));
        std::map<std::string, Job> jobs;  // read for max_attempts, not locked: their rows are not written
        // A lost executor's queued tasks expire with the one it ran: charged from where its time
        // was last charged, and one span only in all (store_rules ChargedUntil). Not written
        // back: the executors' rows are not this transaction's to lock.
        ASSIGN_OR_RETURN(rules::ChargedUntil charged, row_access::ChargedUntilOfHolders(t, writes.tasks));
        for (Task& task : writes.tasks) {
          auto job = jobs.find(task.job_id);
          if (job == jobs.end()) {
            ASSIGN_OR_RETURN(Job loaded, row_access::LoadJob(t, task.job_id, Locking::kNone));
            job = jobs.emplace(task.job_id, std::move(loaded)).first;
          }
          const Task before = task;
          RETURN_IF_ERROR(ExpireLease(task, job->second.spec.max_attempts, options_.retry, now));
          writes.charges[task.job_id] += rules::EndedAttemptTime(before, task, now, &charged);
        }
        JobSettler::CountEnded(writes, now);
        RETURN_IF_ERROR(settler_.EndAndSettle(t, writes, now, settlement));
        return writes.tasks;
      });
  if (expired.ok()) settler_.Settle(settlement, now);
  return expired;
}

}  // namespace minions
