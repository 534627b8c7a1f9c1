// Completions of many executors committed in batches (group commit, server/group_commit.h, with
// ChunkChecker::CompleteMany as the commit: the batch's tasks read once, its uploads checked, one
// store transaction), on a real SQLite store, a local object store and the fake clock. The batch
// being committed is held at a gate the test opens, so what lands in which batch is decided by
// the test's own steps, never by timing.

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "blob/local/local_blob_store.h"
#include "runner/batch_record.h"
#include "server/chunk_check.h"
#include "server/group_commit.h"
#include "server/job_splitter.h"
#include "server/keys.h"
#include "server_test_util.h"
#include "store_fixture.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/fake_clock.h"

namespace minions::testing {
namespace {

using Outcomes = std::vector<absl::Status>;
using CompletionCommitter = GroupCommitter<CompletionCall, Outcomes>;

std::string Ok(const std::string& id) { return DumpJson(MakeResponseLine(id, Json{{"text", "t"}})) + "\n"; }

class CompletionBatchTest : public StoreAndBlobsTest {
 protected:
  static constexpr int kTasks = 6;

  void SetUp() override {
    StoreAndBlobsTest::SetUp();
    job_id_ = QueueOneRecordTasks(*store_, *blobs_, "inputs/in.jsonl", kTasks, clock_.Now(), "search");
    ASSERT_FALSE(job_id_.empty());
    checker_ = std::make_unique<ChunkChecker>(store_.get(), blobs_.get());
  }

  // The committer, committing through the gate: while `hold_` is set, a batch waits at the gate
  // (`entered_` says one is there) until the test opens it. Each batch's size is recorded.
  std::unique_ptr<CompletionCommitter> Committer() {
    return std::make_unique<CompletionCommitter>(
        [this](const std::vector<CompletionCall>& calls)
            -> absl::StatusOr<std::vector<absl::StatusOr<Outcomes>>> {
          {
            absl::MutexLock lock(&mu_);
            sizes_.push_back(static_cast<int>(calls.size()));
          }
          if (hold_) {
            hold_ = false;
            entered_.Notify();
            open_.WaitForNotification();
          }
          absl::StatusOr<CompletionReply> reply = checker_->CompleteMany(calls, clock_.Now());
          if (!reply.ok()) return reply.status();
          {
            absl::MutexLock lock(&mu_);
            finalizing_.insert(finalizing_.end(), reply->finalizing.begin(), reply->finalizing.end());
          }
          return std::move(reply->outcomes);
        },
        256);
  }

  std::string Register(const std::string& name) { return RegisterInStore(*store_, name, 4, clock_.Now()); }

  // `executor` leases one task and uploads its honest output (record rI answered).
  Lease LeaseAndRun(const std::string& executor) {
    auto leases = store_->LeaseTasks(executor, 1, absl::Seconds(30), clock_.Now());
    EXPECT_TRUE(leases.ok() && leases->size() == 1);
    if (!leases.ok() || leases->empty()) return Lease{};
    const Task& t = leases->front().task;
    EXPECT_TRUE(blobs_->Put(keys::ChunkOutput(job_id_, t.index, t.attempt, 0), Ok(absl::StrCat("r", t.index))).ok());
    return leases->front();
  }

  static LeaseProgress Done(const Lease& lease) {
    return LeaseProgress{lease.task.job_id, lease.task.index, lease.task.attempt, 1, 0, {}};
  }

  static void AwaitWaiting(const CompletionCommitter& committer, int64_t n) { AwaitWaitingAtTheGate(committer, n); }

  std::vector<int> sizes() {
    absl::MutexLock lock(&mu_);
    return sizes_;
  }
  std::vector<std::string> finalizing() {
    absl::MutexLock lock(&mu_);
    return finalizing_;
  }

