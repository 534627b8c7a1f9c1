#pragma once
// JobOperations: the MetadataStore's jobs and tasks (metadata_store.h), written once over a
// RowStore (store/row_store.h): creating a job and its tasks, reading them, ending a job (cancel,
// failure, expiry, finish), a straggler's backup, and the jobs to finalize. Each method is one
// transaction: load the rows, apply the rule (model/state_machines.h, store/common/store_rules.h),
// save.
// Lock order (where rows lock): a job's tasks, then the job; creating a job locks its team first.
// Borrows the store, the id source and the settler. Thread-safe.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/common/id_generator.h"
#include "store/common/job_settler.h"
#include "store/metadata_store.h"
#include "store/row_store.h"

namespace minions {

class JobOperations {
 public:
  JobOperations(RowStore& store, IdGenerator& ids, JobSettler& settler)
      : store_(store), ids_(ids), settler_(settler) {}

  absl::StatusOr<Job> CreateJob(const JobSpec& spec, absl::Time now);
  absl::Status AddTasks(const std::string& job_id, const std::vector<Task>& tasks, int64_t total_records,
                        absl::Time now);
  absl::StatusOr<Job> GetJob(const std::string& job_id);
  absl::StatusOr<std::vector<Job>> ListJobs(const JobFilter& filter);
  absl::StatusOr<std::vector<Task>> ListTasks(const std::string& job_id);
  absl::StatusOr<Task> GetTask(const std::string& job_id, int64_t task_index);
  absl::StatusOr<std::vector<Task>> GetTasks(const std::vector<TaskId>& keys);
  absl::StatusOr<TaskStateCounts> CountTasks(const std::string& job_id);
  absl::StatusOr<bool> AnyTaskPending();
  absl::StatusOr<std::vector<Task>> ListRunningTasks();
  // CancelJob (kCancelled) and FailJob (kFailed).
  absl::StatusOr<Job> EndJob(const std::string& job_id, JobState state, const std::string& error, absl::Time now);
  absl::StatusOr<Job> ExpireJob(const std::string& job_id, absl::Time now);
  absl::StatusOr<std::vector<Job>> JobsToFinalize(int limit, absl::Time now);
  absl::StatusOr<Job> FinishJob(const std::string& job_id, const std::string& output_key,
                                const std::string& errors_key, const std::string& manifest_key, absl::Time now,
                                JobState outcome, const TokenUsage& tokens);
  absl::StatusOr<Task> RequestBackup(const std::string& job_id, int64_t task_index, int attempt, absl::Time now);

 private:
  // The job and all its tasks, locked in the store's lock order: the tasks first, then the job,
  // then the tasks read again (tasks may have been added in between).
  absl::StatusOr<std::pair<Job, std::vector<Task>>> LoadJobAndTasks(RowTransaction& t, const std::string& job_id);

  RowStore& store_;
  IdGenerator& ids_;
  JobSettler& settler_;
};

}  // namespace minions
