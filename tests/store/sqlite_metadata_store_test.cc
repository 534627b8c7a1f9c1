#include "store/sqlite/sqlite_metadata_store.h"

#include <sqlite3.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "fair_share_contract.h"
#include "gang_store_contract.h"
#include "identity_store_contract.h"
#include "model_store_contract.h"
#include "store/sqlite/sqlite_migrations.h"
#include "store/sqlite/sqlite_watchdog_lock.h"
#include "watchdog_lock_contract.h"
#include "work_signal_contract.h"
#include "store/sqlite/sqlite_work_signal.h"
#include "testing/fake_clock.h"

namespace minions {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

// A folder for this test process's database files, removed when the tests end.
class TempFolder : public ::testing::Environment {
 public:
  static const std::filesystem::path& Path() {
    static const std::filesystem::path* path = [] {
      std::string pattern = (std::filesystem::path(::testing::TempDir()) / "minions-store-XXXXXX").string();
      if (mkdtemp(pattern.data()) == nullptr) std::abort();
      return new std::filesystem::path(pattern);
    }();
    return *path;
  }
  // A file name no other store in this process has used.
  static std::string NewDatabase() {
    static std::atomic<int> counter{0};
    return (Path() / ("store-" + std::to_string(counter++) + ".db")).string();
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(Path(), ignored);
  }
};
[[maybe_unused]] ::testing::Environment* const kTempFolder = ::testing::AddGlobalTestEnvironment(new TempFolder);

std::unique_ptr<SqliteMetadataStore> MustOpen(const std::string& path) {
  absl::StatusOr<std::unique_ptr<SqliteMetadataStore>> store = SqliteMetadataStore::Open(path, StoreOptions{});
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

INSTANTIATE_TEST_SUITE_P(
    Sqlite, MetadataStoreContract,
    ::testing::Values(StoreFactory([]() -> std::unique_ptr<MetadataStore> { return MustOpen(":memory:"); }),
                      StoreFactory([]() -> std::unique_ptr<MetadataStore> {
                        return MustOpen(TempFolder::NewDatabase());
                      })),
    [](const ::testing::TestParamInfo<StoreFactory>& info) { return info.index == 0 ? "Memory" : "File"; });
INSTANTIATE_TEST_SUITE_P(
    Sqlite, FairShare,
    ::testing::Values(StoreFactory([]() -> std::unique_ptr<MetadataStore> { return MustOpen(":memory:"); }),
                      StoreFactory([]() -> std::unique_ptr<MetadataStore> {
                        return MustOpen(TempFolder::NewDatabase());
                      })),
    [](const ::testing::TestParamInfo<StoreFactory>& info) { return info.index == 0 ? "Memory" : "File"; });
INSTANTIATE_TEST_SUITE_P(
    Sqlite, Placement,
    ::testing::Values(StoreFactory([]() -> std::unique_ptr<MetadataStore> { return MustOpen(":memory:"); }),
                      StoreFactory([]() -> std::unique_ptr<MetadataStore> {
                        return MustOpen(TempFolder::NewDatabase());
                      })),
    [](const ::testing::TestParamInfo<StoreFactory>& info) { return info.index == 0 ? "Memory" : "File"; });

// The setting benchmarks compare against (server.model_affinity = false): no warm preference and
// no warm wait. The two-model traffic that keeps each executor on one model with affinity
// (Placement.TwoModelsAlternating*) makes them swap over and over without it: the simulation can
// tell the two apart.
class PlacementWithoutAffinity : public Placement {};
TEST_P(PlacementWithoutAffinity, TwoModelsAlternatingMakeExecutorsSwapModels) {
  EXPECT_EQ(store_->WarmWait(), absl::ZeroDuration());
  const ModelTraffic traffic = RunTwoModels({}, absl::Minutes(10));
  EXPECT_GE(traffic.tasks, 590);
  int late = 0;
  for (int n : traffic.late_switches) late += n;
  EXPECT_GT(late, 50);
  EXPECT_GT(traffic.loads, 100);
}
INSTANTIATE_TEST_SUITE_P(Sqlite, PlacementWithoutAffinity,
                         ::testing::Values(StoreFactory([]() -> std::unique_ptr<MetadataStore> {
                           StoreOptions options;
                           options.model_affinity = false;
                           auto store = SqliteMetadataStore::Open(":memory:", options);
                           EXPECT_TRUE(store.ok()) << store.status();
                           return store.ok() ? std::move(*store) : nullptr;
                         })),
                         [](const ::testing::TestParamInfo<StoreFactory>&) { return "Memory"; });
INSTANTIATE_TEST_SUITE_P(
    Sqlite, IdentityStoreContract,
    ::testing::Values(StoreFactory([]() -> std::unique_ptr<MetadataStore> { return MustOpen(":memory:"); }),
                      StoreFactory([]() -> std::unique_ptr<MetadataStore> {
                        return MustOpen(TempFolder::NewDatabase());
                      })),
    [](const ::testing::TestParamInfo<StoreFactory>& info) { return info.index == 0 ? "Memory" : "File"; });
INSTANTIATE_TEST_SUITE_P(
    Sqlite, ModelStoreContract,
    ::testing::Values(StoreFactory([]() -> std::unique_ptr<MetadataStore> { return MustOpen(":memory:"); }),
                      StoreFactory([]() -> std::unique_ptr<MetadataStore> {
                        return MustOpen(TempFolder::NewDatabase());
                      })),
    [](const ::testing::TestParamInfo<StoreFactory>& info) { return info.index == 0 ? "Memory" : "File"; });
INSTANTIATE_TEST_SUITE_P(
    Sqlite, GangStoreContract,
    ::testing::Values(StoreFactory([]() -> std::unique_ptr<MetadataStore> { return MustOpen(":memory:"); }),
                      StoreFactory([]() -> std::unique_ptr<MetadataStore> {
                        return MustOpen(TempFolder::NewDatabase());
                      })),
    [](const ::testing::TestParamInfo<StoreFactory>& info) { return info.index == 0 ? "Memory" : "File"; });

INSTANTIATE_TEST_SUITE_P(Sqlite, WatchdogLockContract,
                         ::testing::Values(WatchdogLockFactory([] {
                           const std::string database = TempFolder::NewDatabase();
                           return WatchdogLockPlace{
                               [database]() -> absl::StatusOr<std::unique_ptr<WatchdogLock>> {
                                 auto lock = SqliteWatchdogLock::TryAcquire(database);
                                 if (!lock.ok()) return lock.status();
                                 return std::unique_ptr<WatchdogLock>(std::move(*lock));
                               },
                               // Someone removes the lock file (a clean-up script, a person).
                               [database] { std::filesystem::remove(SqliteWatchdogLock::LockPath(database)); }};
                         })),
                         [](const ::testing::TestParamInfo<WatchdogLockFactory>&) { return "File"; });

INSTANTIATE_TEST_SUITE_P(Sqlite, WorkSignalContract,
                         ::testing::Values(WorkSignalFactory([] {
                           const std::string database = TempFolder::NewDatabase();
                           return WorkSignalOpener([database]() -> std::unique_ptr<WorkSignal> {
                             auto signal = SqliteWorkSignal::Open(database, absl::Milliseconds(10));
                             EXPECT_TRUE(signal.ok()) << signal.status();
                             return signal.ok() ? std::move(*signal) : nullptr;
                           });
                         })),
                         [](const ::testing::TestParamInfo<WorkSignalFactory>&) { return "CounterFile"; });

TEST(SqliteWatchdogLock, AnUnopenableLockFileIsAnError) {
  auto lock = SqliteWatchdogLock::TryAcquire((TempFolder::Path() / "no" / "such" / "dir.db").string());
  EXPECT_FALSE(lock.ok());
  EXPECT_NE(lock.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(lock.status().message()), HasSubstr("dir.db.watchdog.lock"));
}

// Runs one query with the SQLite API directly, as another tool (or an older or newer binary) would.
void RawExec(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, &error), SQLITE_OK) << (error ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);
}

