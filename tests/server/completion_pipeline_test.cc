// CompletionPipeline (server/completion_pipeline.h) on its own: what follows the end of an attempt
// (a job ready to finalise, work announced when a quota-limited team freed a place), on a real
// SQLite store, a local object store and the fake clock.

#include "server/completion_pipeline.h"

#include <atomic>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "blob/local/local_blob_store.h"
#include "runner/batch_record.h"
#include "server/job_splitter.h"
#include "server/keys.h"
#include "server_test_util.h"
#include "store_fixture.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/fake_clock.h"

namespace minions::testing {
namespace {

class CompletionPipelineTest : public StoreAndBlobsTest {
 protected:
  void SetUp() override {
    StoreAndBlobsTest::SetUp();
    chunks_ = std::make_unique<ChunkChecker>(store_.get(), blobs_.get());
    pipeline_ = std::make_unique<CompletionPipeline>(store_.get(), &clock_, chunks_.get(), nullptr, 256,
                                                     CompletionPipeline::Hooks{[this] { ++work_arrived_; },
                                                                               [this](const std::string& job_id) {
                                                                                 absl::MutexLock lock(&mu_);
                                                                                 ready_.push_back(job_id);
                                                                               }});
    executor_ = RegisterInStore(*store_, "runner", 8, clock_.Now());
  }

  // A job of `team` with `tasks` tasks of one record each.
  std::string Job(const std::string& team, int tasks) {
    const std::string key = absl::StrCat("inputs/", team, "-", jobs_++, ".jsonl");
    return QueueOneRecordTasks(*store_, *blobs_, key, tasks, clock_.Now(), team);
  }

  // The executor leases one task and uploads its honest output; the report of it done.
  LeaseProgress LeaseAndRun() {
    auto leases = store_->LeaseTasks(executor_, 1, absl::Seconds(30), clock_.Now());
    EXPECT_TRUE(leases.ok() && leases->size() == 1);
    if (!leases.ok() || leases->empty()) return LeaseProgress{};
    const Task& t = leases->front().task;
    const std::string line = DumpJson(MakeResponseLine(absl::StrCat("r", t.index), Json{{"text", "t"}})) + "\n";
    EXPECT_OK(blobs_->Put(keys::ChunkOutput(t.job_id, t.index, t.attempt, 0), line));
    return LeaseProgress{t.job_id, t.index, t.attempt, 1, 0, {}};
  }

  void Limit(const std::string& team, int64_t max_running_tasks) {
    Team t;
    t.name = team;
    t.max_running_tasks = max_running_tasks;
    t.created_at = clock_.Now();
    absl::StatusOr<Team> existing = store_->GetTeam(team);
    EXPECT_OK(existing.ok() ? store_->UpdateTeam(t).status() : store_->CreateTeam(t).status());
  }

  std::vector<std::string> ready() {
    absl::MutexLock lock(&mu_);
    return ready_;
  }

  std::unique_ptr<ChunkChecker> chunks_;
  std::unique_ptr<CompletionPipeline> pipeline_;  // after what it uses: destroyed first
  std::string executor_;
  int jobs_ = 0;
  std::atomic<int> work_arrived_{0};
  absl::Mutex mu_;
  std::vector<std::string> ready_ ABSL_GUARDED_BY(mu_);
};

TEST_F(CompletionPipelineTest, TheLastTasksCompletionReportsItsJobReadyOnce) {
  const std::string job = Job("search", 2);
  ASSERT_OK_AND_ASSIGN(std::vector<absl::Status> first, pipeline_->Complete(executor_, {LeaseAndRun()}));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_OK(first[0]);
  EXPECT_TRUE(ready().empty()) << "a task is still pending";
  ASSERT_OK_AND_ASSIGN(std::vector<absl::Status> second, pipeline_->Complete(executor_, {LeaseAndRun()}));
  EXPECT_OK(second[0]);
  EXPECT_EQ(ready(), std::vector<std::string>{job});
  EXPECT_EQ(work_arrived_.load(), 0) << "a team without a quota frees no place anyone waits for";
}

TEST_F(CompletionPipelineTest, AQuotaLimitedTeamsEndedTaskAnnouncesWorkAndItsQuotaIsLookedUpOncePerRecheck) {
  Limit("capped", 1);
  Job("capped", 4);
  ASSERT_OK(pipeline_->Complete(executor_, {LeaseAndRun()}).status());
  EXPECT_EQ(work_arrived_.load(), 1) << "its freed place may let its queued tasks be leased";
  EXPECT_EQ(pipeline_->quota_lookups(), 1);
  // The quota is lifted: until the recheck is due, the server still counts the team as limited.
  Limit("capped", 0);
  clock_.Advance(CompletionPipeline::kTeamQuotaRecheck / 2);
  ASSERT_OK(pipeline_->Complete(executor_, {LeaseAndRun()}).status());
  EXPECT_EQ(work_arrived_.load(), 2);
  EXPECT_EQ(pipeline_->quota_lookups(), 1) << "looked up at most once per recheck";
  clock_.Advance(CompletionPipeline::kTeamQuotaRecheck);
  ASSERT_OK(pipeline_->Complete(executor_, {LeaseAndRun()}).status());
  EXPECT_EQ(pipeline_->quota_lookups(), 2);
  EXPECT_EQ(work_arrived_.load(), 2) << "no quota any more: nothing to announce";
}

TEST_F(CompletionPipelineTest, AFailureThatRequeuesAnnouncesWorkAndOneThatEndsTheJobReportsItReady) {
  const std::string job = Job("search", 2);
  ASSERT_OK_AND_ASSIGN(Task requeued, pipeline_->Fail(executor_, LeaseAndRun(), FailureClass::kRetryable, "it broke"));
  EXPECT_EQ(requeued.state, TaskState::kPending);
  EXPECT_EQ(work_arrived_.load(), 1) << "the task is work again";
  clock_.Advance(absl::Minutes(10));  // past any retry backoff
  ASSERT_OK(pipeline_->Complete(executor_, {LeaseAndRun()}).status());
  EXPECT_TRUE(ready().empty()) << "a task is still pending";
  // A permanent failure ends the last task, and with it the job (one task succeeded: it is merged).
  ASSERT_OK_AND_ASSIGN(Task failed, pipeline_->Fail(executor_, LeaseAndRun(), FailureClass::kPermanent, "bad model"));
  EXPECT_EQ(failed.state, TaskState::kFailed);
  EXPECT_EQ(ready(), std::vector<std::string>{job});
  EXPECT_EQ(work_arrived_.load(), 1) << "a team without a quota frees no place anyone waits for";
}

TEST_F(CompletionPipelineTest, AStaleReportIsRefusedAndChangesNothing) {
  Job("search", 1);
  LeaseProgress report = LeaseAndRun();
  report.attempt += 1;  // an attempt the store never granted
  ASSERT_OK_AND_ASSIGN(std::vector<absl::Status> outcomes, pipeline_->Complete(executor_, {report}));
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_FALSE(outcomes[0].ok());
  EXPECT_TRUE(ready().empty());
  EXPECT_EQ(work_arrived_.load(), 0);
}

}  // namespace
}  // namespace minions::testing