  std::unique_ptr<ChunkChecker> checker_;
  std::string job_id_;
  std::atomic<bool> hold_{false};
  absl::Notification entered_, open_;
  absl::Mutex mu_;
  std::vector<int> sizes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> finalizing_ ABSL_GUARDED_BY(mu_);
};

TEST_F(CompletionBatchTest, CompletionsThatArriveWhileABatchCommitsAreCommittedTogetherEachWithItsOwnOutcome) {
  const std::string first = Register("first"), a = Register("a"), b = Register("b"), c = Register("c"),
                    d = Register("d"), e = Register("e");
  const Lease of_first = LeaseAndRun(first), of_a = LeaseAndRun(a), of_b = LeaseAndRun(b), of_c = LeaseAndRun(c),
              of_d = LeaseAndRun(d), of_e = LeaseAndRun(e);
  // d's upload is a forgery: it answers another record.
  ASSERT_OK(blobs_->Put(keys::ChunkOutput(job_id_, of_d.task.index, of_d.task.attempt, 0), Ok("someone-else")));
  auto committer = Committer();

  // The first completion finds nothing being committed: it commits at once, alone (and is held at
  // the gate while the others arrive).
  hold_ = true;
  absl::StatusOr<Outcomes> first_outcomes;
  std::thread first_thread([&] { first_outcomes = committer->Wait({first, {Done(of_first)}}); });
  entered_.WaitForNotification();

  // Five more arrive meanwhile, from threads of their own: a completes its task; b its own and
  // e's (not b's to complete); c an attempt it does not hold (stale); d a forged chunk; and an
  // executor nobody registered, e's task.
  LeaseProgress stale = Done(of_c);
  stale.attempt += 1;
  absl::StatusOr<Outcomes> a_outcomes, b_outcomes, c_outcomes, d_outcomes, nobody_outcomes;
  std::vector<std::thread> threads;
  threads.emplace_back([&] { a_outcomes = committer->Wait({a, {Done(of_a)}}); });
  threads.emplace_back([&] { b_outcomes = committer->Wait({b, {Done(of_b), Done(of_e)}}); });
  threads.emplace_back([&] { c_outcomes = committer->Wait({c, {stale}}); });
  threads.emplace_back([&] { d_outcomes = committer->Wait({d, {Done(of_d)}}); });
  threads.emplace_back([&] { nobody_outcomes = committer->Wait({"exe-000000000000", {Done(of_e)}}); });
  AwaitWaiting(*committer, 5);
  open_.Notify();
  first_thread.join();
  for (std::thread& t : threads) t.join();

  // One transaction for the five that waited.
  EXPECT_THAT(sizes(), ElementsAre(1, 5));
  EXPECT_EQ(committer->batches(), 2);
  ASSERT_OK(first_outcomes.status());
  EXPECT_THAT(*first_outcomes, ElementsAre(absl::OkStatus()));
  ASSERT_OK(a_outcomes.status());
  EXPECT_THAT(*a_outcomes, ElementsAre(absl::OkStatus()));
  ASSERT_OK(b_outcomes.status());
  ASSERT_THAT(*b_outcomes, SizeIs(2));
  EXPECT_OK((*b_outcomes)[0]);
  // e's task is not b's: refused, nothing changed.
  EXPECT_EQ((*b_outcomes)[1].code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_OK(c_outcomes.status());
  ASSERT_THAT(*c_outcomes, SizeIs(1));
  EXPECT_EQ((*c_outcomes)[0].code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_OK(d_outcomes.status());
  ASSERT_THAT(*d_outcomes, SizeIs(1));
  EXPECT_EQ((*d_outcomes)[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string((*d_outcomes)[0].message()), HasSubstr("is not answered"));
  EXPECT_EQ(nobody_outcomes.status().code(), absl::StatusCode::kNotFound);

  auto state = [&](const Lease& lease) {
    absl::StatusOr<Task> task = store_->GetTask(job_id_, lease.task.index);
    return task.ok() ? task->state : TaskState::kCancelled;
  };
  EXPECT_EQ(state(of_first), TaskState::kSucceeded);
  EXPECT_EQ(state(of_a), TaskState::kSucceeded);
  EXPECT_EQ(state(of_b), TaskState::kSucceeded);
  EXPECT_EQ(state(of_c), TaskState::kRunning);  // c still holds it: the stale report changed nothing
  EXPECT_EQ(state(of_d), TaskState::kPending);  // the forgery failed d's attempt (retryable)
  EXPECT_EQ(state(of_e), TaskState::kRunning);  // neither b nor a stranger may complete it
  EXPECT_EQ(checker_->rejected(), 1);
  ASSERT_OK_AND_ASSIGN(Job job, store_->GetJob(job_id_));
  EXPECT_EQ(job.tasks_done, 3);
  EXPECT_EQ(job.counts.completed, 3);

  // Each refusal is what the same report gets alone.
  ASSERT_OK_AND_ASSIGN(Outcomes alone, checker_->CompleteTasks(b, {Done(of_e)}, clock_.Now()));
  EXPECT_EQ(alone[0], (*b_outcomes)[1]);
  ASSERT_OK_AND_ASSIGN(alone, checker_->CompleteTasks(c, {stale}, clock_.Now()));
  EXPECT_EQ(alone[0], (*c_outcomes)[0]);
  EXPECT_EQ(checker_->CompleteTasks("exe-000000000000", {Done(of_e)}, clock_.Now()).status(),
            nobody_outcomes.status());
  EXPECT_THAT(finalizing(), ::testing::IsEmpty());
}

TEST_F(CompletionBatchTest, TheBatchThatEndsAJobNamesItOnceReadyToFinalize) {
  std::vector<std::string> executors;
  std::vector<Lease> leases;
  for (int i = 0; i < kTasks; ++i) {
    executors.push_back(Register(absl::StrCat("e", i)));
    leases.push_back(LeaseAndRun(executors.back()));
  }
  auto committer = Committer();
  hold_ = true;
  absl::StatusOr<Outcomes> first;
  std::thread first_thread([&] { first = committer->Wait({executors[0], {Done(leases[0])}}); });
  entered_.WaitForNotification();
  std::vector<absl::StatusOr<Outcomes>> rest(kTasks);
  std::vector<std::thread> threads;
  for (int i = 1; i < kTasks; ++i) {
    threads.emplace_back([&, i] { rest[i] = committer->Wait({executors[i], {Done(leases[i])}}); });
  }
  AwaitWaiting(*committer, kTasks - 1);
  open_.Notify();
  first_thread.join();
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(sizes(), ElementsAre(1, kTasks - 1));
  ASSERT_OK(first.status());
  for (int i = 1; i < kTasks; ++i) {
    ASSERT_OK(rest[i].status());
    EXPECT_THAT(*rest[i], ElementsAre(absl::OkStatus()));
  }
  EXPECT_THAT(finalizing(), ElementsAre(job_id_));
  ASSERT_OK_AND_ASSIGN(Job job, store_->GetJob(job_id_));
  EXPECT_EQ(job.state, JobState::kFinalizing);
  // The job's spec was read once (to check the uploads), not once per completion.
  EXPECT_EQ(checker_->job_specs().misses(), 1);
}

}  // namespace
}  // namespace minions::testing