int64_t RawCount(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  int64_t count = -1;
  if (sqlite3_step(stmt) == SQLITE_ROW) count = sqlite3_column_int64(stmt, 0);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return count;
}

class SqliteMetadataStoreTest : public ::testing::Test {
 protected:
  const std::string path_ = TempFolder::NewDatabase();
  const absl::Duration kTtl = absl::Seconds(30);
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);

  static std::vector<Task> Shards(int n) {
    std::vector<Task> tasks(n);
    for (int i = 0; i < n; ++i) {
      tasks[i].index = i;
      tasks[i].first_record = i;
      tasks[i].n_records = 1;
    }
    return tasks;
  }
  std::string SubmitTo(MetadataStore& store, int n_tasks) {
    JobSpec spec;
    spec.model = "m.gguf";
    absl::StatusOr<Job> job = store.CreateJob(spec, now_);
    EXPECT_TRUE(job.ok()) << job.status();
    EXPECT_TRUE(store.AddTasks(job->id, Shards(n_tasks), n_tasks, now_).ok());
    return job->id;
  }
  std::string RegisterWith(MetadataStore& store, const std::string& name) {
    ExecutorInfo info;
    info.name = name;
    info.memory_bytes = int64_t{8} << 30;
    absl::StatusOr<Executor> executor = store.RegisterExecutor("", info, now_);
    EXPECT_TRUE(executor.ok()) << executor.status();
    return executor->id;
  }
};

