// An idle fleet costs (almost) nothing: a waiting executor's Lease is held without store lookups
// until work is announced, on its server or another one on the store. Every test runs on the fake
// clock, which never moves unless the test moves it: a lease that answers with work it did not
// have before was woken by an announcement, not by a timed poll.

#include <memory>
#include <set>
#include <thread>

#include "absl/synchronization/notification.h"

#include "executor/control_plane_client.h"
#include "model/liveness.h"
#include "grpc_service_fixture.h"
#include "store/sqlite/sqlite_work_signal.h"
#include "testing/must.h"

namespace minions::testing {
namespace {

class IdleFleetTest : public GrpcServiceTest {
 protected:
  // A long poll on `stub` as `executor_id`, waiting up to 30 s of the (fake) clock; the call's
  // real deadline is the fixture's 10 s, the test's failure if no wake-up comes.
  // `idle`: LeaseRequest.idle (the executor holds nothing: the poll stands for its idle heartbeat).
  // `max_tasks`: LeaseRequest.max_tasks (an executor's prefetch window).
  std::thread LongPoll(v1::Executors::Stub* stub, const std::string& executor_id, grpc::Status* status,
                       v1::LeaseResponse* reply, bool idle = false, int max_tasks = 1) {
    auto context = ExecutorContext(executor_id);
    return std::thread([stub, executor_id, status, reply, idle, max_tasks, context = std::move(context)] {
      v1::LeaseRequest request;
      request.set_executor_id(executor_id);
      request.set_max_tasks(max_tasks);
      request.set_wait_ms(30000);
      request.set_idle(idle);
      *status = stub->Lease(context.get(), request, reply);
    });
  }
  // Spot checks (docs/verification.md): a verifier's idle long poll, answered into status and reply.
  struct VerifierPoll {
    std::thread thread;
    grpc::Status status;
    v1::LeaseResponse reply;
  };
  struct ProducerLease {
    std::string producer;
    v1::TaskLease lease;
  };
  // The store draws spot checks (every record of a new producer's chunks); `server_spot_checks` is
  // the server's own switch (ServerOptions::spot_checks). A job of two records is leased to a
  // producer and served, and another executor's idle long poll is parked (`poll`).
  ProducerLease LeaseBesideAParkedVerifier(bool server_spot_checks, VerifierPoll* poll) {
    StoreOptions options;
    options.spot_checks = true;
    store_ = Must(SqliteMetadataStore::Open(":memory:", options));
    ServerOptions server = Options();
    server.spot_checks = server_spot_checks;
    StartServer(&fake_clock_, server);
    MustSubmit(Records(2), /*shard_size=*/2);
    ProducerLease held{RegisterExecutor("producer"), {}};
    const std::string verifier = RegisterExecutor("verifier");
    std::vector<v1::TaskLease> leases = MustLease(held.producer, 1);
    EXPECT_EQ(leases.size(), 1u);
    if (!leases.empty()) held.lease = leases.front();
    poll->thread = LongPoll(executors_.get(), verifier, &poll->status, &poll->reply, /*idle=*/true);
    AwaitWaiting(*server_, 1);
    Serve(held.lease);
    return held;
  }
  // Until `server` holds `n` lease calls waiting (the call reached it and found nothing).
  static void AwaitWaiting(ControlPlane& server, int64_t n) {
    for (int i = 0; i < 10000 && server.executors().leases_waiting() != n; ++i) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_EQ(server.executors().leases_waiting(), n);
  }
  // Holds the server's first lease batch until `open` is notified (`entered` says it is held), and
  // records the size of every batch. What the hook touches lives as long as the hook (the
  // server's), not only as the test's body.
  struct LeaseBatchGate {
    absl::Mutex mu;
    std::vector<size_t> batches ABSL_GUARDED_BY(mu);
    absl::Notification entered, open;
  };
  std::shared_ptr<LeaseBatchGate> HoldFirstLeaseBatch() {
    auto gate = std::make_shared<LeaseBatchGate>();
    server_->executors().SetBeforeLeaseBatchForTesting([gate](size_t calls) {
      bool first;
      {
        absl::MutexLock lock(&gate->mu);
        gate->batches.push_back(calls);
        first = gate->batches.size() == 1;
      }
      if (first) {
        gate->entered.Notify();
        gate->open.WaitForNotification();
      }
    });
    return gate;
  }
  // When the store last heard from `executor_id` (its heartbeats, and renewals for it).
  absl::Time LastHeard(const std::string& executor_id) {
    absl::StatusOr<Executor> executor = store_->GetExecutor(executor_id);
    EXPECT_TRUE(executor.ok()) << executor.status();
    return executor.ok() ? executor->last_heartbeat_at : absl::InfinitePast();
  }
  // Until the store has heard from `executor_id` at `since` or later (a renewal commits on the
  // heartbeats' batcher thread): its last hearing then.
  absl::Time AwaitHeardSince(const std::string& executor_id, absl::Time since) {
    for (int i = 0; i < 10000 && LastHeard(executor_id) < since; ++i) absl::SleepFor(absl::Milliseconds(1));
    return LastHeard(executor_id);
  }
};

// An idle executor's held long poll stands for its idle heartbeat: the server renews its liveness
// about every idle heartbeat while it holds the call, so the store never finds it silent for
// longer than that (and a scan's period) although it sends no heartbeat at all.
TEST_F(IdleFleetTest, AHeldIdlePollKeepsItsExecutorAliveWithoutHeartbeats) {
  StartServer();
  const std::string executor = RegisterExecutor("idle");
  const absl::Time registered = fake_clock_.Now();
  ExecutorService& service = server_->executors();
  const absl::Duration idle_beat = IdleHeartbeatFor(kLeaseTtl);  // 13.5 s; the watchdog waits 27 s
  grpc::Status status;
  v1::LeaseResponse reply;
  std::thread poll = LongPoll(executors_.get(), executor, &status, &reply, /*idle=*/true);
  AwaitWaiting(*server_, 1);
  EXPECT_EQ(service.idle_renewals(), 0) << "registering renewed it a moment ago";
  for (int second = 1; second <= 29; ++second) {
    fake_clock_.Advance(absl::Seconds(1));
    const absl::Time bound = fake_clock_.Now() - idle_beat - kLeaseTtl / 3;
    EXPECT_GE(AwaitHeardSince(executor, bound), bound) << second << " s into the poll";
  }
  EXPECT_GT(LastHeard(executor), registered);
  // One renewal per idle beat (13.5 s), not one per scan (3 s): one or two in 29 s, as the
  // scans fall.
  EXPECT_GE(service.idle_renewals(), 1);
  EXPECT_LE(service.idle_renewals(), 2) << "renewed more often than an idle beat";
  fake_clock_.Advance(absl::Seconds(2));  // the poll's 30 s are up: answered, without work
  poll.join();
  ASSERT_GRPC_OK(status);
  EXPECT_EQ(reply.leases_size(), 0);
  EXPECT_TRUE(reply.idle_renewed()) << "the executor learns its poll was its heartbeat";
  EXPECT_FALSE(reply.drain());
  EXPECT_FALSE(reply.reregister());
}

// A poll that arrives when its executor is due (not heard from for an idle beat) renews it at once.
TEST_F(IdleFleetTest, AnIdlePollArrivingWhenItsExecutorIsDueRenewsItAtOnce) {
  StartServer();
  const std::string executor = RegisterExecutor("idle");
  fake_clock_.Advance(absl::Seconds(20));
  const absl::Time arrival = fake_clock_.Now();
  grpc::Status status;
  v1::LeaseResponse reply;
  std::thread poll = LongPoll(executors_.get(), executor, &status, &reply, /*idle=*/true);
  AwaitWaiting(*server_, 1);
  EXPECT_EQ(AwaitHeardSince(executor, arrival), arrival);
  EXPECT_EQ(server_->executors().idle_renewals(), 1);
  server_->executors().Shutdown();  // the held poll answers at once
  poll.join();
  ASSERT_GRPC_OK(status);
  EXPECT_TRUE(reply.idle_renewed());
}

// An executor's own heartbeat counts as its renewal: its idle poll right after (its tasks just
// ended) renews nothing until an idle beat has passed since that beat, and then renews as usual.
TEST_F(IdleFleetTest, AnIdlePollRightAfterAHeartbeatRenewsNothingUntilAnIdleBeatHasPassed) {
  StartServer();
  const std::string executor = RegisterExecutor("was-busy");
  ExecutorService& service = server_->executors();
  fake_clock_.Advance(absl::Seconds(20));  // registered long ago: a renewal would be due
  v1::HeartbeatRequest beat;
  beat.set_executor_id(executor);
  beat.set_state("available");
  v1::HeartbeatResponse answer;
  ASSERT_GRPC_OK(executors_->Heartbeat(ExecutorContext(executor).get(), beat, &answer));
  const absl::Time beaten = fake_clock_.Now();
  fake_clock_.Advance(absl::Seconds(1));
  grpc::Status status;
  v1::LeaseResponse reply;
  std::thread poll = LongPoll(executors_.get(), executor, &status, &reply, /*idle=*/true);
  AwaitWaiting(*server_, 1);
  EXPECT_EQ(service.idle_renewals(), 0) << "its heartbeat a second ago was written";
  EXPECT_EQ(LastHeard(executor), beaten);
  const absl::Duration idle_beat = IdleHeartbeatFor(kLeaseTtl);
  for (int second = 2; second <= 16; ++second) {
    fake_clock_.Advance(absl::Seconds(1));
    const absl::Time bound = fake_clock_.Now() - idle_beat - kLeaseTtl / 3;
    EXPECT_GE(AwaitHeardSince(executor, bound), bound) << second << " s after the beat";
  }
  // Due an idle beat after the heartbeat, less a scan (10.5 s): at the first scan from then on.
  // Where the scans fall follows the lease thread's reads of the clock, which the test moves a
  // second at a time without waiting for that thread, so only the lower bound is certain.
  const absl::Time renewed = AwaitHeardSince(executor, beaten + absl::Milliseconds(1));
  EXPECT_GE(renewed, beaten + idle_beat - kLeaseTtl / 3) << "renewed before an idle beat (less a scan) had passed";
  EXPECT_EQ(service.idle_renewals(), 1) << "one renewal, an idle beat after the heartbeat";
  service.Shutdown();  // the held poll answers at once
  poll.join();
  ASSERT_GRPC_OK(status);
}

// A poll of an executor that holds something (LeaseRequest.idle unset) is no heartbeat: its
// executor's own beats renew it, with what it holds.
TEST_F(IdleFleetTest, APollThatIsNotIdleRenewsNothing) {
  StartServer();
  const std::string executor = RegisterExecutor("busy");
  const absl::Time registered = fake_clock_.Now();
  grpc::Status status;
  v1::LeaseResponse reply;
  std::thread poll = LongPoll(executors_.get(), executor, &status, &reply, /*idle=*/false);
  AwaitWaiting(*server_, 1);
  for (int second = 1; second <= 31; ++second) fake_clock_.Advance(absl::Seconds(1));
  poll.join();
  ASSERT_GRPC_OK(status);
  EXPECT_FALSE(reply.idle_renewed());
  EXPECT_EQ(server_->executors().idle_renewals(), 0);
  EXPECT_EQ(LastHeard(executor), registered);
}

// What a heartbeat's reply would say reaches an executor whose poll stands for its heartbeat: a
// drain answers its held poll at the next renewal, without work, long before its 30 s are up.
TEST_F(IdleFleetTest, ADrainReachesAnIdleExecutorThroughItsHeldPoll) {
  StartServer();
  const std::string executor = RegisterExecutor("idle");
  const absl::Time registered = fake_clock_.Now();
  grpc::Status status;
  v1::LeaseResponse reply;
  std::thread poll = LongPoll(executors_.get(), executor, &status, &reply, /*idle=*/true);
  AwaitWaiting(*server_, 1);
  ASSERT_OK(store_->RequestDrain(executor, fake_clock_.Now()));
  MustSubmit(Records(1));  // work is there, and not for an executor that drains
  for (int second = 1; second <= 17; ++second) fake_clock_.Advance(absl::Seconds(1));
  poll.join();  // the call's real deadline (10 s) fails the test if nothing answered it
  ASSERT_GRPC_OK(status);
  EXPECT_TRUE(reply.drain());
  EXPECT_EQ(reply.leases_size(), 0);
  EXPECT_LT(fake_clock_.Now() - registered, absl::Seconds(30));
}

// The idle flag gives no caller more than its own credential: a poll in another executor's name
// is refused before anything, and renews nobody.
TEST_F(IdleFleetTest, AnIdlePollInAnotherExecutorsNameIsRefusedAndRenewsNobody) {
  StartServer();
  const std::string victim = RegisterExecutor("victim");
  const std::string mallory = RegisterExecutor("mallory");
  const absl::Time registered = LastHeard(victim);
  fake_clock_.Advance(absl::Seconds(20));  // the victim is due a renewal
  v1::LeaseRequest request;
  request.set_executor_id(victim);
  request.set_wait_ms(1000);
  request.set_idle(true);
  v1::LeaseResponse reply;
  EXPECT_GRPC_ERROR(executors_->Lease(ExecutorContext(mallory).get(), request, &reply), PERMISSION_DENIED,
                    "belongs to executor");
  EXPECT_EQ(server_->executors().idle_renewals(), 0);
  EXPECT_EQ(LastHeard(victim), registered);
}

TEST_F(IdleFleetTest, AnExecutorThatFoundNothingIsNotLookedUpAgainUntilWorkIsAnnounced) {
  StartServer();
  const std::string executor = RegisterExecutor("idle");
  ExecutorService& service = server_->executors();
  EXPECT_TRUE(MustLease(executor, 1).empty());
  EXPECT_EQ(service.lease_lookups(), 1);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(MustLease(executor, 1).empty());
  EXPECT_EQ(service.lease_lookups(), 1) << "an idle executor's polls reached the store";

  MustSubmit(Records(3));  // announces work
  ASSERT_EQ(MustLease(executor, 1).size(), 1u);
  EXPECT_EQ(service.lease_lookups(), 2);
  // Found work: the next call looks again (and finds nothing more).
  EXPECT_TRUE(MustLease(executor, 1).empty());
  EXPECT_EQ(service.lease_lookups(), 3);
  EXPECT_TRUE(MustLease(executor, 1).empty());
  EXPECT_EQ(service.lease_lookups(), 3);
}

// A woken fleet is not a storm of lookups: once one look finds that no task of any job is
// pending, the others' looks at the same announcement find nothing without asking the store.
TEST_F(IdleFleetTest, WhenNoTaskIsPendingAnywhereTheRestOfTheFleetIsNotLookedUp) {
  StartServer();
  ExecutorService& service = server_->executors();
  std::vector<std::string> fleet;
  for (int i = 0; i < 10; ++i) fleet.push_back(RegisterExecutor(absl::StrCat("e", i)));
  for (const std::string& e : fleet) EXPECT_TRUE(MustLease(e, 1).empty());
  EXPECT_EQ(service.lease_lookups(), 1) << "nothing was pending: one look, nine spared";
  EXPECT_EQ(service.lookups_spared(), 9);

  MustSubmit(Records(2), /*shard_size=*/1);  // two tasks, announced
  EXPECT_EQ(MustLease(fleet[0], 1).size(), 1u);
  EXPECT_EQ(MustLease(fleet[1], 1).size(), 1u);
  int64_t before = service.lease_lookups();
  for (size_t i = 2; i < fleet.size(); ++i) EXPECT_TRUE(MustLease(fleet[i], 1).empty());
  EXPECT_EQ(service.lease_lookups(), before + 1) << "the first look found both tasks running; seven spared";

  // A task is pending that none of them may take now (a retry backing off): nothing is assumed,
  // each looks (the retry is not announced when its backoff ends; their rechecks find it).
  MustSubmit(Records(1), /*shard_size=*/1);
  std::vector<v1::TaskLease> retried = MustLease(fleet[2], 1);
  ASSERT_EQ(retried.size(), 1u);
  ASSERT_GRPC_OK(Fail(fleet[2], retried[0].ref(), "retryable"));
  before = service.lease_lookups();
  for (size_t i = 3; i < fleet.size(); ++i) EXPECT_TRUE(MustLease(fleet[i], 1).empty());
  EXPECT_EQ(service.lease_lookups(), before + static_cast<int64_t>(fleet.size()) - 3);
}

// "Nothing pending" holds until its recheck; then one look asks the store again, and the rest of
// the fleet is spared again on the fresh answer (not one lookup each for the rest of the
// announcement's life: a long job's executors ending their tasks all at once, with nothing left to
// lease, would each look it up).
TEST_F(IdleFleetTest, OnceNothingPendingIsRecheckedTheRestOfTheFleetIsSparedAgain) {
  ServerOptions options = Options();
  options.idle_recheck = absl::Seconds(30);
  StartServer(&fake_clock_, options);
  ExecutorService& service = server_->executors();
  std::vector<std::string> fleet;
  for (int i = 0; i < 10; ++i) fleet.push_back(RegisterExecutor(absl::StrCat("e", i)));
  for (const std::string& e : fleet) EXPECT_TRUE(MustLease(e, 1).empty());
  ASSERT_EQ(service.lease_lookups(), 1);
  ASSERT_EQ(service.lookups_spared(), 9);

  for (int round = 1; round <= 2; ++round) {
    fake_clock_.Advance(absl::Seconds(30));  // every recheck is due, nothing was announced
    for (const std::string& e : fleet) EXPECT_TRUE(MustLease(e, 1).empty());
    EXPECT_EQ(service.lease_lookups(), 1 + round) << "round " << round << ": one look, nine spared";
    EXPECT_EQ(service.lookups_spared(), 9 * (1 + round)) << "round " << round;
  }
  // The fresh answer is no older than its own recheck: work submitted now is found at once.
  MustSubmit(Records(1));
  EXPECT_EQ(MustLease(fleet[3], 1).size(), 1u);
}

TEST_F(IdleFleetTest, AnIdleExecutorIsLookedUpAgainAfterItsRecheckOrWhenItsOwnCircumstancesChange) {
  ServerOptions options = Options();
  options.idle_recheck = absl::Seconds(30);
  StartServer(&fake_clock_, options);
  const std::string executor = RegisterExecutor("idle");
  ExecutorService& service = server_->executors();
  EXPECT_TRUE(MustLease(executor, 1).empty());
  fake_clock_.Advance(absl::Seconds(29));
  EXPECT_TRUE(MustLease(executor, 1).empty());
  EXPECT_EQ(service.lease_lookups(), 1);
  fake_clock_.Advance(absl::Seconds(1));  // the safety net: changes nobody announced
  EXPECT_TRUE(MustLease(executor, 1).empty());
  EXPECT_EQ(service.lease_lookups(), 2);

  // Its heartbeat says its state changed (its owner came and went): it looks again.
  v1::HeartbeatRequest beat;
  beat.set_executor_id(executor);
  beat.set_state("available");
  v1::HeartbeatResponse answer;
  ASSERT_GRPC_OK(executors_->Heartbeat(ExecutorContext(executor).get(), beat, &answer));
  EXPECT_TRUE(MustLease(executor, 1).empty());
  EXPECT_EQ(service.lease_lookups(), 2) << "the same state again changes nothing";
  beat.set_state("owner_active");
  ASSERT_GRPC_OK(executors_->Heartbeat(ExecutorContext(executor).get(), beat, &answer));
  EXPECT_TRUE(MustLease(executor, 1).empty());
  EXPECT_EQ(service.lease_lookups(), 2) << "no task is pending anywhere (looked up 0 s ago): nothing to look for";

  // A task pending that nobody may take yet (a retry backing off): the executor looks once, then
  // waits on its own mark...
  const std::string other = RegisterExecutor("other");
  MustSubmit(Records(1));
  std::vector<v1::TaskLease> taken = MustLease(other, 1);
  ASSERT_EQ(taken.size(), 1u);
  ASSERT_GRPC_OK(Fail(other, taken[0].ref(), "retryable"));
  const int64_t before = service.lease_lookups();
  EXPECT_TRUE(MustLease(executor, 1).empty());
  EXPECT_EQ(service.lease_lookups(), before + 1);
  EXPECT_TRUE(MustLease(executor, 1).empty());
  EXPECT_EQ(service.lease_lookups(), before + 1);
  // ... until its own state changes (its owner went): it looks again.
  ASSERT_GRPC_OK(executors_->Heartbeat(ExecutorContext(executor).get(), beat, &answer));  // owner_active
  EXPECT_TRUE(MustLease(executor, 1).empty());
  EXPECT_EQ(service.lease_lookups(), before + 1) << "the same state again changes nothing";
  beat.set_state("available");
  ASSERT_GRPC_OK(executors_->Heartbeat(ExecutorContext(executor).get(), beat, &answer));
  EXPECT_TRUE(MustLease(executor, 1).empty());
  EXPECT_EQ(service.lease_lookups(), before + 2);
}

TEST_F(IdleFleetTest, AWaitingLeaseHoldsNoLookupsAndIsWokenBySubmissionOnItsServer) {
  StartServer();
  const std::string executor = RegisterExecutor("waiting");
  grpc::Status status;
  v1::LeaseResponse reply;
  std::thread poll = LongPoll(executors_.get(), executor, &status, &reply);
  AwaitWaiting(*server_, 1);
  EXPECT_EQ(server_->executors().lease_lookups(), 1);
  const absl::Time before = fake_clock_.Now();
  MustSubmit(Records(3));
  poll.join();
  ASSERT_GRPC_OK(status);
  EXPECT_EQ(reply.leases_size(), 1);
  EXPECT_EQ(fake_clock_.Now(), before) << "the clock moved: the wake-up may have been a poll";
  EXPECT_EQ(server_->executors().leases_waiting(), 0);
}

// Spread before stacking: two idle executors of long tasks (a window of two each) wait together
// and two tasks come: each gets one; neither takes both while the other waits.
TEST_F(IdleFleetTest, IdleExecutorsWaitingTogetherGetOneTaskEachWhenTheirTasksAreLong) {
  StartServer();
  const std::string first = RegisterExecutor("idle-1");
  const std::string second = RegisterExecutor("idle-2");
  grpc::Status first_status, second_status;
  v1::LeaseResponse first_reply, second_reply;
  std::thread first_poll = LongPoll(executors_.get(), first, &first_status, &first_reply, /*idle=*/true,
                                    ExecutorService::kSpreadWindow);
  std::thread second_poll = LongPoll(executors_.get(), second, &second_status, &second_reply, /*idle=*/true,
                                     ExecutorService::kSpreadWindow);
  AwaitWaiting(*server_, 2);
  MustSubmit(Records(2), /*shard_size=*/1);
  first_poll.join();
  second_poll.join();
  ASSERT_GRPC_OK(first_status);
  ASSERT_GRPC_OK(second_status);
  EXPECT_EQ(first_reply.leases_size(), 1);
  EXPECT_EQ(second_reply.leases_size(), 1);
}

// Lease calls that look in the store while a batch of them is being written look together, in
// one batch, each getting tasks of its own (group commit of leases). The first call's batch is
// held at a gate until three more calls have queued behind it, so what lands in which batch
// follows from the test's steps, not from timing.
TEST_F(IdleFleetTest, LeaseCallsArrivingWhileABatchIsWrittenLookTogetherEachGettingATaskOfItsOwn) {
  StartServer();
  std::vector<std::string> executors;
  for (int i = 0; i < 4; ++i) executors.push_back(RegisterExecutor(absl::StrCat("batched-", i)));
  MustSubmit(Records(4), /*shard_size=*/1);
  auto gate = HoldFirstLeaseBatch();
  std::vector<grpc::Status> status(4);
  std::vector<v1::LeaseResponse> reply(4);
  std::vector<std::thread> calls;
  calls.push_back(LongPoll(executors_.get(), executors[0], &status[0], &reply[0]));
  EXPECT_TRUE(gate->entered.WaitForNotificationWithTimeout(absl::Seconds(10))) << "no lease batch";
  for (size_t i = 1; i < 4; ++i) calls.push_back(LongPoll(executors_.get(), executors[i], &status[i], &reply[i]));
  for (int i = 0; i < 10000 && server_->executors().lease_calls_queued() != 3; ++i) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(server_->executors().lease_calls_queued(), 3);
  gate->open.Notify();
  for (std::thread& call : calls) call.join();
  {
    absl::MutexLock lock(&gate->mu);
    EXPECT_THAT(gate->batches, ::testing::ElementsAre(1, 3));
  }
  std::set<int64_t> tasks;
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_GRPC_OK(status[i]);
    ASSERT_EQ(reply[i].leases_size(), 1) << executors[i];
    tasks.insert(reply[i].leases(0).ref().task_index());
  }
  EXPECT_EQ(tasks.size(), 4u) << "each call its own task";
}

// A batch of empty answers wakes one lease thread per call, each of which found nothing: one of
// them asks the store whether any task is pending at all, not each (the others' answers add
// nothing to its), and its answer spares the looks after it.
TEST_F(IdleFleetTest, OfABatchOfEmptyAnswersOneLookAsksWhetherAnythingIsPending) {
  StartServer();
  ExecutorService& service = server_->executors();
  std::vector<std::string> executors;
  for (int i = 0; i < 5; ++i) executors.push_back(RegisterExecutor(absl::StrCat("batched-", i)));
  MustSubmit(Records(1), /*shard_size=*/1);  // one task: the first call takes it, the rest find nothing
  auto gate = HoldFirstLeaseBatch();
  std::vector<grpc::Status> status(4);
  std::vector<v1::LeaseResponse> reply(4);
  std::vector<std::thread> calls;
  calls.push_back(LongPoll(executors_.get(), executors[0], &status[0], &reply[0]));
  ASSERT_TRUE(gate->entered.WaitForNotificationWithTimeout(absl::Seconds(10))) << "no lease batch";
  for (size_t i = 1; i < 4; ++i) calls.push_back(LongPoll(executors_.get(), executors[i], &status[i], &reply[i]));
  for (int i = 0; i < 10000 && service.lease_calls_queued() != 3; ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(service.lease_calls_queued(), 3);
  gate->open.Notify();
  calls[0].join();  // answered with the task
  ASSERT_GRPC_OK(status[0]);
  ASSERT_EQ(reply[0].leases_size(), 1);
  AwaitWaiting(*server_, 3);  // the three others found nothing and wait
  {
    absl::MutexLock lock(&gate->mu);
    EXPECT_THAT(gate->batches, ::testing::ElementsAre(1, 3));
  }
  EXPECT_EQ(service.pending_checks(), 1) << "each empty answer of the batch asked";
  const int64_t spared = service.lookups_spared();
  EXPECT_TRUE(MustLease(executors[4], 1).empty());
  EXPECT_EQ(service.lookups_spared(), spared + 1) << "the answer (none pending) spares the next look";
  EXPECT_EQ(service.pending_checks(), 1);
  service.Shutdown();  // the held polls answer at once
  for (size_t i = 1; i < 4; ++i) {
    calls[i].join();
    ASSERT_GRPC_OK(status[i]);
    EXPECT_EQ(reply[i].leases_size(), 0);
  }
}

// What a held Lease may be granted while `others` executors that hold nothing and run long tasks
// wait on the server to be served.
TEST(SpreadShare, WhileOthersWaitAnIdleExecutorOfLongTasksGetsOne) {
  auto request = [](int max_tasks, int64_t wait_ms) {
    v1::LeaseRequest r;
    r.set_max_tasks(max_tasks);
    r.set_wait_ms(wait_ms);
    return r;
  };
  const int window = ExecutorService::kSpreadWindow;
  // Nobody else waits: what it asks for (within 1..64).
  EXPECT_EQ(ExecutorService::SpreadShare(request(window, 30000), 0), window);
  EXPECT_EQ(ExecutorService::SpreadShare(request(500, 30000), 0), 64);
  // Others wait: an idle executor of long tasks (a long poll, a window of two) gets one.
  EXPECT_EQ(ExecutorService::SpreadShare(request(window, 30000), 3), 1);
  // Not capped: an idle executor of short tasks (a larger window), a busy one's prefetch (no wait).
  EXPECT_EQ(ExecutorService::SpreadShare(request(window + 2, 30000), 3), window + 2);
  EXPECT_EQ(ExecutorService::SpreadShare(request(window, 0), 3), window);
}

// A team at its running-task quota: its queued task is passed over, and an executor waiting for
// work finds nothing. When the team's running task ends, the place it freed is announced: the
// waiting executor gets the queued task at once (the clock never moves, so no poll found it).
TEST_F(IdleFleetTest, AQuotaFreedByAnEndingTaskIsAnnouncedSoTheTeamsQueuedTaskLeasesAtOnce) {
  StartServer();
  ASSERT_OK_AND_ASSIGN(Team team, store_->GetTeam(std::string(kDefaultTeam)));
  team.max_running_tasks = 1;
  ASSERT_OK(store_->UpdateTeam(team));
  const v1::Job job = MustSubmit(Records(2), /*shard_size=*/1);
  const std::string running = RegisterExecutor("running");
  const std::string waiting = RegisterExecutor("waiting");
  std::vector<v1::TaskLease> held = MustLease(running, 1);
  ASSERT_EQ(held.size(), 1u);

  grpc::Status status;
  v1::LeaseResponse reply;
  std::thread poll = LongPoll(executors_.get(), waiting, &status, &reply);
  AwaitWaiting(*server_, 1);  // it looked, and the quota let it have nothing
  const absl::Time before = fake_clock_.Now();
  Serve(held[0]);
  ASSERT_GRPC_OK(Complete(running, held[0].ref(), 1));
  poll.join();
  ASSERT_GRPC_OK(status);
  ASSERT_EQ(reply.leases_size(), 1) << "the freed quota was not announced";
  EXPECT_EQ(reply.leases(0).ref().job_id(), job.id());
  EXPECT_NE(reply.leases(0).ref().task_index(), held[0].ref().task_index());
  EXPECT_EQ(fake_clock_.Now(), before) << "the clock moved: the wake-up may have been a poll";
}

// With spot checks on (docs/verification.md), a producer's commit answers one other idle
// executor's held poll at once, with nothing: that agent asks for the spot checks the commit may
// have drawn now, not when its poll ends.
TEST_F(IdleFleetTest, AProducersCommitWakesAnotherIdleExecutorsPollWhenSpotChecksAreOn) {
  VerifierPoll poll;
  const ProducerLease held = LeaseBesideAParkedVerifier(/*server_spot_checks=*/true, &poll);
  const absl::Time before = fake_clock_.Now();
  ASSERT_GRPC_OK(Complete(held.producer, held.lease.ref(), 2));
  poll.thread.join();
  ASSERT_GRPC_OK(poll.status);
  EXPECT_EQ(poll.reply.leases_size(), 0);
  EXPECT_FALSE(poll.reply.drain());
  EXPECT_FALSE(poll.reply.reregister());
  EXPECT_EQ(fake_clock_.Now(), before) << "the clock moved: the poll may have ended at its wait";
  EXPECT_EQ(Must(store_->CountOpenVerifications(held.lease.ref().job_id())), 1) << "what the verifier is woken for";
}

// The server's switch (ServerOptions::spot_checks) gates the wake: off, a commit reads nothing
// about spot checks and wakes no poll, even when the store draws them (here on, so a wake would
// have found a check to wake for).
TEST_F(IdleFleetTest, WithTheServersSpotChecksOffACommitWakesNoIdlePoll) {
  VerifierPoll poll;
  const ProducerLease held = LeaseBesideAParkedVerifier(/*server_spot_checks=*/false, &poll);
  ASSERT_GRPC_OK(Complete(held.producer, held.lease.ref(), 2));
  // The wake would have come before the completion's answer: the poll is still parked.
  EXPECT_EQ(server_->executors().leases_waiting(), 1);
  EXPECT_EQ(Must(store_->CountOpenVerifications(held.lease.ref().job_id())), 1);
  fake_clock_.Advance(absl::Seconds(30));  // its wait ends
  poll.thread.join();
  ASSERT_GRPC_OK(poll.status);
  EXPECT_EQ(poll.reply.leases_size(), 0);
}

// The executor's own client long-polls for 20 s; when it drains, stops or its owner comes back it
// interrupts the call, which ends at once (Cancelled: the executor reclaims on its next lease
// whatever the server may have granted). An interrupt with no call waiting touches no later call.
TEST_F(IdleFleetTest, TheExecutorsLongPollEndsAtOnceWhenInterruptedAndTheNextOneWaitsForWork) {
  StartServer();
  std::unique_ptr<ControlPlaneClient> client =
      MakeGrpcControlPlaneClient(rpc::MakeChannel(server_->address()), ExecutorCredentials{"", join_token_});
  v1::RegisterRequest registration;
  registration.mutable_capabilities()->set_name("interrupted");
  registration.mutable_capabilities()->set_os("linux");
  registration.mutable_capabilities()->set_memory_bytes(int64_t{16} << 30);
  registration.mutable_capabilities()->add_runners("llama");
  registration.mutable_capabilities()->set_max_tasks(1);
  ASSERT_OK_AND_ASSIGN(v1::RegisterResponse registered, client->Register(registration));
  v1::LeaseRequest request;
  request.set_executor_id(registered.executor_id());
  request.set_max_tasks(1);
  request.set_wait_ms(20000);

  absl::StatusOr<v1::LeaseResponse> first;
  std::thread poll([&] { first = client->Lease(request); });
  AwaitWaiting(*server_, 1);
  client->InterruptLease();
  poll.join();
  EXPECT_TRUE(absl::IsCancelled(first.status())) << first.status();
  AwaitWaiting(*server_, 0);  // the server let go of the cancelled call

  client->InterruptLease();  // nothing waits: no effect on the next call
  absl::StatusOr<v1::LeaseResponse> second;
  std::thread next([&] { second = client->Lease(request); });
  AwaitWaiting(*server_, 1);
  const absl::Time before = fake_clock_.Now();
  MustSubmit(Records(3));
  next.join();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->leases_size(), 1);
  EXPECT_EQ(fake_clock_.Now(), before);
}

TEST_F(IdleFleetTest, AWaitingLeaseEndsEmptyAtItsWaitAndWhenItsCallerGivesUp) {
  ServerOptions options = Options();
  options.idle_recheck = absl::Minutes(5);  // longer than the wait
  StartServer(&fake_clock_, options);
  const std::string executor = RegisterExecutor("waiting");
  grpc::Status status;
  v1::LeaseResponse reply;
  std::thread poll = LongPoll(executors_.get(), executor, &status, &reply);
  AwaitWaiting(*server_, 1);
  fake_clock_.Advance(absl::Seconds(30));
  poll.join();
  ASSERT_GRPC_OK(status);
  EXPECT_EQ(reply.leases_size(), 0);
  EXPECT_EQ(server_->executors().lease_lookups(), 1) << "the wait's end needs no lookup";

  // A caller that gives up (its deadline) leaves nothing held.
  v1::LeaseRequest request;
  request.set_executor_id(executor);
  request.set_wait_ms(30000);
  grpc::ClientContext context;
  rpc::Prepare(context, credentials_[executor], absl::Milliseconds(200));
  v1::LeaseResponse ignored;
  EXPECT_EQ(executors_->Lease(&context, request, &ignored).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  AwaitWaiting(*server_, 0);
}

TEST_F(IdleFleetTest, AWaitingLeaseAnswersAtOnceWhenTheServerStops) {
  StartServer();
  const std::string executor = RegisterExecutor("waiting");
  grpc::Status status;
  v1::LeaseResponse reply;
  std::thread poll = LongPoll(executors_.get(), executor, &status, &reply);
  AwaitWaiting(*server_, 1);
  server_->Shutdown();
  poll.join();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reply.leases_size(), 0);
}

// Two servers on one store file, each with the store's work signal: an executor waits on B, a
// job is submitted through A.
TEST_F(IdleFleetTest, ASubmissionThroughOneServerWakesAnExecutorWaitingOnAnother) {
  const std::string database = dir_.File("shared.db");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SqliteMetadataStore> store_a, SqliteMetadataStore::Open(database, StoreOptions{}));
  ASSERT_OK_AND_ASSIGN(store_, SqliteMetadataStore::Open(database, StoreOptions{}));
  ServerOptions options = Options();
  options.background_thread = false;
  ControlPlane a(store_a.get(), blobs_.get(), &fake_clock_, ControlPlaneOptions{options});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SqliteWorkSignal> signal_a, SqliteWorkSignal::Open(database));
  a.SetWorkSignal(std::move(signal_a));
  ASSERT_OK(a.Start());
  clock_ = &fake_clock_;
  server_ = std::make_unique<ControlPlane>(store_.get(), blobs_.get(), &fake_clock_, ControlPlaneOptions{options});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SqliteWorkSignal> signal_b, SqliteWorkSignal::Open(database));
  server_->SetWorkSignal(std::move(signal_b));
  ASSERT_OK(server_->Start());
  Connect();  // the stubs and credentials are B's (the credentials live in the shared store)

  const std::string executor = RegisterExecutor("on-b");
  grpc::Status status;
  v1::LeaseResponse reply;
  std::thread poll = LongPoll(executors_.get(), executor, &status, &reply);
  AwaitWaiting(*server_, 1);
  const int64_t lookups = server_->executors().lease_lookups();

  auto jobs_a = v1::Jobs::NewStub(rpc::MakeChannel(a.address()));
  v1::Job job;
  ASSERT_GRPC_OK(jobs_a->SubmitJob(Context().get(), Request(Records(3)), &job));
  poll.join();
  ASSERT_GRPC_OK(status);
  ASSERT_EQ(reply.leases_size(), 1);
  EXPECT_EQ(reply.leases(0).ref().job_id(), job.id());
  EXPECT_EQ(server_->executors().lease_lookups(), lookups + 1) << "one lookup, after the announcement";
  EXPECT_EQ(a.executors().lease_lookups(), 0);
  a.Shutdown();
}

