#include "watchdog/stragglers.h"

#include <algorithm>

namespace minions {

std::vector<int64_t> FindStragglers(const std::vector<Task>& tasks, const StragglerPolicy& policy, absl::Time now) {
  std::vector<absl::Duration> finished;
  for (const Task& task : tasks) {
    if (task.state == TaskState::kPending) return {};  // not near the end yet
    if (task.state == TaskState::kSucceeded && task.started_at && task.finished_at) {
      finished.push_back(*task.finished_at - *task.started_at);
    }
  }
  if (static_cast<int>(finished.size()) < std::max(1, policy.min_finished)) return {};
  std::nth_element(finished.begin(), finished.begin() + finished.size() / 2, finished.end());
  const absl::Duration limit = std::max(finished[finished.size() / 2] * policy.factor, policy.min_runtime);
  std::vector<int64_t> stragglers;
  for (const Task& task : tasks) {
    if (task.state != TaskState::kRunning || task.shadow || !task.started_at) continue;
    if (now - *task.started_at > limit) stragglers.push_back(task.index);
  }
  return stragglers;
}

}  // namespace minions