TEST_F(SqliteMetadataStoreTest, ReopeningAFileKeepsTheData) {
  std::string job_id, executor_id;
  {
    auto store = MustOpen(path_);
    ASSERT_NE(store, nullptr);
    job_id = SubmitTo(*store, 3);
    executor_id = RegisterWith(*store, "a");
    ASSERT_OK(store->LeaseTasks(executor_id, 1, kTtl, now_));
  }
  auto reopened = MustOpen(path_);
  ASSERT_NE(reopened, nullptr);
  ASSERT_OK_AND_ASSIGN(Job job, reopened->GetJob(job_id));
  EXPECT_EQ(job.state, JobState::kRunning);
  EXPECT_EQ(job.spec.model, "m.gguf");
  EXPECT_EQ(job.created_at, now_);
  ASSERT_OK_AND_ASSIGN(std::vector<Task> tasks, reopened->ListTasks(job_id));
  ASSERT_THAT(tasks, SizeIs(3));
  EXPECT_EQ(tasks[0].state, TaskState::kRunning);
  EXPECT_EQ(tasks[0].executor_id, executor_id);
  EXPECT_EQ(tasks[0].lease_expires_at, now_ + kTtl);
  ASSERT_OK_AND_ASSIGN(Executor executor, reopened->GetExecutor(executor_id));
  EXPECT_EQ(executor.info.name, "a");
  // The lease is still the executor's, fenced as before.
  EXPECT_OK(reopened->CompleteTask(executor_id, job_id, 0, 1, 1, 0, now_));
}

