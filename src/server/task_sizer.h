#pragma once
// Throughput-aware task sizes, the server's side (model/task_sizing.h has the rules): measuring
// each completed attempt into the store, and sizing a new job's tasks from what was measured.
// Sizing happens when a job is split at submission (docs/architecture.md, "Task sizes", says why
// not lazily at lease time).
//
// Free functions over a MetadataStore; any thread.

#include <string>

#include "absl/status/statusor.h"
#include "model/task_sizing.h"
#include "model/types.h"
#include "store/metadata_store.h"

namespace minions {

// Records what attempt `attempt` of task `task_index` of `job` measured, now that it completed.
// Best effort: a task that measured nothing usable (model SampleOfCompletion) records nothing,
// and a store error is logged, never returned (the completion itself has been committed).
void MeasureCompletion(MetadataStore& store, const Job& job, int64_t task_index, int attempt, absl::Time now);

// The records per task for a new job of `spec`'s model and runner.
absl::StatusOr<TaskSize> SizeTasksFor(MetadataStore& store, const JobSpec& spec, const TaskSizing& sizing);

}  // namespace minions
