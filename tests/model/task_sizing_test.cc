#include "model/task_sizing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace minions {
namespace {

using ::testing::HasSubstr;

Throughput Measured(double records, double seconds, int64_t samples = 3) {
  Throughput t;
  t.records = records;
  t.seconds = seconds;
  t.samples = samples;
  return t;
}

TEST(TaskSizingTest, WithoutHistoryTheDefaultSize) {
  TaskSizing sizing;
  TaskSize size = SizeTasks(std::nullopt, sizing);
  EXPECT_EQ(size.records, 100);
  EXPECT_THAT(size.why, HasSubstr("no finished task"));
  // A throughput of nothing measured is no history either.
  EXPECT_EQ(SizeTasks(Measured(0, 0), sizing).records, 100);
}

TEST(TaskSizingTest, TasksRunAboutTheTargetTime) {
  TaskSizing sizing;  // one minute
  EXPECT_EQ(SizeTasks(Measured(50, 10), sizing).records, 300);   // 5 records/s
  EXPECT_EQ(SizeTasks(Measured(10, 40), sizing).records, 15);    // 0.25 records/s
  sizing.target = absl::Seconds(20);
  EXPECT_EQ(SizeTasks(Measured(50, 10), sizing).records, 100);
  EXPECT_THAT(SizeTasks(Measured(50, 10), sizing).why, HasSubstr("5 records/s"));
}

TEST(TaskSizingTest, SizesAreBoundedBothWays) {
  TaskSizing sizing;
  sizing.min_records = 4;
  sizing.max_records = 1000;
  TaskSize slow = SizeTasks(Measured(1, 600), sizing);  // one record every ten minutes
  EXPECT_EQ(slow.records, 4);
  EXPECT_THAT(slow.why, HasSubstr("bounded"));
  EXPECT_EQ(SizeTasks(Measured(1e6, 1), sizing).records, 1000);
  EXPECT_EQ(SizeTasks(Measured(1e300, 1e-300), sizing).records, 1000);  // no overflow
  // Never less than one record, whatever the configuration.
  sizing.min_records = 0;
  EXPECT_EQ(SizeTasks(Measured(1, 6000), sizing).records, 1);
}

Task Completed(int attempt, absl::Duration took) {
  Task task;
  task.n_records = 100;
  task.state = TaskState::kSucceeded;
  task.attempt = attempt;
  task.started_at = absl::UnixEpoch() + absl::Hours(1);
  task.finished_at = *task.started_at + took;
  return task;
}

TEST(TaskSizingTest, AnAttemptIsMeasuredOnTheRecordsItProcessedItself) {
  Task task = Completed(2, absl::Seconds(30));
  // Attempt 1 committed records [0, 40) before it was preempted; attempt 2 did the other 60.
  task.chunks = {Chunk{1, 0, 0, 25, 0}, Chunk{1, 1, 25, 40, 0}, Chunk{2, 0, 40, 100, 0}};
  auto sample = SampleOfCompletion(task, 2);
  ASSERT_TRUE(sample.has_value());
  EXPECT_EQ(sample->records, 60);
  EXPECT_EQ(sample->took, absl::Seconds(30));
}

TEST(TaskSizingTest, NothingUsableMeasuresNothing) {
  // A straggler's shadow (attempt 1) won: the task's times are its backup's.
  EXPECT_FALSE(SampleOfCompletion(Completed(2, absl::Seconds(30)), 1).has_value());
  // Not succeeded, or no run time.
  Task failed = Completed(1, absl::Seconds(30));
  failed.state = TaskState::kFailed;
  EXPECT_FALSE(SampleOfCompletion(failed, 1).has_value());
  EXPECT_FALSE(SampleOfCompletion(Completed(1, absl::ZeroDuration()), 1).has_value());
  // Every record resumed from checkpoints: nothing of its own.
  Task resumed = Completed(2, absl::Seconds(1));
  resumed.chunks = {Chunk{1, 0, 0, 100, 0}};
  EXPECT_FALSE(SampleOfCompletion(resumed, 2).has_value());
}

TEST(TaskSizingTest, TheKeyIsTheModelsDigestOrPathAndTheRunner) {
  JobSpec spec;
  spec.model = "llama-small";
  spec.model_digest = "sha256:ab";
  spec.requirements.runner = "llama";
  EXPECT_EQ(ThroughputKeyOf(spec), (ThroughputKey{"sha256:ab", "llama"}));
  spec.model = "/models/m.gguf";
  spec.model_digest.clear();
  EXPECT_EQ(ThroughputKeyOf(spec), (ThroughputKey{"/models/m.gguf", "llama"}));
  // Answers of about the same length share a measurement; longer ones have their own.
  spec.tokens_per_record = 8;
  EXPECT_EQ(ThroughputKeyOf(spec), (ThroughputKey{"/models/m.gguf", "llama#answers<=16"}));
  spec.tokens_per_record = 64;
  EXPECT_EQ(ThroughputKeyOf(spec), (ThroughputKey{"/models/m.gguf", "llama#answers<=64"}));
  spec.tokens_per_record = 65;
  EXPECT_EQ(ThroughputKeyOf(spec), (ThroughputKey{"/models/m.gguf", "llama#answers<=128"}));
}

TEST(TaskSizingTest, AnswerTokensBucketsArePowersOfTwo) {
  EXPECT_EQ(AnswerTokensBucket(0), 0);
  EXPECT_EQ(AnswerTokensBucket(1), 16);
  EXPECT_EQ(AnswerTokensBucket(16), 16);
  EXPECT_EQ(AnswerTokensBucket(17), 32);
  EXPECT_EQ(AnswerTokensBucket(4096), 4096);
  EXPECT_GT(AnswerTokensBucket(int64_t{1} << 50), 0);  // bounded, no overflow
}

TEST(TaskSizingTest, ASmallJobSpreadsOverTheFreeExecutors) {
  std::string why;
  // 300 records measured into one task of 4,329: six free executors get 50 each.
  EXPECT_EQ(SpreadOverFreeExecutors(300, 4329, 6, 1, &why), 50);
  EXPECT_THAT(why, HasSubstr("300 records spread over the 6 free executors: tasks of 50 (not 4329)"));
  // Never below the server's minimum task size; never larger than the measured size.
  EXPECT_EQ(SpreadOverFreeExecutors(300, 4329, 6, 100, nullptr), 100);
  EXPECT_EQ(SpreadOverFreeExecutors(300, 40, 6, 1, nullptr), 40);  // 8 tasks already
  // A big job keeps its measured size; one free executor (or none) changes nothing.
  EXPECT_EQ(SpreadOverFreeExecutors(180000, 4329, 6, 1, nullptr), 4329);
  EXPECT_EQ(SpreadOverFreeExecutors(300, 4329, 1, 1, nullptr), 4329);
  EXPECT_EQ(SpreadOverFreeExecutors(300, 4329, 0, 1, nullptr), 4329);
  // Fewer records than free executors: a record each.
  EXPECT_EQ(SpreadOverFreeExecutors(3, 100, 6, 1, nullptr), 1);
}

}  // namespace
}  // namespace minions