TEST_F(SqliteMetadataStoreTest, MigrationsAreAppliedOnce) {
  for (int i = 0; i < 3; ++i) {
    auto store = MustOpen(path_);
    ASSERT_NE(store, nullptr);
    ASSERT_OK_AND_ASSIGN(int version, store->SchemaVersion());
    EXPECT_EQ(version, sqlite_store::LatestSchemaVersion());
  }
  EXPECT_EQ(RawCount(path_, "SELECT COUNT(*) FROM schema_migrations"),
            static_cast<int64_t>(sqlite_store::Migrations().size()));
  EXPECT_EQ(RawCount(path_, "SELECT MAX(version) FROM schema_migrations"), sqlite_store::LatestSchemaVersion());
  // The file is in WAL mode, so a watchdog process and a server can share it.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &stmt, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)), "wal");
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

TEST_F(SqliteMetadataStoreTest, MigrationVersionsAreContiguous) {
  int expected = 1;
  for (const sqlite_store::Migration& migration : sqlite_store::Migrations()) {
    EXPECT_EQ(migration.version, expected++) << migration.description;
  }
}

// A migration that has landed keeps its number for good: a database that applied it under that
// number would otherwise skip its replacement and apply it again under the next (as happened when
// gang seats landed as 7 and were renumbered 8 on a branch: "table gang_seats already exists").
// Append landed migrations here as they land.
TEST_F(SqliteMetadataStoreTest, LandedMigrationsKeepTheirNumbers) {
  const std::vector<std::string> landed = {"initial schema", "", "task checkpoints", "identities", "the model registry",
                                           "fair share", "gangs", "settings", "gang jobs", "task sizes",
                                           "accounting: each team's device time", "accounting: each job's device time",
                                           "accounting: a gang attempt's running time",
                                           "accounting: the tokens a finished job's answers used"};
  ASSERT_GE(sqlite_store::Migrations().size(), landed.size());
  for (size_t i = 0; i < landed.size(); ++i) {
    if (landed[i].empty()) continue;  // (2 differs by backend)
    EXPECT_TRUE(absl::StartsWith(sqlite_store::Migrations()[i].description, landed[i]))
        << "migration " << i + 1 << " was \"" << landed[i] << "...\" when it landed, is now \""
        << sqlite_store::Migrations()[i].description << "\"";
  }
}

// Migration 13 on a database where a gang attempt runs: from then on that attempt counts once per
// executor it holds in its team's usage, as attempts begun after the upgrade do.
TEST_F(SqliteMetadataStoreTest, UpgradingCountsARunningGangAttemptOncePerExecutor) {
  if (sqlite3_libversion_number() < 3035000) {
    GTEST_SKIP() << "this SQLite has no DROP COLUMN to undo the migration with";
  }
  {
    auto store = MustOpen(path_);
    ASSERT_NE(store, nullptr);
    ASSERT_OK(RunAGangOfThreeAndOneSingleTask(*store, now_, kTtl));
  }
  // The database as schema 12 had it: no device columns (running and running_since_us are as
  // they were).
  RawExec(path_, "DROP TRIGGER tasks_running_by_team");
  RawExec(path_, "ALTER TABLE team_usage DROP COLUMN running_devices");
  RawExec(path_, "ALTER TABLE team_usage DROP COLUMN running_device_since_us");
  RawExec(path_, "ALTER TABLE jobs DROP COLUMN prompt_tokens");  // (migration 14's)
  RawExec(path_, "ALTER TABLE jobs DROP COLUMN completion_tokens");
  RawExec(path_, "DELETE FROM schema_migrations WHERE version >= 13");
  ASSERT_EQ(RawCount(path_, "SELECT MAX(version) FROM schema_migrations"), 12);

  auto store = MustOpen(path_);
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(std::vector<TeamUsage> teams, store->ListTeamUsage(now_ + absl::Seconds(10)));
  ASSERT_THAT(teams, SizeIs(1));
  EXPECT_EQ(teams[0].running, 2);
  EXPECT_EQ(teams[0].usage, absl::Seconds(40)) << "the gang's 3 executors and the single one, 10 s each";
  EXPECT_EQ(RawCount(path_, "SELECT CAST(running_since_us AS INTEGER) FROM team_usage"), 2 * absl::ToUnixMicros(now_))
      << "two running tasks' starts, as before";
}

TEST_F(SqliteMetadataStoreTest, ANewerSchemaIsRefused) {
  { ASSERT_NE(MustOpen(path_), nullptr); }
  const std::string future = absl::StrCat("INSERT INTO schema_migrations (version, applied_at) VALUES (",
                                          sqlite_store::LatestSchemaVersion() + 1, ", 'tomorrow')");
  RawExec(path_, future.c_str());
  absl::StatusOr<std::unique_ptr<SqliteMetadataStore>> store = SqliteMetadataStore::Open(path_, StoreOptions{});
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("newer"));
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr(absl::StrCat("schema version ", sqlite_store::LatestSchemaVersion() + 1)));
}

TEST_F(SqliteMetadataStoreTest, AnUnopenablePathIsAnError) {
  absl::StatusOr<std::unique_ptr<SqliteMetadataStore>> store =
      SqliteMetadataStore::Open((TempFolder::Path() / "no-such-dir" / "x.db").string(), StoreOptions{});
  EXPECT_FALSE(store.ok());
}

TEST_F(SqliteMetadataStoreTest, InMemoryStoresAreSeparate) {
  auto one = MustOpen(":memory:");
  auto two = MustOpen(":memory:");
  const std::string job_id = SubmitTo(*one, 1);
  EXPECT_CODE(two->GetJob(job_id), kNotFound);
}

