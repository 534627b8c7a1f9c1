// Presence (server/presence.h) on its own: which executors are attached, and the backups of the
// tasks of one whose last stream closed, on a real SQLite store and the fake clock. Its thread does
// the backups; the test waits for what it does, never for a time.

#include "server/presence.h"

#include <atomic>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/job_splitter.h"
#include "server_test_util.h"
#include "store_fixture.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "blob/local/local_blob_store.h"
#include "testing/fake_clock.h"

namespace minions::testing {
namespace {

class PresenceTest : public StoreAndBlobsTest {
 protected:
  void SetUp() override {
    StoreAndBlobsTest::SetUp();
    job_id_ = QueueOneRecordTasks(*store_, *blobs_, "inputs/in.jsonl", 2, clock_.Now());
    ASSERT_FALSE(job_id_.empty());
    runner_ = RegisterInStore(*store_, "runner", 4, clock_.Now());
    ASSERT_OK_AND_ASSIGN(std::vector<Lease> leases, store_->LeaseTasks(runner_, 2, absl::Seconds(30), clock_.Now()));
    ASSERT_EQ(leases.size(), 2u);
  }

  Presence::Hooks Hooks() {
    return {[this](const std::string& executor_id, absl::Time) {
              absl::MutexLock lock(&mu_);
              lost_.push_back(executor_id);
            },
            [this] { ++work_arrived_; }};
  }

  // Until `presence` has backed up the tasks of `n` executors.
  static void AwaitDetached(const Presence& presence, int64_t n) {
    for (int i = 0; i < 20000 && presence.detached_abruptly() < n; ++i) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_EQ(presence.detached_abruptly(), n);
  }

  int Shadows() {
    auto tasks = store_->ListTasks(job_id_);
    EXPECT_OK(tasks);
    int n = 0;
    for (const Task& t : *tasks) n += t.shadow.has_value();
    return n;
  }

  std::string job_id_;
  std::string runner_;
  absl::Mutex mu_;
  std::vector<std::string> lost_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> work_arrived_{0};
};

TEST_F(PresenceTest, ALastStreamClosingBacksUpEveryTaskItsExecutorRuns) {
  Presence presence(store_.get(), &clock_, Hooks());
  presence.Attached(runner_);
  presence.Attached(runner_);  // a reconnect: two streams for a moment
  EXPECT_EQ(presence.attached(), 2);
  presence.Detached(runner_);  // the old one closes: it is still here
  EXPECT_EQ(presence.attached(), 1);
  presence.Detached(runner_);
  AwaitDetached(presence, 1);
  EXPECT_EQ(presence.attached(), 0);
  EXPECT_EQ(Shadows(), 2) << "both its tasks have a backup attempt";
  EXPECT_EQ(work_arrived_.load(), 1) << "the backups are work for the idle";
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(lost_, std::vector<std::string>{runner_});
}

TEST_F(PresenceTest, StreamsTheServersShutdownEndsBackUpNothing) {
  Presence presence(store_.get(), &clock_, Hooks());
  presence.Attached(runner_);
  presence.Stop();
  presence.Detached(runner_);
  // Nothing was queued for the thread: no backup can come later either.
  EXPECT_EQ(presence.attached(), 0);
  EXPECT_EQ(presence.detached_abruptly(), 0);
  EXPECT_EQ(Shadows(), 0);
}

TEST_F(PresenceTest, AnExecutorWithNothingRunningCountsAsNoAbruptGoing) {
  // Its tasks end first (handed back), then its stream closes: nothing to back up, nothing announced.
  ASSERT_OK_AND_ASSIGN(std::vector<Task> tasks, store_->ListTasks(job_id_));
  for (const Task& t : tasks) {
    ASSERT_OK(store_->FailTask(runner_, job_id_, t.index, t.attempt, FailureClass::kPreempted, "owner back",
                               clock_.Now())
                  .status());
  }
  Presence presence(store_.get(), &clock_, Hooks());
  presence.Attached(runner_);
  presence.Detached(runner_);
  // The thread has taken it when the lost hook heard of it.
  for (int i = 0; i < 20000; ++i) {
    {
      absl::MutexLock lock(&mu_);
      if (!lost_.empty()) break;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(lost_, std::vector<std::string>{runner_});
  }
  EXPECT_EQ(presence.detached_abruptly(), 0);
  EXPECT_EQ(work_arrived_.load(), 0);
}

}  // namespace
}  // namespace minions::testing
