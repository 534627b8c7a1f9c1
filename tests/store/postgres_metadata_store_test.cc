// The MetadataStore contract on PostgreSQL, plus what only a shared server has: concurrent
// migrations, several servers leasing from one database, a server restart, the watchdog lock.
//
// The server: ctest starts a private one (the postgres_start fixture, tests/services/postgres.sh)
// and compiles its URL in; MINIONS_TEST_POSTGRES (a libpq URL) and MINIONS_TEST_POSTGRES_DIR (the
// cluster's folder, for the restart test) override it. Each test gets a fresh schema of its own,
// so test processes share one database without seeing each other.
#include "store/postgres/postgres_metadata_store.h"
#include "store/postgres/postgres_watchdog_lock.h"

#include <libpq-fe.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "database_contract.h"
#include "spot_check_contract.h"
#include "store_contracts.h"
#include "watchdog_lock_contract.h"
#include "work_signal_contract.h"
#include "store/postgres/postgres_work_signal.h"
#include "store/postgres/pg_connection_pool.h"
#include "store/postgres/pg_transaction_runner.h"
#include "pg_commit_faults.h"
#include "testing/fake_clock.h"

namespace minions {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr char kHowToStart[] =
    "The PostgreSQL store tests need a server. ctest starts one (fixture postgres_start); by hand:\n"
    "  tests/services/postgres.sh start /tmp/minions-pg 55432\n"
    "  export MINIONS_TEST_POSTGRES=postgresql://postgres@127.0.0.1:55432/minions_test\n"
    "  export MINIONS_TEST_POSTGRES_DIR=/tmp/minions-pg   # for the restart test\n"
    "(Debian packages: postgresql, libpq-dev.)";

std::string FromEnvironment(const char* name, const char* compiled_in) {
  const char* value = std::getenv(name);
  if (value != nullptr && *value != '\0') return value;
  return compiled_in;
}

// Where ctest's private cluster is (tests/store/CMakeLists.txt compiles them in).
#ifndef MINIONS_TEST_POSTGRES_URL
#define MINIONS_TEST_POSTGRES_URL ""
#endif
#ifndef MINIONS_TEST_POSTGRES_DIR
#define MINIONS_TEST_POSTGRES_DIR ""
#endif
#ifndef MINIONS_TEST_POSTGRES_SCRIPT
#define MINIONS_TEST_POSTGRES_SCRIPT "tests/services/postgres.sh"
#endif

std::string BaseUrl() { return FromEnvironment("MINIONS_TEST_POSTGRES", MINIONS_TEST_POSTGRES_URL); }
std::string ClusterDir() { return FromEnvironment("MINIONS_TEST_POSTGRES_DIR", MINIONS_TEST_POSTGRES_DIR); }
std::string ServiceScript() { return MINIONS_TEST_POSTGRES_SCRIPT; }

// libpq directly, as another tool (or an older or newer binary) would use the database.
class RawConnection {
 public:
  explicit RawConnection(const std::string& url) : conn_(PQconnectdb(url.c_str())) {}
  ~RawConnection() { PQfinish(conn_); }
  bool ok() const { return PQstatus(conn_) == CONNECTION_OK; }
  std::string error() const { return PQerrorMessage(conn_); }
  // Runs constant SQL; "" on success, else the error.
  std::string Exec(const std::string& sql) {
    PGresult* result = PQexec(conn_, sql.c_str());
    ExecStatusType status = PQresultStatus(result);
    std::string error = status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK ? "" : PQresultErrorMessage(result);
    PQclear(result);
    return error;
  }
  int64_t Count(const std::string& sql) {
    PGresult* result = PQexec(conn_, sql.c_str());
    int64_t count = -1;
    if (PQresultStatus(result) == PGRES_TUPLES_OK && PQntuples(result) == 1 && !PQgetisnull(result, 0, 0)) {
      count = std::strtoll(PQgetvalue(result, 0, 0), nullptr, 10);
    }
    PQclear(result);
    return count;
  }

