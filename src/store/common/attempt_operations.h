#pragma once
// AttemptOperations: the MetadataStore's ends of attempts (metadata_store.h), written once over a
// RowStore (store/row_store.h): completions (one, or several executors' in one transaction),
// failures, and the watchdog's expiry of leases. Each is fenced (only the current attempt of the
// lease holder, or its shadow, may end a task), applies the rule of model/state_machines.h, and
// ends the attempts in one write (RowTransaction::EndAttempts), settling the jobs whose last task
// it ended (JobSettler).
// Lock order (where rows lock): the reported tasks (in key order), then their executors (in id
// order); a job is only read, unless its last task ended (then it is locked to settle it).
// Borrows the store, the options and the settler. Thread-safe.

#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/common/job_settler.h"
#include "store/metadata_store.h"
#include "store/row_store.h"

namespace minions {

class AttemptOperations {
 public:
  AttemptOperations(RowStore& store, const StoreOptions& options, JobSettler& settler)
      : store_(store), options_(options), settler_(settler) {}

  absl::StatusOr<Task> CompleteTask(const std::string& executor_id, const std::string& job_id, int64_t task_index,
                                    int attempt, int64_t records_done, int64_t records_failed, absl::Time now);
  absl::StatusOr<CompletionReply> CompleteMany(const std::vector<CompletionCall>& calls, absl::Time now);
  absl::StatusOr<Task> FailTask(const std::string& executor_id, const std::string& job_id, int64_t task_index,
                                int attempt, FailureClass failure, const std::string& message, absl::Time now,
                                const std::vector<Chunk>& chunks);
  absl::StatusOr<std::vector<Task>> ExpireLeases(absl::Time now, int limit);

 private:
  // What a fenced report does to its task (the fence passed).
  using Transition = absl::FunctionRef<absl::Status(Task& task, const LeaseProgress& report)>;
  using Outcomes = std::vector<absl::StatusOr<std::vector<absl::Status>>>;

  // The fenced end of reported attempts, each call's by its executor: loads the tasks (and which
  // executors exist), checks each report's fence, applies `transition` to each fenced task, and
  // ends them in one write. One status per report of each call; NotFound for a call whose
  // executor is unknown. `finished` receives each report's task as written (an empty Task for a
  // refused one), call after call.
  absl::StatusOr<Outcomes> FinishAttempts(RowTransaction& t, const std::vector<CompletionCall>& calls,
                                          Transition transition, absl::Time now, std::vector<Task>* finished,
                                          Settlement& settlement);
  // FinishAttempts for one report of one executor (CompleteTask, FailTask), inside the body of
  // its transaction: the task as it ended, or why not.
  absl::StatusOr<Task> FinishOne(RowTransaction& t, const std::string& executor_id, const LeaseProgress& report,
                                 Transition transition, absl::Time now, Settlement& settlement);

  RowStore& store_;
  const StoreOptions& options_;
  JobSettler& settler_;
};

}  // namespace minions
