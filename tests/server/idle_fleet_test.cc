// An idle fleet costs (almost) nothing: a waiting executor's Lease is held without store lookups
// until work is announced, on its server or another one on the store. Every test runs on the fake
// clock, which never moves unless the test moves it: a lease that answers with work it did not
// have before was woken by an announcement, not by a timed poll.

#include <thread>

#include "grpc_service_fixture.h"
#include "store/sqlite/sqlite_work_signal.h"

namespace minions::testing {
namespace {

class IdleFleetTest : public GrpcServiceTest {
 protected:
  // A long poll on `stub` as `executor_id`, waiting up to 30 s of the (fake) clock; the call's
  // real deadline is the fixture's 10 s, the test's failure if no wake-up comes.
  std::thread LongPoll(v1::Executors::Stub* stub, const std::string& executor_id, grpc::Status* status,
                       v1::LeaseResponse* reply) {
    auto context = ExecutorContext(executor_id);
    return std::thread([stub, executor_id, status, reply, context = std::move(context)] {
      v1::LeaseRequest request;
      request.set_executor_id(executor_id);
      request.set_max_tasks(1);
      request.set_wait_ms(30000);
      *status = stub->Lease(context.get(), request, reply);
    });
  }
  // Until `server` holds `n` lease calls waiting (the call reached it and found nothing).
  static void AwaitWaiting(MinionsServer& server, int64_t n) {
    for (int i = 0; i < 10000 && server.executors().leases_waiting() != n; ++i) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_EQ(server.executors().leases_waiting(), n);
  }
};

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
  EXPECT_EQ(service.lease_lookups(), 3);
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
  MinionsServer a(store_a.get(), blobs_.get(), &fake_clock_, options, nullptr);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SqliteWorkSignal> signal_a, SqliteWorkSignal::Open(database));
  a.SetWorkSignal(std::move(signal_a));
  ASSERT_OK(a.Start());
  clock_ = &fake_clock_;
  server_ = std::make_unique<MinionsServer>(store_.get(), blobs_.get(), &fake_clock_, options, nullptr);
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

}  // namespace
}  // namespace minions::testing