 private:
  PGconn* conn_;
};

// Fresh schemas, one per store the tests ask for, dropped when the test process ends.
class Schemas : public ::testing::Environment {
 public:
  // The URL of a new, empty schema ("" after reporting a failure).
  static std::string FreshUrl() {
    const std::string base = BaseUrl();
    if (base.empty()) {
      ADD_FAILURE() << "MINIONS_TEST_POSTGRES is not set.\n" << kHowToStart;
      return "";
    }
    static std::atomic<int> counter{0};
    static const uint32_t salt = std::random_device{}();
    // Only digits and hex go into the name, so building the DDL from it is safe (identifiers
    // cannot be bound parameters).
    const std::string schema = absl::StrCat("t_", getpid(), "_", counter++, "_", absl::Hex(salt));
    RawConnection admin(base);
    if (!admin.ok()) {
      ADD_FAILURE() << "cannot connect to the test PostgreSQL at " << base << ": " << admin.error() << "\n"
                    << kHowToStart;
      return "";
    }
    if (std::string error = admin.Exec("CREATE SCHEMA " + schema); !error.empty()) {
      ADD_FAILURE() << "CREATE SCHEMA " << schema << ": " << error;
      return "";
    }
    {
      std::lock_guard<std::mutex> lock(Mutex());
      Created().push_back(schema);
    }
    // The schema is the connection's search_path: the store creates and finds its tables there.
    return absl::StrCat(base, base.find('?') == std::string::npos ? "?" : "&", "options=-csearch_path%3D", schema);
  }

  void TearDown() override {
    std::lock_guard<std::mutex> lock(Mutex());
    if (Created().empty()) return;
    RawConnection admin(BaseUrl());
    if (!admin.ok()) return;
    for (const std::string& schema : Created()) admin.Exec("DROP SCHEMA IF EXISTS " + schema + " CASCADE");
    Created().clear();
  }

 private:
  static std::mutex& Mutex() {
    static std::mutex* mutex = new std::mutex;
    return *mutex;
  }
  static std::vector<std::string>& Created() {
    static std::vector<std::string>* created = new std::vector<std::string>;
    return *created;
  }
};
[[maybe_unused]] ::testing::Environment* const kSchemas = ::testing::AddGlobalTestEnvironment(new Schemas);

std::unique_ptr<PostgresMetadataStore> MustOpen(const std::string& url, int pool_size = 4,
                                                testing::CommitFaults* faults = nullptr,
                                                const StoreOptions& options = StoreOptions{}) {
  if (url.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<PostgresMetadataStore>> store =
      PostgresMetadataStore::Open(url, options, pool_size, faults);
  EXPECT_TRUE(store.ok()) << store.status() << "\n" << kHowToStart;
  return store.ok() ? std::move(*store) : nullptr;
}

MINIONS_INSTANTIATE_STORE_CONTRACTS(Postgres, ::testing::Values(StoreFactory([]() -> std::unique_ptr<MetadataStore> {
                                      return MustOpen(Schemas::FreshUrl());
                                    })),
                                    [](const ::testing::TestParamInfo<StoreFactory>&) { return "Schema"; });
INSTANTIATE_TEST_SUITE_P(Postgres, SpotCheckContract,
                         ::testing::Values(StoreFactory([]() -> std::unique_ptr<MetadataStore> {
                           return MustOpen(Schemas::FreshUrl(), 4, nullptr, SpotCheckOptions());
                         })),
                         [](const ::testing::TestParamInfo<StoreFactory>&) { return "Schema"; });

// A fresh schema of its own: a database to the store.
TestDatabase PostgresDatabase() {
  const std::string url = Schemas::FreshUrl();
  TestDatabase database;
  database.open = [url]() -> absl::StatusOr<std::unique_ptr<RowMetadataStore>> {
    if (url.empty()) return absl::FailedPreconditionError("no test PostgreSQL");
    absl::StatusOr<std::unique_ptr<PostgresMetadataStore>> store = PostgresMetadataStore::Open(url, StoreOptions{});
    if (!store.ok()) return store.status();
    return std::unique_ptr<RowMetadataStore>(std::move(*store));
  };
  database.exec = [url](const std::string& sql) { return RawConnection(url).Exec(sql); };
  database.count = [url](const std::string& sql) { return RawConnection(url).Count(sql); };
  database.dialect = store_common::SqlDialect::kPostgres;
  return database;
}
INSTANTIATE_TEST_SUITE_P(Postgres, DatabaseContract, ::testing::Values(DatabaseFactory(PostgresDatabase)),
                         [](const ::testing::TestParamInfo<DatabaseFactory>&) { return "Schema"; });

// One lock per store: each test's schema has its own.
INSTANTIATE_TEST_SUITE_P(Postgres, WatchdogLockContract,
                         ::testing::Values(LockPlacesOf<PostgresWatchdogLock>(
                             Schemas::FreshUrl,
                             // The holder's session dies (a crashed process, a network cut, a
                             // database restart).
                             [](const std::string& url) {
                               RawConnection raw(url);  // in the same schema
                               EXPECT_EQ(raw.Count(absl::StrCat(
                                             "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype "
                                             "= 'advisory' AND granted AND objsubid = 2 AND classid::bigint = ",
                                             PostgresWatchdogLock::kLockClass,
                                             " AND objid::bigint = (hashtext(current_schema())::bigint & 4294967295)")),
                                         1);
                             })),
                         [](const ::testing::TestParamInfo<WatchdogLockFactory>&) { return "Advisory"; });

// Each test's schema is a store of its own: its own channel.
INSTANTIATE_TEST_SUITE_P(Postgres, WorkSignalContract,
                         ::testing::Values(WorkSignalFactory([] {
                           const std::string url = Schemas::FreshUrl();
                           return WorkSignalOpener([url]() -> std::unique_ptr<WorkSignal> {
                             auto signal = PostgresWorkSignal::Create(url);
                             EXPECT_TRUE(signal.ok()) << signal.status();
                             return signal.ok() ? std::move(*signal) : nullptr;
                           });
                         })),
                         [](const ::testing::TestParamInfo<WorkSignalFactory>&) { return "ListenNotify"; });

class PostgresMetadataStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    url_ = Schemas::FreshUrl();
    ASSERT_FALSE(url_.empty());
  }

