// Throughput-aware task sizes through the real services: a job submitted without a shard size
// gets tasks sized from how fast the finished tasks of its model ran (the fake clock says how
// long each took), within the server's bounds; a size asked for is kept.
#include "grpc_service_fixture.h"

namespace minions::testing {
namespace {

class TaskSizerTest : public GrpcServiceTest {
 protected:
  void Start(int64_t max_tasks_per_job = 10000) {
    ServerOptions options = Options();
    options.task_sizing.target = absl::Minutes(1);
    options.task_sizing.default_records = 10;
    options.task_sizing.min_records = 2;
    options.task_sizing.max_records = 100;
    options.max_tasks_per_job = max_tasks_per_job;
    StartServer(&fake_clock_, options);
    executor_ = RegisterExecutor("worker");
  }

  // Runs every task of `job` on the executor, each taking `each` of the fake clock.
  void RunTasks(const v1::Job& job, absl::Duration each) {
    for (int64_t i = 0; i < job.n_tasks(); ++i) {
      v1::TaskLease got = MustLeaseOne(executor_);
      fake_clock_.Advance(each);
      auto [done, failed] = Serve(got);
      ASSERT_GRPC_OK(Complete(executor_, got.ref(), done, failed));
    }
    WaitForState(job.id(), "completed");
  }

  // A job of `records` records sized by the server (no shard size asked for).
  v1::Job SubmitSized(int records) { return MustSubmit(Records(records), 0); }

  std::string executor_;
};

TEST_F(TaskSizerTest, AJobWithNoHistoryGetsTheDefaultSize) {
  Start();
  v1::Job job = SubmitSized(30);
  EXPECT_EQ(job.shard_size(), 10);
  EXPECT_EQ(job.n_tasks(), 3);
}

TEST_F(TaskSizerTest, ASlowFleetGetsSmallerTasks) {
  Start();
  v1::Job first = SubmitSized(30);
  RunTasks(first, absl::Seconds(100));  // 10 records in 100 s: 0.1 records/s
  v1::Job next = SubmitSized(30);
  EXPECT_EQ(next.shard_size(), 6);  // a minute's worth
  EXPECT_EQ(next.n_tasks(), 5);
}

TEST_F(TaskSizerTest, AFastFleetGetsLargerTasks) {
  Start();
  v1::Job first = SubmitSized(30);
  RunTasks(first, absl::Seconds(10));  // 1 record/s
  v1::Job next = SubmitSized(150);
  EXPECT_EQ(next.shard_size(), 60);
  EXPECT_EQ(next.n_tasks(), 3);
}

TEST_F(TaskSizerTest, SizesFollowTheFleetAsItChanges) {
  Start();
  RunTasks(SubmitSized(30), absl::Seconds(10));  // 1 record/s: 60 a task
  v1::Job second = SubmitSized(120);
  ASSERT_EQ(second.shard_size(), 60);
  RunTasks(second, absl::Seconds(120));  // the fleet got slower: 0.5 records/s
  // The recent tasks weigh most: between the old minute's 60 and the new one's 30.
  v1::Job third = SubmitSized(30);
  EXPECT_LT(third.shard_size(), 60);
  EXPECT_GT(third.shard_size(), 30);
}

TEST_F(TaskSizerTest, MeasuredSizesAreBoundedBothWays) {
  Start();
  RunTasks(SubmitSized(30), absl::Hours(1));  // 10 records an hour: 0.17 records a minute
  EXPECT_EQ(SubmitSized(30).shard_size(), 2);  // min_records
}

TEST_F(TaskSizerTest, AVeryFastFleetIsBoundedAbove) {
  Start();
  RunTasks(SubmitSized(30), absl::Milliseconds(10));  // 1,000 records/s
  EXPECT_EQ(SubmitSized(300).shard_size(), 100);  // max_records
}

TEST_F(TaskSizerTest, ASizeAskedForIsKept) {
  Start();
  RunTasks(SubmitSized(30), absl::Seconds(100));
  v1::Job asked = MustSubmit(Records(30), 15);
  EXPECT_EQ(asked.shard_size(), 15);
  EXPECT_EQ(asked.n_tasks(), 2);
}

TEST_F(TaskSizerTest, SmallMeasuredTasksGrowSoThatAJobStaysWithinItsTaskLimit) {
  Start(/*max_tasks_per_job=*/4);
  RunTasks(SubmitSized(30), absl::Seconds(100));  // 6 records a task
  v1::Job big = SubmitSized(40);                  // would be 7 tasks
  EXPECT_EQ(big.shard_size(), 10);
  EXPECT_EQ(big.n_tasks(), 4);
  EXPECT_EQ(big.state(), "queued");
}

}  // namespace
}  // namespace minions::testing

namespace minions::testing {
namespace {

// Every completion is measured up to the sampler's rate for a model and runner; past it, none
// until the second ends; another model or runner has its own count.
TEST(CompletionSamplerTest, MeasuresEveryCompletionUpToItsRateAndEachModelAndRunnerApart) {
  CompletionSampler sampler(/*per_second=*/3);
  const ThroughputKey tiny{"/models/tiny.gguf", "llama"};
  const ThroughputKey other{"/models/other.gguf", "llama"};
  const ThroughputKey tiny_echo{"/models/tiny.gguf", "echo"};
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(sampler.Take(tiny, t0 + absl::Milliseconds(100 * i))) << i;
  EXPECT_FALSE(sampler.Take(tiny, t0 + absl::Milliseconds(500)));
  EXPECT_FALSE(sampler.Take(tiny, t0 + absl::Milliseconds(999)));
  EXPECT_TRUE(sampler.Take(other, t0 + absl::Milliseconds(500)));
  EXPECT_TRUE(sampler.Take(tiny_echo, t0 + absl::Milliseconds(500)));
  // The second ended: measured again.
  EXPECT_TRUE(sampler.Take(tiny, t0 + absl::Seconds(1)));
  EXPECT_TRUE(sampler.Take(tiny, t0 + absl::Seconds(1)));
  EXPECT_TRUE(sampler.Take(tiny, t0 + absl::Seconds(1)));
  EXPECT_FALSE(sampler.Take(tiny, t0 + absl::Seconds(1)));
  // A clock that stepped back starts a new window rather than starving the key.
  EXPECT_TRUE(sampler.Take(tiny, t0));
}

}  // namespace
}  // namespace minions::testing