TEST_F(SqliteMetadataStoreTest, TwoStoresOnOneFileSeeEachOthersWrites) {
  // A server and a watchdog process, each with its own connection to the file.
  auto server = MustOpen(path_);
  auto watchdog = MustOpen(path_);
  ASSERT_NE(server, nullptr);
  ASSERT_NE(watchdog, nullptr);

  const std::string job_id = SubmitTo(*server, 1);
  const std::string a = RegisterWith(*server, "a");
  ASSERT_OK_AND_ASSIGN(std::vector<Lease> leases, server->LeaseTasks(a, 1, kTtl, now_));
  ASSERT_THAT(leases, SizeIs(1));

  ASSERT_OK_AND_ASSIGN(Job seen, watchdog->GetJob(job_id));
  EXPECT_EQ(seen.state, JobState::kRunning);

  now_ += absl::Minutes(1);
  ASSERT_OK_AND_ASSIGN(std::vector<Executor> lost, watchdog->MarkLostExecutors(now_ - kTtl, now_));
  EXPECT_THAT(lost, SizeIs(1));
  ASSERT_OK_AND_ASSIGN(std::vector<Task> expired, watchdog->ExpireLeases(now_, 10));
  ASSERT_THAT(expired, SizeIs(1));

  ASSERT_OK_AND_ASSIGN(Executor executor, server->GetExecutor(a));
  EXPECT_EQ(executor.state, ExecutorState::kLost);
  EXPECT_CODE(server->CompleteTask(a, job_id, 0, 1, 1, 0, now_), kFailedPrecondition);
  ASSERT_OK_AND_ASSIGN(std::vector<Task> tasks, server->ListTasks(job_id));
  EXPECT_EQ(tasks[0].state, TaskState::kPending);
}

TEST_F(SqliteMetadataStoreTest, TwoStoresOnOneFileNeverGrantATaskTwice) {
  constexpr int kTasks = 200;
  auto first = MustOpen(path_);
  auto second = MustOpen(path_);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  SubmitTo(*first, kTasks);
  MetadataStore* stores[] = {first.get(), second.get(), first.get(), second.get()};
  std::vector<std::string> executors;
  for (int i = 0; i < 4; ++i) executors.push_back(RegisterWith(*stores[i], "exe" + std::to_string(i)));

  std::vector<std::vector<int64_t>> granted(4);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      while (true) {
        absl::StatusOr<std::vector<Lease>> leases = stores[t]->LeaseTasks(executors[t], 2, kTtl, now_);
        if (!leases.ok()) {
          ADD_FAILURE() << leases.status();
          ++errors;
          return;
        }
        if (leases->empty()) return;
        for (const Lease& lease : *leases) granted[t].push_back(lease.task.index);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(errors.load(), 0);
  std::set<int64_t> seen;
  size_t total = 0;
  for (const auto& indexes : granted) {
    total += indexes.size();
    seen.insert(indexes.begin(), indexes.end());
  }
  EXPECT_EQ(total, static_cast<size_t>(kTasks));
  EXPECT_EQ(seen.size(), static_cast<size_t>(kTasks));
}

// Another process holds the write lock: the store waits on its clock, a little longer each time,
// then answers Unavailable after five seconds of that clock.
TEST_F(SqliteMetadataStoreTest, ABusyDatabaseIsWaitedForOnTheStoresClock) {
  testing::FakeClock clock;
  StoreOptions options;
  options.clock = &clock;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SqliteMetadataStore> store, SqliteMetadataStore::Open(path_, options));
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);

  const absl::Time start = clock.Now();
  absl::StatusOr<Executor> registered;
  std::atomic<bool> returned{false};
  std::thread caller([&] {
    registered = store->RegisterExecutor("", ExecutorInfo{}, now_);
    returned = true;
  });
  int waits = 0;
  while (!returned) {
    if (clock.AwaitWaiters(1, absl::Milliseconds(50))) {
      clock.AdvanceToNextDeadline();
      ++waits;
    }
  }
  caller.join();
  EXPECT_CODE(registered, kUnavailable);
  EXPECT_GE(clock.Now() - start, absl::Seconds(5));
  EXPECT_LT(clock.Now() - start, absl::Seconds(6));
  EXPECT_GT(waits, 10);

  // Once the other transaction ends, the store writes again.
  ASSERT_EQ(sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  EXPECT_OK(store->RegisterExecutor("", ExecutorInfo{}, now_).status());
}

}  // namespace
}  // namespace minions