  using CommitFault = testing::CommitFaults::Fault;

  std::string url_;
  const absl::Duration kTtl = absl::Seconds(30);
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
};

TEST_F(PostgresMetadataStoreTest, AnUnreachableServerOrABadConninfoIsAnError) {
  testing::FakeClock clock;
  clock.AutoAdvance(true);  // a retry would move it
  StoreOptions options;
  options.clock = &clock;
  const absl::Time start = clock.Now();
  EXPECT_CODE(PostgresMetadataStore::Open("postgresql://postgres@127.0.0.1:1/minions_test", options), kUnavailable);
  EXPECT_EQ(clock.Now(), start) << "Open waited to retry";
  EXPECT_CODE(PostgresMetadataStore::Open("nonsense", StoreOptions{}), kInvalidArgument);
  EXPECT_CODE(PostgresMetadataStore::Open(url_, StoreOptions{}, 0), kInvalidArgument);
}

// The lost-COMMIT path: a writing transaction whose COMMIT went out but whose answer never came
// back must not be run again (it committed), and one cut off before its COMMIT must be. Either
// way, each call below must have happened exactly once.
void ExpectEachCallOnceUnder(testing::CommitFaults::Fault fault, const std::string& url, absl::Time now,
                             absl::Duration ttl) {
  testing::CommitFaults faults;
  auto store = MustOpen(url, 1, &faults);
  ASSERT_NE(store, nullptr);
  JobSpec spec;
  spec.model = "m.gguf";
  ASSERT_OK_AND_ASSIGN(Job job, store->CreateJob(spec, now));
  std::vector<Task> shards(1);
  shards[0].n_records = 1;
  ASSERT_OK(store->AddTasks(job.id, shards, 1, now));
  ExecutorInfo info;
  info.name = "a";
  ASSERT_OK_AND_ASSIGN(Executor executor, store->RegisterExecutor("", info, now));
  ASSERT_OK_AND_ASSIGN(std::vector<Lease> leases, store->LeaseTasks(executor.id, 1, ttl, now));
  ASSERT_THAT(leases, SizeIs(1));
  // A batch of heartbeats: its writes go out with its COMMIT. Its replies stand whether the
  // transaction ran once (the answer lost: it committed) or again; the renewal is in either way.
  // Written only unless heard since the beat (as the server's renewals are): run again after it
  // committed, it would answer nothing renewed.
  const absl::Time beat = now + absl::Seconds(1);
  LeaseProgress held;
  held.job_id = job.id;
  held.task_index = 0;
  held.attempt = leases[0].task.attempt;
  held.records_done = 1;
  faults.Arm(fault);  // the batch's COMMIT, on the heartbeats' own connection
  ASSERT_OK_AND_ASSIGN(std::vector<HeartbeatReply> replies,
                       store->Heartbeats({HeartbeatCall{executor.id, ExecutorState::kBusy, "", {held}, std::nullopt, beat}},
                                         ttl, beat));
  EXPECT_EQ(faults.injected(), 1);
  ASSERT_THAT(replies, SizeIs(1));
  EXPECT_THAT(replies[0].renewed, SizeIs(1));
  EXPECT_THAT(replies[0].cancel, ::testing::IsEmpty());
  ASSERT_OK_AND_ASSIGN(std::vector<Task> renewed, store->ListTasks(job.id));
  EXPECT_EQ(renewed[0].lease_expires_at, beat + ttl);
  ASSERT_OK_AND_ASSIGN(Executor heard, store->GetExecutor(executor.id));
  EXPECT_EQ(heard.last_heartbeat_at, beat);
  // A completion's COMMIT goes out with its last statement. Run twice, the second run would be
  // refused (the task has succeeded) and the counts would not say 1.
  faults.Arm(fault);
  ASSERT_OK_AND_ASSIGN(Task done, store->CompleteTask(executor.id, job.id, 0, leases[0].task.attempt, 1, 0, now));
  EXPECT_EQ(faults.injected(), 2);
  EXPECT_EQ(done.state, TaskState::kSucceeded);
  ASSERT_OK_AND_ASSIGN(job, store->GetJob(job.id));
  EXPECT_EQ(job.tasks_done, 1);
  EXPECT_EQ(job.counts.completed, 1);
  EXPECT_EQ(job.state, JobState::kFinalizing);
  ASSERT_OK_AND_ASSIGN(executor, store->GetExecutor(executor.id));
  EXPECT_EQ(executor.records_done, 1);
  // A plain COMMIT: run twice, CreateJob would make two jobs; not run, none.
  faults.Arm(fault);
  ASSERT_OK(store->CreateJob(spec, now).status());
  EXPECT_EQ(faults.injected(), 3);
  ASSERT_OK_AND_ASSIGN(std::vector<Job> jobs, store->ListJobs(JobFilter{}));
  EXPECT_THAT(jobs, SizeIs(2));
}

