#pragma once
// Stragglers: near the end of a job, a task that runs far longer than its finished peers gets a
// backup attempt on another executor (model RequestBackup); the first to complete wins. This is
// the pure decision: which tasks of one job deserve a backup now. The watchdog applies it.

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "model/types.h"

namespace minions {

struct StragglerPolicy {
  double factor = 3.0;                             // running this many times the median task...
  absl::Duration min_runtime = absl::Seconds(30);  // ...and at least this long
  int min_finished = 3;                            // the median needs this many finished tasks
};

// The indexes of `tasks` (every task of one job) that deserve a backup at `now`: the job has no
// task left pending (its end is near), and each one named runs without a shadow for longer than
// both `factor` times the median duration of the job's succeeded tasks and `min_runtime`.
std::vector<int64_t> FindStragglers(const std::vector<Task>& tasks, const StragglerPolicy& policy, absl::Time now);

}  // namespace minions