// An executor's presence stream (Attach), held open on a context the test can cancel.
class Presence {
 public:
  Presence(v1::Executors::Stub* stub, const std::string& credential, const std::string& executor_id) {
    rpc::Prepare(context_, credential, absl::InfiniteDuration());
    v1::AttachRequest request;
    request.set_executor_id(executor_id);
    stream_ = stub->Attach(&context_, request);
    attached_ = stream_->Read(&hello_);  // the server's first event: the stream is open there
    reader_ = std::thread([this] {
      v1::AttachEvent more;
      while (stream_->Read(&more)) {
      }
      status_ = stream_->Finish();
    });
  }
  ~Presence() { Drop(); }
  // The connection goes without a goodbye (a process killed, a cable pulled).
  void Drop() {
    if (!reader_.joinable()) return;
    context_.TryCancel();
    reader_.join();
  }
  bool attached() const { return attached_; }
  const v1::AttachEvent& hello() const { return hello_; }
  const grpc::Status& status() const { return status_; }  // after Drop or the server's end
  void Join() { if (reader_.joinable()) reader_.join(); }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> stream_;
  v1::AttachEvent hello_;
  bool attached_ = false;
  grpc::Status status_;
  std::thread reader_;
};

// Until `server` has backed up the tasks of `n` executors whose stream closed.
void AwaitDetached(ControlPlane& server, int64_t n) {
  for (int i = 0; i < 10000 && server.executors().executors_detached_abruptly() < n; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(server.executors().executors_detached_abruptly(), n);
}

TEST_F(IdleFleetTest, AnExecutorWhoseConnectionClosesWhileItRunsATaskHasItBackedUpAtOnceAndMayStillWin) {
  StartServer();  // the fake clock never moves: no lease can expire
  const std::string a = RegisterExecutor("a");
  const std::string b = RegisterExecutor("b");
  v1::Job job = MustSubmit(Records(3), 3);
  std::vector<v1::TaskLease> held = MustLease(a, 1);
  ASSERT_EQ(held.size(), 1u);
  auto presence = std::make_unique<Presence>(executors_.get(), credentials_[a], a);
  ASSERT_TRUE(presence->attached());
  EXPECT_EQ(presence->hello().lease_ttl_ms(), absl::ToInt64Milliseconds(kLeaseTtl));
  EXPECT_TRUE(MustLease(b, 1).empty()) << "nothing to run while a runs the only task";

  presence->Drop();
  AwaitDetached(*server_, 1);
  std::vector<v1::TaskLease> backup = MustLease(b, 1);
  ASSERT_EQ(backup.size(), 1u) << "the task was not offered again before its lease expired";
  EXPECT_EQ(backup[0].ref().task_index(), held[0].ref().task_index());
  EXPECT_EQ(backup[0].ref().attempt(), held[0].ref().attempt() + 1);

  // a was only cut off: it finishes first, and its attempt wins (it kept its lease).
  Serve(held[0]);
  ASSERT_GRPC_OK(Complete(a, held[0].ref(), 3));
  EXPECT_FALSE(Complete(b, backup[0].ref(), 3).ok()) << "the backup is fenced off once the first attempt won";
  EXPECT_EQ(WaitForState(job.id(), "completed").request_counts().completed(), 3);
}

TEST_F(IdleFleetTest, AReconnectOrAnIdleExecutorsCloseOrTheServersShutdownBacksNothingUp) {
  StartServer();
  const std::string a = RegisterExecutor("a");
  const std::string idle = RegisterExecutor("idle");
  MustSubmit(Records(3), 3);
  std::vector<v1::TaskLease> held = MustLease(a, 1);
  ASSERT_EQ(held.size(), 1u);
  // A reconnect: the new stream opens before the old one is seen to close.
  Presence old_stream(executors_.get(), credentials_[a], a);
  Presence new_stream(executors_.get(), credentials_[a], a);
  ASSERT_TRUE(old_stream.attached() && new_stream.attached());
  EXPECT_EQ(server_->executors().executors_attached(), 2);
  old_stream.Drop();
  // An executor without tasks goes.
  {
    Presence gone(executors_.get(), credentials_[idle], idle);
    ASSERT_TRUE(gone.attached());
  }
  for (int i = 0; i < 10000 && server_->executors().executors_attached() != 1; ++i) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(server_->executors().executors_attached(), 1);
  // The server stops: every stream ends, and that is not the executors going.
  server_->Shutdown();
  new_stream.Join();
  EXPECT_EQ(server_->executors().executors_detached_abruptly(), 0);
  ASSERT_OK_AND_ASSIGN(Task task, store_->GetTask(held[0].ref().job_id(), held[0].ref().task_index()));
  EXPECT_EQ(task.state, TaskState::kRunning);
  EXPECT_EQ(task.attempt, held[0].ref().attempt());
  EXPECT_FALSE(task.shadow.has_value());
}

TEST_F(IdleFleetTest, AttachIsForTheExecutorItsCredentialNames) {
  StartServer();
  const std::string a = RegisterExecutor("a");
  const std::string b = RegisterExecutor("b");
  Presence as_other(executors_.get(), credentials_[a], b);
  EXPECT_FALSE(as_other.attached());
  as_other.Join();
  EXPECT_EQ(as_other.status().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  Presence anonymous(executors_.get(), "", a);
  EXPECT_FALSE(anonymous.attached());
  anonymous.Join();
  EXPECT_EQ(anonymous.status().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(server_->executors().executors_attached(), 0);
}

}  // namespace
}  // namespace minions::testing