// Statements sent together (Connection::ExecEach, ExecEachAndCommit): answered in order; the
// first failure is the answer and nothing of the transaction commits; and the commit's faults are
// handled as a lone COMMIT's are: an answer lost is looked up (run once), a connection lost before
// the COMMIT runs the transaction again (once in all). Here the statements are a transaction's
// only ones (their BEGIN goes with them), then after a first statement.
TEST_F(PostgresMetadataStoreTest, StatementsSentTogetherAnswerInOrderAndCommitOnce) {
  using postgres_store::Connection;
  using postgres_store::ConnectionPool;
  using postgres_store::Params;
  using postgres_store::PgResult;
  RawConnection raw(url_);
  ASSERT_EQ(raw.Exec("CREATE TABLE sent_together (n BIGINT PRIMARY KEY)"), "");
  RealClock clock;
  testing::CommitFaults faults;
  postgres_store::TransactionRunner runner(std::make_unique<ConnectionPool>(url_, 1, &faults), &clock);
  constexpr char kInsert[] = "INSERT INTO sent_together (n) VALUES ($1) RETURNING n * 10";
  auto insert = [&](int64_t a, int64_t b, bool after_a_read) {
    return runner.InTransaction(true, [&](Connection& c) -> absl::StatusOr<std::vector<int64_t>> {
      if (after_a_read) RETURN_IF_ERROR(c.Exec("SELECT COUNT(*) FROM sent_together").status());
      ASSIGN_OR_RETURN(std::vector<PgResult> answers,
                       c.ExecEachAndCommit({{kInsert, Params().Int(a)}, {kInsert, Params().Int(b)}}));
      std::vector<int64_t> got;
      for (const PgResult& answer : answers) got.push_back(answer.Int(0, 0));
      return got;  // empty when the answers were lost (the transaction committed)
    });
  };
  for (CommitFault fault : {CommitFault::kNone, CommitFault::kAnswerLost, CommitFault::kConnectionLostBeforeCommit}) {
    for (bool after_a_read : {false, true}) {
      SCOPED_TRACE(absl::StrCat("fault ", static_cast<int>(fault), after_a_read ? ", after a read" : ""));
      const int64_t first = raw.Count("SELECT COALESCE(MAX(n), 0) FROM sent_together") + 1;
      if (fault != CommitFault::kNone) faults.Arm(fault);
      ASSERT_OK_AND_ASSIGN(std::vector<int64_t> got, insert(first, first + 1, after_a_read));
      if (fault != CommitFault::kAnswerLost) EXPECT_THAT(got, ::testing::ElementsAre(first * 10, (first + 1) * 10));
      EXPECT_EQ(raw.Count(absl::StrCat("SELECT COUNT(*) FROM sent_together WHERE n >= ", first)), 2);
    }
  }
  EXPECT_EQ(faults.injected(), 4);
  // The second statement fails (the first one's key again): that failure is the answer, and the
  // first statement's row is not committed.
  const int64_t before = raw.Count("SELECT COUNT(*) FROM sent_together");
  absl::StatusOr<std::vector<int64_t>> refused = insert(1000, 1000, false);
  EXPECT_CODE(refused, kAlreadyExists);
  refused = insert(1001, 1001, true);
  EXPECT_CODE(refused, kAlreadyExists);
  EXPECT_EQ(raw.Count("SELECT COUNT(*) FROM sent_together"), before);
  // ExecEach: several loads in one round trip, answered in order.
  ASSERT_OK_AND_ASSIGN(std::vector<int64_t> counts,
                       runner.InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::vector<int64_t>> {
                         ASSIGN_OR_RETURN(std::vector<PgResult> answers,
                                          c.ExecEach({{"SELECT COUNT(*) FROM sent_together WHERE n < $1",
                                                       Params().Int(3)},
                                                      {"SELECT COUNT(*) FROM sent_together", Params()}}));
                         return std::vector<int64_t>{answers[0].Int(0, 0), answers[1].Int(0, 0)};
                       }));
  EXPECT_THAT(counts, ::testing::ElementsAre(2, before));
}

