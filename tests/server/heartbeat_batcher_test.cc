// Heartbeats written in batches (group commit, server/heartbeat_batcher.h), on a real SQLite store
// and the fake clock. The batch being written is held at a gate the test opens, so what lands in
// which batch is decided by the test's own steps, never by timing.

#include "server/heartbeat_batcher.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/even_tasks.h"
#include "server_test_util.h"
#include "testing/fake_clock.h"
#include "testing/must.h"

namespace minions {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

class HeartbeatBatcherTest : public ::testing::Test {
 protected:
  const absl::Duration kTtl = absl::Seconds(9);

  void SetUp() override {
    store_ = testing::Must(SqliteMetadataStore::Open(":memory:", StoreOptions{}));
  }

  // The batcher, writing through the gate: while `hold_` is set, a batch waits at the gate
  // (`entered_` says one is there) until the test opens it. Each batch's size is recorded.
  std::unique_ptr<HeartbeatBatcher> Batcher(int max_batch = 256, absl::Duration linger = absl::ZeroDuration()) {
    return std::make_unique<HeartbeatBatcher>(
        [this](const std::vector<HeartbeatCall>& calls, absl::Duration ttl,
               absl::Time now) -> absl::StatusOr<std::vector<HeartbeatReply>> {
          {
            absl::MutexLock lock(&mu_);
            sizes_.push_back(static_cast<int>(calls.size()));
            std::vector<std::string> ids;
            for (const HeartbeatCall& call : calls) ids.push_back(call.executor_id);
            batches_.push_back(std::move(ids));
          }
          if (hold_) {
            hold_ = false;
            entered_.Notify();
            open_.WaitForNotification();
          }
          for (const HeartbeatCall& call : calls) {
            if (call.executor_id == failing_) return absl::UnavailableError("the store fails this one");
          }
          return store_->Heartbeats(calls, ttl, now);
        },
        &clock_, max_batch, linger);
  }

  std::string Register(const std::string& name) { return testing::RegisterInStore(*store_, name, 1, clock_.Now()); }

  // A heartbeat of available executor `id` through `batcher`, on a thread of its own: it must be answered.
  std::thread BeatAvailable(HeartbeatBatcher& batcher, const std::string& id) {
    return std::thread([this, &batcher, id] {
      EXPECT_TRUE(batcher.Heartbeat({id, ExecutorState::kAvailable}, kTtl).ok());
    });
  }
  // While a batch is held at the gate (`holder`: the heartbeat it holds, on its thread), `a` then
  // `b` beat, each once all before it wait (`waiting` before `a`); then the gate opens, and every
  // heartbeat is answered.
  void ThenTwoBeatWhileHeld(HeartbeatBatcher& batcher, std::thread holder, const std::string& a, const std::string& b,
                            int waiting) {
    std::thread a_thread = BeatAvailable(batcher, a);
    AwaitWaiting(batcher, waiting + 1);
    std::thread b_thread = BeatAvailable(batcher, b);
    AwaitWaiting(batcher, waiting + 2);
    open_.Notify();
    for (std::thread* t : {&holder, &a_thread, &b_thread}) t->join();
  }

  // A job of `n` tasks; `executor` leases one of them.
  Lease LeaseOne(const std::string& executor) {
    JobSpec spec;
    spec.team = "search";
    spec.model = "/models/tiny.gguf";
    spec.input_key = "inputs/in.jsonl";
    spec.shard_size = 10;
    auto job = store_->CreateJob(spec, clock_.Now());
    EXPECT_TRUE(job.ok()) << job.status();
    EXPECT_TRUE(store_->AddTasks(job->id, testing::EvenTasks(1, 10, 1000), 10, clock_.Now()).ok());
    auto leases = store_->LeaseTasks(executor, 1, kTtl, clock_.Now());
    EXPECT_TRUE(leases.ok() && leases->size() == 1);
    return leases.ok() && !leases->empty() ? leases->front() : Lease{};
  }

  static LeaseProgress Progress(const Lease& lease, int64_t done) {
    LeaseProgress p;
    p.job_id = lease.task.job_id;
    p.task_index = lease.task.index;
    p.attempt = lease.task.attempt;
    p.records_done = done;
    return p;
  }

  static void AwaitWaiting(const HeartbeatBatcher& batcher, int64_t n) { testing::AwaitWaitingAtTheGate(batcher, n); }

