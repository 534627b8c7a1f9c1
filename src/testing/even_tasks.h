#pragma once
// EvenTasks: the tasks of a made-up job for tests and benchmarks that fill a store directly:
// `n` tasks of `records_per_task` records and `bytes_per_task` input bytes each, in order.

#include <vector>

#include "model/types.h"

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

}  // namespace minions::testing
