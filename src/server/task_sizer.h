#pragma once
// Throughput-aware task sizes, the server's side (model/task_sizing.h has the rules): measuring
// each completed attempt into the store, and sizing a new job's tasks from what was measured.
// Sizing happens when a job is split at submission (docs/architecture.md, "Task sizes", says why
// not lazily at lease time).
//
// Free functions over a MetadataStore; any thread.

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "blob/blob_store.h"
#include "common/json_util.h"
#include "model/task_sizing.h"
#include "model/types.h"
#include "store/metadata_store.h"

namespace minions {

// Records what attempt `attempt` of task `task_index` of `job` measured, now that it completed.
// Best effort: a task that measured nothing usable (model SampleOfCompletion) records nothing,
// and a store error is logged, never returned (the completion itself has been committed).
void MeasureCompletion(MetadataStore& store, const Job& job, int64_t task_index, int attempt, absl::Time now);

// Which completions are measured: every one, up to `per_second` a second for each model and
// runner on this server, then none until that second ends. A fleet finishing hundreds of short
// tasks a second would otherwise pay two more store round trips per task (the task's read and the
// sample's write: a third of a completion's transactions) for a figure, records per second, that
// a few samples a second give as well; a fleet of minute-long tasks has every one measured.
// Threads: thread-safe.
class CompletionSampler {
 public:
  explicit CompletionSampler(int per_second = 20) : per_second_(per_second) {}
  // Whether the completion of a task of `key` at `now` is measured (and counted if so).
  bool Take(const ThroughputKey& key, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Window {
    absl::Time start;
    int taken = 0;
  };
  const int per_second_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Window> windows_ ABSL_GUARDED_BY(mu_);  // by model and runner
};

// The records per task for a new job of `spec`'s model and runner (and answer length).
absl::StatusOr<TaskSize> SizeTasksFor(MetadataStore& store, const JobSpec& spec, const TaskSizing& sizing);

// JobSpec::tokens_per_record of the input at `input_key`: the mean answer tokens its first records
// ask for (their max_tokens or max_completion_tokens, else the endpoint's default: 16 for
// completions, the runner's default_max_tokens for chat; 1 for an embedding), read from its first
// MiB only. 0 when no record there is valid.
absl::StatusOr<int64_t> EstimateTokensPerRecord(BlobStore& blobs, const std::string& input_key,
                                                const Json& runner_options);

}  // namespace minions