TEST_F(PostgresMetadataStoreTest, ACommitWhoseAnswerWasLostIsNotRunAgain) {
  ExpectEachCallOnceUnder(CommitFault::kAnswerLost, url_, now_, kTtl);
}

TEST_F(PostgresMetadataStoreTest, ATransactionCutOffBeforeItsCommitRunsAgain) {
  ExpectEachCallOnceUnder(CommitFault::kConnectionLostBeforeCommit, url_, now_, kTtl);
}

// A server died between ending a job's last task and settling it (PostgreSQL settles in a second
// transaction): JobsToFinalize's sweep settles it, as of the time it is given.
TEST_F(PostgresMetadataStoreTest, JobsLeftUnsettledAreSettledAsOfTheSweepsTime) {
  auto store = MustOpen(url_);
  ASSERT_NE(store, nullptr);
  const std::string done = SubmitTo(*store, 1, now_);
  const std::string failed = SubmitTo(*store, 1, now_);
  const std::string a = RegisterWith(*store, "a", now_);
  ASSERT_OK_AND_ASSIGN(std::vector<Lease> leases, store->LeaseTasks(a, 2, kTtl, now_));
  ASSERT_THAT(leases, SizeIs(2));
  ASSERT_OK(store->CompleteTask(a, done, 0, 1, 1, 0, now_).status());
  ASSERT_OK(store->FailTask(a, failed, 0, 1, FailureClass::kPermanent, "broken", now_).status());
  // As if the settling after those commits never happened.
  RawConnection raw(url_);
  ASSERT_EQ(raw.Exec("UPDATE jobs SET state = 'running', error = '', finished_at = NULL"), "");
  ASSERT_EQ(store->GetJob(done)->state, JobState::kRunning);

  const absl::Time later = now_ + absl::Hours(1);
  ASSERT_OK_AND_ASSIGN(std::vector<Job> to_finalize, store->JobsToFinalize(10, later));
  ASSERT_THAT(to_finalize, SizeIs(1));
  EXPECT_EQ(to_finalize[0].id, done);
  EXPECT_EQ(to_finalize[0].state, JobState::kFinalizing);
  EXPECT_EQ(to_finalize[0].updated_at, later);
  ASSERT_OK_AND_ASSIGN(Job settled_failed, store->GetJob(failed));
  EXPECT_EQ(settled_failed.state, JobState::kFailed);
  EXPECT_EQ(settled_failed.finished_at, later);
  EXPECT_THAT(settled_failed.error, HasSubstr("broken"));
}

