#include "watchdog/stragglers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace minions {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

Task Finished(int64_t index, absl::Duration took) {
  Task task;
  task.index = index;
  task.state = TaskState::kSucceeded;
  task.started_at = kNow - absl::Hours(1);
  task.finished_at = *task.started_at + took;
  return task;
}

Task Running(int64_t index, absl::Duration for_how_long) {
  Task task;
  task.index = index;
  task.state = TaskState::kRunning;
  task.attempt = 1;
  task.started_at = kNow - for_how_long;
  return task;
}

StragglerPolicy Policy() {
  StragglerPolicy policy;
  policy.factor = 3;
  policy.min_runtime = absl::Seconds(10);
  policy.min_finished = 3;
  return policy;
}

std::vector<Task> Peers() {
  return {Finished(0, absl::Seconds(20)), Finished(1, absl::Seconds(22)), Finished(2, absl::Seconds(200))};
}

TEST(FindStragglers, ATaskFarSlowerThanTheMedianGetsABackup) {
  std::vector<Task> tasks = Peers();  // median 22 s: the limit is 66 s
  tasks.push_back(Running(3, absl::Seconds(67)));
  tasks.push_back(Running(4, absl::Seconds(65)));
  EXPECT_THAT(FindStragglers(tasks, Policy(), kNow), ElementsAre(3));
}

TEST(FindStragglers, NotWhileTasksArePending) {
  std::vector<Task> tasks = Peers();
  tasks.push_back(Running(3, absl::Hours(1)));
  Task pending;
  pending.index = 4;
  tasks.push_back(pending);
  EXPECT_THAT(FindStragglers(tasks, Policy(), kNow), IsEmpty());
}

TEST(FindStragglers, NotWithoutEnoughFinishedPeers) {
  std::vector<Task> tasks = {Finished(0, absl::Seconds(1)), Finished(1, absl::Seconds(1)), Running(2, absl::Hours(1))};
  EXPECT_THAT(FindStragglers(tasks, Policy(), kNow), IsEmpty());
}

TEST(FindStragglers, NeverBelowTheMinimumRuntime) {
  std::vector<Task> tasks = {Finished(0, absl::Seconds(1)), Finished(1, absl::Seconds(1)),
                             Finished(2, absl::Seconds(1)), Running(3, absl::Seconds(9)),
                             Running(4, absl::Seconds(11))};
  EXPECT_THAT(FindStragglers(tasks, Policy(), kNow), ElementsAre(4));
}

TEST(FindStragglers, ATaskWithABackupAlreadyIsLeftAlone) {
  std::vector<Task> tasks = Peers();
  Task raced = Running(3, absl::Hours(1));
  raced.shadow = Task::Shadow{1, "exe-slow"};
  tasks.push_back(raced);
  EXPECT_THAT(FindStragglers(tasks, Policy(), kNow), IsEmpty());
}

}  // namespace
}  // namespace minions
