#pragma once
// EvenTasks: the tasks of a made-up job for tests and benchmarks that fill a store directly:
// `n` tasks of `records_per_task` records and `bytes_per_task` input bytes each, in order.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/types.h"
#include "store/metadata_store.h"

namespace minions::testing {

inline std::vector<Task> EvenTasks(int n, int64_t records_per_task, int64_t bytes_per_task = 100) {
  std::vector<Task> tasks;
  for (int i = 0; i < n; ++i) {
    Task t;
    t.index = i;
    t.first_record = i * records_per_task;
    t.n_records = records_per_task;
    t.byte_begin = i * bytes_per_task;
    t.byte_end = (i + 1) * bytes_per_task;
    tasks.push_back(t);
  }
  return tasks;
}

// A job spec of `team` running `model` over inputs/in.jsonl, 10 records a task, on a gang of
// `gang_size` machines (0: one).
inline JobSpec TenRecordSpec(const std::string& team, const std::string& model, int gang_size = 0) {
  JobSpec spec;
  spec.team = team;
  spec.model = model;
  spec.input_key = "inputs/in.jsonl";
  spec.shard_size = 10;
  spec.gang_size = gang_size;
  return spec;
}

// A queued job of `spec` made in `store` directly at `now`, with EvenTasks(n_tasks,
// spec.shard_size, bytes_per_task): its id.
inline absl::StatusOr<std::string> QueueEvenJob(MetadataStore& store, const JobSpec& spec, int n_tasks, absl::Time now,
                                                int64_t bytes_per_task = 100) {
  absl::StatusOr<Job> job = store.CreateJob(spec, now);
  if (!job.ok()) return job.status();
  absl::Status added = store.AddTasks(job->id, EvenTasks(n_tasks, spec.shard_size, bytes_per_task),
                                      n_tasks * spec.shard_size, now);
  if (!added.ok()) return added;
  return job->id;
}

}  // namespace minions::testing