// The retries of a transaction the database keeps breaking off wait on the store's clock, and
// end after its retry window of that clock's time: a test runs the 30 seconds in a moment.
TEST_F(PostgresMetadataStoreTest, RetriesWaitOnTheStoresClockAndGiveUpAfterItsWindow) {
  testing::FakeClock clock;
  StoreOptions options;
  options.clock = &clock;
  testing::CommitFaults faults;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PostgresMetadataStore> store,
                       PostgresMetadataStore::Open(url_, options, 1, &faults));
  JobSpec spec;
  spec.model = "m.gguf";
  faults.Arm(CommitFault::kConnectionLostBeforeCommit, 1000);  // every COMMIT
  const absl::Time start = clock.Now();
  absl::StatusOr<Job> created;
  std::atomic<bool> returned{false};
  std::thread caller([&] {
    created = store->CreateJob(spec, now_);
    returned = true;
  });
  // Each time the store waits out a backoff, its clock jumps to the end of that wait.
  while (!returned) {
    if (clock.AwaitWaiters(1, absl::Milliseconds(50))) clock.AdvanceToNextDeadline();
  }
  caller.join();
  EXPECT_CODE(created, kUnavailable);
  EXPECT_THAT(created.status().message(), HasSubstr("gave up after"));
  const absl::Duration waited = clock.Now() - start;
  EXPECT_LE(waited, postgres_store::TransactionRunner::kRetryWindow);
  // It gives up when its next wait would pass the window; a wait is at most 1.5 times the longest
  // backoff (1 s, jittered by 0.5 to 1.5): so it gave up no more than 1.5 s before the window ended.
  EXPECT_GE(waited, postgres_store::TransactionRunner::kRetryWindow - absl::Milliseconds(1500)) << "gave up early";
  // It tried again after a lost COMMIT. How many times depends on the real database, not on this
  // clock: after each lost connection the store asks whether the transaction committed, and while
  // the server has not yet noticed its client is gone the answer is "in progress" and the store
  // waits (on this clock, against the same window) for it to settle. On a busy machine that took
  // the whole window after the third try, so only a retry is asserted, not a count.
  EXPECT_GE(faults.injected(), 2);
  // None of the tries committed.
  faults.Arm(CommitFault::kNone, 0);
  ASSERT_OK_AND_ASSIGN(std::vector<Job> jobs, store->ListJobs(JobFilter{}));
  EXPECT_THAT(jobs, ::testing::IsEmpty());
}