  std::vector<int> sizes() {
    absl::MutexLock lock(&mu_);
    return sizes_;
  }
  // The executors of each batch written, in order.
  std::vector<std::vector<std::string>> batches() {
    absl::MutexLock lock(&mu_);
    return batches_;
  }

  testing::FakeClock clock_;
  std::unique_ptr<SqliteMetadataStore> store_;
  std::atomic<bool> hold_{false};
  absl::Notification entered_, open_;
  std::string failing_;  // set before any heartbeat
  absl::Mutex mu_;
  std::vector<int> sizes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<std::string>> batches_ ABSL_GUARDED_BY(mu_);
};

// Under steady load (a batch was written a moment ago) a batch that is not full waits for more
// heartbeats, up to its linger; a heartbeat reaching a quiet batcher is written at once. The
// linger here is an hour: a batch written before it is full was not kept waiting, and a quiet
// heartbeat that waited would never be answered.
TEST_F(HeartbeatBatcherTest, UnderLoadABatchWaitsForMoreHeartbeatsUntilItIsFull) {
  const std::string first = Register("first"), a = Register("a"), b = Register("b"), c = Register("c");
  auto batcher = Batcher(/*max_batch=*/3, /*linger=*/absl::Hours(1));
  ASSERT_TRUE(batcher->Heartbeat({first, ExecutorState::kAvailable}, kTtl).ok()) << "a quiet batcher writes at once";

  // Right after it, a's heartbeat waits for company; b's and c's fill the batch, written at once.
  std::vector<absl::StatusOr<HeartbeatReply>> replies(3, absl::UnknownError("not answered"));
  std::thread a_thread([&] { replies[0] = batcher->Heartbeat({a, ExecutorState::kAvailable}, kTtl); });
  AwaitWaiting(*batcher, 1);
  std::thread b_thread([&] { replies[1] = batcher->Heartbeat({b, ExecutorState::kAvailable}, kTtl); });
  AwaitWaiting(*batcher, 2);
  std::thread c_thread([&] { replies[2] = batcher->Heartbeat({c, ExecutorState::kAvailable}, kTtl); });
  a_thread.join();
  b_thread.join();
  c_thread.join();
  for (const auto& reply : replies) EXPECT_TRUE(reply.ok()) << reply.status();
  EXPECT_THAT(sizes(), ElementsAre(1, 3));
  EXPECT_EQ(batcher->batches(), 2);
}

TEST_F(HeartbeatBatcherTest, HeartbeatsThatArriveWhileABatchIsWrittenAreWrittenTogetherEachWithItsOwnAnswer) {
  const std::string first = Register("first");
  const std::string a = Register("a");
  const std::string b = Register("b");
  const Lease of_a = LeaseOne(a);
  const Lease of_b = LeaseOne(b);
  auto batcher = Batcher();

  // The first heartbeat finds nothing being written: it is written at once, alone (and held at
  // the gate while the others arrive).
  hold_ = true;
  absl::StatusOr<HeartbeatReply> first_reply;
  std::thread first_thread([&] { first_reply = batcher->Heartbeat({first, ExecutorState::kAvailable}, kTtl); });
  entered_.WaitForNotification();

  // Three more arrive meanwhile: a renews its lease; b renews its own and claims a's (fenced);
  // an executor the store does not know.
  clock_.Advance(absl::Seconds(4));
  absl::StatusOr<HeartbeatReply> a_reply, b_reply, unknown_reply;
  std::thread a_thread([&] { a_reply = batcher->Heartbeat({a, ExecutorState::kBusy, "", {Progress(of_a, 3)}}, kTtl); });
  AwaitWaiting(*batcher, 1);
  std::thread b_thread([&] {
    b_reply = batcher->Heartbeat({b, ExecutorState::kBusy, "", {Progress(of_b, 5), Progress(of_a, 7)}}, kTtl);
  });
  AwaitWaiting(*batcher, 2);
  std::thread unknown_thread(
      [&] { unknown_reply = batcher->Heartbeat({"exe-000000000000", ExecutorState::kAvailable}, kTtl); });
  AwaitWaiting(*batcher, 3);
  open_.Notify();
  for (std::thread* t : {&first_thread, &a_thread, &b_thread, &unknown_thread}) t->join();

  // Two transactions for four heartbeats: the first alone, the three that waited together.
  EXPECT_THAT(sizes(), ElementsAre(1, 3));
  EXPECT_EQ(batcher->batches(), 2);
  EXPECT_EQ(batcher->heartbeats(), 4);
  ASSERT_TRUE(first_reply.ok()) << first_reply.status();
  ASSERT_TRUE(a_reply.ok()) << a_reply.status();
  ASSERT_TRUE(b_reply.ok()) << b_reply.status();
  ASSERT_TRUE(unknown_reply.ok()) << unknown_reply.status();
  EXPECT_THAT(a_reply->renewed, SizeIs(1));
  EXPECT_THAT(a_reply->cancel, IsEmpty());
  // b is told at once that a's lease is not its own; its own is renewed.
  ASSERT_THAT(b_reply->cancel, SizeIs(1));
  EXPECT_EQ(b_reply->cancel[0].job_id, of_a.task.job_id);
  ASSERT_THAT(b_reply->renewed, SizeIs(1));
  EXPECT_EQ(b_reply->renewed[0].job_id, of_b.task.job_id);
  EXPECT_TRUE(unknown_reply->unknown_executor);
  EXPECT_FALSE(a_reply->unknown_executor);

  // Leases renewed from when the batch was written; a's progress is a's, not b's claim.
  auto task_a = store_->GetTask(of_a.task.job_id, of_a.task.index);
  ASSERT_TRUE(task_a.ok());
  EXPECT_EQ(task_a->lease_expires_at, clock_.Now() + kTtl);
  EXPECT_EQ(task_a->records_done, 3);
  EXPECT_EQ(task_a->executor_id, a);
  auto executor_b = store_->GetExecutor(b);
  ASSERT_TRUE(executor_b.ok());
  EXPECT_EQ(executor_b->last_heartbeat_at, clock_.Now());
}

TEST_F(HeartbeatBatcherTest, AHeartbeatTheStoreRefusesFailsAloneAndTheRestOfItsBatchIsWritten) {
  const std::string first = Register("first");
  const std::string a = Register("a");
  const std::string bad = Register("bad");
  const Lease of_a = LeaseOne(a);
  failing_ = bad;
  auto batcher = Batcher();
  hold_ = true;
  absl::StatusOr<HeartbeatReply> first_reply, a_reply, bad_reply;
  std::thread first_thread([&] { first_reply = batcher->Heartbeat({first, ExecutorState::kAvailable}, kTtl); });
  entered_.WaitForNotification();
  std::thread bad_thread([&] { bad_reply = batcher->Heartbeat({bad, ExecutorState::kAvailable}, kTtl); });
  AwaitWaiting(*batcher, 1);
  std::thread a_thread([&] { a_reply = batcher->Heartbeat({a, ExecutorState::kBusy, "", {Progress(of_a, 2)}}, kTtl); });
  AwaitWaiting(*batcher, 2);
  open_.Notify();
  for (std::thread* t : {&first_thread, &bad_thread, &a_thread}) t->join();

  // The batch of two was refused as a whole, then written one by one.
  EXPECT_THAT(sizes(), ElementsAre(1, 2, 1, 1));
  EXPECT_TRUE(first_reply.ok());
  EXPECT_TRUE(absl::IsUnavailable(bad_reply.status())) << bad_reply.status();
  ASSERT_TRUE(a_reply.ok()) << a_reply.status();
  EXPECT_THAT(a_reply->renewed, SizeIs(1));
  auto task_a = store_->GetTask(of_a.task.job_id, of_a.task.index);
  ASSERT_TRUE(task_a.ok());
  EXPECT_EQ(task_a->records_done, 2);
}

TEST_F(HeartbeatBatcherTest, HeartbeatsSubmittedFromOneThreadWaitForTheirBatchWithoutHoldingIt) {
  // The server's Heartbeat is a callback: it queues the heartbeat and returns. One thread submits
  // a hundred heartbeats while a batch is held at the gate; none blocks it, and each is answered
  // (on the batcher's thread) when the one batch they form commits.
  std::vector<std::string> executors;
  for (int i = 0; i < 101; ++i) executors.push_back(Register(absl::StrCat("e", i)));
  auto batcher = Batcher();
  hold_ = true;
  absl::Mutex answers_mu;
  std::vector<absl::StatusOr<HeartbeatReply>> answers(executors.size());
  int answered = 0;
  auto answer_into = [&](size_t i) {
    return [&, i](absl::StatusOr<HeartbeatReply> reply) {
      absl::MutexLock lock(&answers_mu);
      answers[i] = std::move(reply);
      ++answered;
    };
  };
  batcher->Submit({executors[0], ExecutorState::kAvailable}, kTtl, answer_into(0));
  entered_.WaitForNotification();
  for (size_t i = 1; i < executors.size(); ++i) {
    batcher->Submit({executors[i], ExecutorState::kAvailable}, kTtl, answer_into(i));
  }
  AwaitWaiting(*batcher, 100);
  {
    absl::MutexLock lock(&answers_mu);
    EXPECT_EQ(answered, 0);  // nothing is answered before its batch commits
  }
  open_.Notify();
  {
    absl::MutexLock lock(&answers_mu);
    auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(answers_mu) { return answered == 101; };
    answers_mu.Await(absl::Condition(&all));
  }
  EXPECT_THAT(sizes(), ElementsAre(1, 100));
  for (size_t i = 0; i < answers.size(); ++i) {
    ASSERT_TRUE(answers[i].ok()) << i << ": " << answers[i].status();
    EXPECT_FALSE(answers[i]->unknown_executor);
    auto executor = store_->GetExecutor(executors[i]);
    ASSERT_TRUE(executor.ok());
    EXPECT_EQ(executor->last_heartbeat_at, clock_.Now());
  }
}

TEST_F(HeartbeatBatcherTest, HeartbeatsQueuedWhenTheBatcherIsDestroyedAreWrittenAndAnswered) {
  const std::string first = Register("first");
  const std::string a = Register("a");
  auto batcher = Batcher();
  hold_ = true;
  absl::StatusOr<HeartbeatReply> a_reply = absl::UnknownError("never answered");
  batcher->Submit({first, ExecutorState::kAvailable}, kTtl, [](absl::StatusOr<HeartbeatReply>) {});
  entered_.WaitForNotification();
  batcher->Submit({a, ExecutorState::kAvailable}, kTtl,
                  [&a_reply](absl::StatusOr<HeartbeatReply> reply) { a_reply = std::move(reply); });
  AwaitWaiting(*batcher, 1);
  std::thread destroy([&] { batcher.reset(); });
  open_.Notify();
  destroy.join();
  ASSERT_TRUE(a_reply.ok()) << a_reply.status();
  EXPECT_THAT(sizes(), ElementsAre(1, 1));
}

TEST_F(HeartbeatBatcherTest, ABatchOfOneWritesEachHeartbeatAlone) {
  const std::string first = Register("first");
  const std::string a = Register("a");
  const std::string b = Register("b");
  auto batcher = Batcher(/*max_batch=*/1);
  hold_ = true;
  std::thread first_thread = BeatAvailable(*batcher, first);
  entered_.WaitForNotification();
  ThenTwoBeatWhileHeld(*batcher, std::move(first_thread), a, b, /*waiting=*/0);
  EXPECT_THAT(sizes(), ElementsAre(1, 1, 1));
  EXPECT_EQ(batcher->batches(), 3);
}

// The server's renewals of idle executors are deferred: thousands fall due together, and none
// may stand between an executor and its heartbeat's answer. Here ten renewals and two heartbeats
// wait while a batch is written (batches of 4): the heartbeats go in the next batch, with one
// renewal beside them (a quick batch); the renewals follow in full batches, each answered and
// written (the renewed executors' last beat is the batch's time).
TEST_F(HeartbeatBatcherTest, DeferredRenewalsFillTheRoomWaitingHeartbeatsLeaveAndNeverGoFirst) {
  const std::string first = Register("first"), a = Register("a"), b = Register("b");
  std::vector<std::string> idle;
  for (int i = 0; i < 10; ++i) idle.push_back(Register(absl::StrCat("idle", i)));
  auto batcher = Batcher(/*max_batch=*/4);
  hold_ = true;
  std::thread first_thread = BeatAvailable(*batcher, first);
  entered_.WaitForNotification();
  absl::Mutex renewed_mu;
  int renewed = 0;
  for (const std::string& id : idle) {
    batcher->SubmitDeferred({id, ExecutorState::kAvailable}, kTtl, [&](absl::StatusOr<HeartbeatReply> reply) {
      EXPECT_TRUE(reply.ok()) << reply.status();
      absl::MutexLock lock(&renewed_mu);
      ++renewed;
    });
  }
  AwaitWaiting(*batcher, 10);
  clock_.Advance(absl::Seconds(3));
  ThenTwoBeatWhileHeld(*batcher, std::move(first_thread), a, b, /*waiting=*/10);
  batcher.reset();  // writes and answers what is queued

  EXPECT_THAT(batches(), ElementsAre(ElementsAre(first), ElementsAre(a, b, idle[0]),
                                     ElementsAre(idle[1], idle[2], idle[3], idle[4]),
                                     ElementsAre(idle[5], idle[6], idle[7], idle[8]), ElementsAre(idle[9])));
  EXPECT_EQ(renewed, 10);
  for (const std::string& id : idle) {
    auto executor = store_->GetExecutor(id);
    ASSERT_TRUE(executor.ok());
    EXPECT_EQ(executor->last_heartbeat_at, clock_.Now());
  }
}

// ... and a steady flood of heartbeats does not starve them: a batch that took no renewal is
// followed by one that keeps room for one (an eighth of the batch, at least one).
TEST_F(HeartbeatBatcherTest, AFloodOfHeartbeatsLeavesRoomForDeferredRenewals) {
  const std::string first = Register("first");
  std::vector<std::string> busy;
  for (int i = 0; i < 8; ++i) busy.push_back(Register(absl::StrCat("busy", i)));
  const std::string r1 = Register("r1"), r2 = Register("r2");
  auto batcher = Batcher(/*max_batch=*/4);
  hold_ = true;
  batcher->Submit({first, ExecutorState::kAvailable}, kTtl, [](absl::StatusOr<HeartbeatReply>) {});
  entered_.WaitForNotification();
  for (const std::string& id : {r1, r2}) {
    batcher->SubmitDeferred({id, ExecutorState::kAvailable}, kTtl, [](absl::StatusOr<HeartbeatReply>) {});
  }
  for (const std::string& id : busy) batcher->Submit({id, ExecutorState::kBusy}, kTtl, [](absl::StatusOr<HeartbeatReply>) {});
  AwaitWaiting(*batcher, 10);
  open_.Notify();
  batcher.reset();
  EXPECT_THAT(batches(), ElementsAre(ElementsAre(first), ElementsAre(busy[0], busy[1], busy[2], r1),
                                     ElementsAre(busy[3], busy[4], busy[5], busy[6]), ElementsAre(busy[7], r2)));
}

// The shares at a batch of 16: one that follows a batch without renewals keeps 2 (an eighth)
// for them; while heartbeats wait, a batch takes at most 4 (a quarter); alone they fill it.
TEST_F(HeartbeatBatcherTest, DeferredRenewalsGetAnEighthKeptAndAQuarterAtMostWhileHeartbeatsWait) {
  const std::string first = Register("first");
  std::vector<std::string> busy, idle;
  for (int i = 0; i < 20; ++i) busy.push_back(Register(absl::StrCat("busy", i)));
  for (int i = 0; i < 10; ++i) idle.push_back(Register(absl::StrCat("idle", i)));
  auto batcher = Batcher(/*max_batch=*/16);
  hold_ = true;
  batcher->Submit({first, ExecutorState::kAvailable}, kTtl, [](absl::StatusOr<HeartbeatReply>) {});
  entered_.WaitForNotification();
  for (const std::string& id : idle) {
    batcher->SubmitDeferred({id, ExecutorState::kAvailable}, kTtl, [](absl::StatusOr<HeartbeatReply>) {});
  }
  for (const std::string& id : busy) batcher->Submit({id, ExecutorState::kBusy}, kTtl, [](absl::StatusOr<HeartbeatReply>) {});
  AwaitWaiting(*batcher, 30);
  open_.Notify();
  batcher.reset();
  EXPECT_THAT(sizes(), ElementsAre(1, 16, 10, 4));
  const auto written = batches();
  ASSERT_THAT(written, SizeIs(4));
  EXPECT_EQ(written[1][13], busy[13]);
  EXPECT_EQ(written[1][14], idle[0]);
  EXPECT_EQ(written[2][5], busy[19]);
  EXPECT_EQ(written[2][6], idle[2]);
  EXPECT_EQ(written[3][3], idle[9]);
}

}  // namespace
}  // namespace minions