// Runs alone (RUN_SERIAL): it restarts the server every Postgres test uses.
TEST(PostgresRestartTest, LeasingAndCompletingRideOutAServerRestart) {
  const std::string dir = ClusterDir();
  ASSERT_FALSE(dir.empty()) << "MINIONS_TEST_POSTGRES_DIR (the cluster's folder) is not set.\n" << kHowToStart;
  const std::string url = Schemas::FreshUrl();
  ASSERT_FALSE(url.empty());
  constexpr int kTasks = 100;
  const absl::Duration ttl = absl::Minutes(10);
  const absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  // Two servers, one executor each.
  std::unique_ptr<PostgresMetadataStore> stores[] = {MustOpen(url, 2), MustOpen(url, 2)};
  ASSERT_NE(stores[0], nullptr);
  ASSERT_NE(stores[1], nullptr);
  JobSpec spec;
  spec.model = "m.gguf";
  ASSERT_OK_AND_ASSIGN(Job job, stores[0]->CreateJob(spec, now));
  std::vector<Task> shards(kTasks);
  for (int i = 0; i < kTasks; ++i) {
    shards[i].index = i;
    shards[i].first_record = i;
    shards[i].n_records = 1;
  }
  ASSERT_OK(stores[0]->AddTasks(job.id, shards, kTasks, now));
  std::string executors[2];
  for (int i = 0; i < 2; ++i) {
    ExecutorInfo info;
    info.name = absl::StrCat("exe", i);
    ASSERT_OK_AND_ASSIGN(Executor executor, stores[i]->RegisterExecutor("", info, now));
    executors[i] = executor.id;
  }

  // A third executor holds one task through the restart and completes it only after: the work
  // cannot be over before the restart, however fast the machine.
  ExecutorInfo late_info;
  late_info.name = "late";
  ASSERT_OK_AND_ASSIGN(Executor late, stores[0]->RegisterExecutor("", late_info, now));
  ASSERT_OK_AND_ASSIGN(std::vector<Lease> held, stores[0]->LeaseTasks(late.id, 1, ttl, now));
  ASSERT_THAT(held, SizeIs(1));

  std::atomic<int> completed{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back([&, w] {
      while (true) {
        absl::StatusOr<std::vector<Lease>> leases = stores[w]->LeaseTasks(executors[w], 1, ttl, now);
        if (!leases.ok()) {
          ADD_FAILURE() << "LeaseTasks: " << leases.status();
          ++errors;
          return;
        }
        if (leases->empty()) return;
        for (const Lease& lease : *leases) {
          absl::SleepFor(absl::Milliseconds(15));  // "running" it
          absl::StatusOr<Task> done =
              stores[w]->CompleteTask(executors[w], job.id, lease.task.index, lease.task.attempt, 1, 0, now);
          if (!done.ok()) {
            ADD_FAILURE() << "CompleteTask " << lease.task.index << ": " << done.status();
            ++errors;
          } else {
            ++completed;
          }
        }
      }
    });
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (completed.load() < 10 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  const std::string restart = ServiceScript() + " restart '" + dir + "'";
  const int rc = std::system(restart.c_str());
  ASSERT_EQ(rc, 0) << restart;
  ASSERT_OK(stores[0]->CompleteTask(late.id, job.id, held[0].task.index, held[0].task.attempt, 1, 0, now).status());
  ++completed;
  for (std::thread& worker : workers) worker.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(completed.load(), kTasks);

  ASSERT_OK_AND_ASSIGN(std::vector<Task> tasks, stores[1]->ListTasks(job.id));
  ASSERT_THAT(tasks, SizeIs(kTasks));
  for (const Task& task : tasks) {
    EXPECT_EQ(task.state, TaskState::kSucceeded) << task.index;
    EXPECT_EQ(task.attempt, 1) << "task " << task.index << " was leased more than once";
  }
  ASSERT_OK_AND_ASSIGN(Job finished, stores[0]->GetJob(job.id));
  EXPECT_EQ(finished.state, JobState::kFinalizing);
  EXPECT_EQ(finished.tasks_succeeded, kTasks);
  EXPECT_EQ(finished.counts.completed, kTasks);
  ASSERT_OK_AND_ASSIGN(Executor a, stores[0]->GetExecutor(executors[0]));
  ASSERT_OK_AND_ASSIGN(Executor b, stores[1]->GetExecutor(executors[1]));
  ASSERT_OK_AND_ASSIGN(late, stores[0]->GetExecutor(late.id));
  EXPECT_EQ(a.records_done + b.records_done + late.records_done, kTasks);
}

}  // namespace
}  // namespace minions
