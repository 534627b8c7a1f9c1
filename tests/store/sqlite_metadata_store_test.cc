#include "store/sqlite/sqlite_metadata_store.h"

#include <sqlite3.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "database_contract.h"
#include "spot_check_contract.h"
#include "store_contracts.h"
#include "store/sqlite/sqlite_watchdog_lock.h"
#include "watchdog_lock_contract.h"
#include "work_signal_contract.h"
#include "store/sqlite/sqlite_work_signal.h"
#include "testing/fake_clock.h"
#include "testing/temp_dir.h"

namespace minions {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

// A folder for this test process's database files, removed when the tests end.
class TempFolder : public ::testing::Environment {
 public:
  static const std::filesystem::path& Path() {
    static const std::filesystem::path* path = [] {
      return new std::filesystem::path(testing::MakeTempDir("minions-store"));
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

std::string StoreName(const ::testing::TestParamInfo<StoreFactory>& info) {
  return info.index == 0 ? "Memory" : "File";
}
MINIONS_INSTANTIATE_STORE_CONTRACTS(
    Sqlite,
    ::testing::Values(StoreFactory([]() -> std::unique_ptr<MetadataStore> { return MustOpen(":memory:"); }),
                      StoreFactory([]() -> std::unique_ptr<MetadataStore> {
                        return MustOpen(TempFolder::NewDatabase());
                      })),
    StoreName);

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
INSTANTIATE_TEST_SUITE_P(Sqlite, SpotCheckContract,
                         ::testing::Values(StoreFactory([]() -> std::unique_ptr<MetadataStore> {
                           auto store = SqliteMetadataStore::Open(":memory:", SpotCheckOptions());
                           EXPECT_TRUE(store.ok()) << store.status();
                           return store.ok() ? std::move(*store) : nullptr;
                         })),
                         [](const ::testing::TestParamInfo<StoreFactory>&) { return "Memory"; });
INSTANTIATE_TEST_SUITE_P(Sqlite, PlacementWithoutAffinity,
                         ::testing::Values(StoreFactory([]() -> std::unique_ptr<MetadataStore> {
                           StoreOptions options;
                           options.model_affinity = false;
                           auto store = SqliteMetadataStore::Open(":memory:", options);
                           EXPECT_TRUE(store.ok()) << store.status();
                           return store.ok() ? std::move(*store) : nullptr;
                         })),
                         [](const ::testing::TestParamInfo<StoreFactory>&) { return "Memory"; });
INSTANTIATE_TEST_SUITE_P(Sqlite, WatchdogLockContract,
                         ::testing::Values(LockPlacesOf<SqliteWatchdogLock>(
                             TempFolder::NewDatabase,
                             // Someone removes the lock file (a clean-up script, a person).
                             [](const std::string& database) {
                               std::filesystem::remove(SqliteWatchdogLock::LockPath(database));
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

// Runs one query with the SQLite API directly, as another tool (or an older or newer binary)
// would: "" on success, else the error.
std::string RawExec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) return "cannot open " + path;
  char* error = nullptr;
  std::string failure;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) failure = error != nullptr ? error : "?";
  sqlite3_free(error);
  sqlite3_close(db);
  return failure;
}

int64_t RawCount(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  int64_t count = -1;
  if (sqlite3_step(stmt) == SQLITE_ROW) count = sqlite3_column_int64(stmt, 0);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return count;
}

// A fresh database file of its own.
TestDatabase SqliteDatabase() {
  const std::string path = TempFolder::NewDatabase();
  TestDatabase database;
  database.open = [path]() -> absl::StatusOr<std::unique_ptr<RowMetadataStore>> {
    absl::StatusOr<std::unique_ptr<SqliteMetadataStore>> store = SqliteMetadataStore::Open(path, StoreOptions{});
    if (!store.ok()) return store.status();
    return std::unique_ptr<RowMetadataStore>(std::move(*store));
  };
  database.exec = [path](const std::string& sql) { return RawExec(path, sql); };
  database.count = [path](const std::string& sql) { return RawCount(path, sql); };
  database.dialect = store_common::SqlDialect::kSqlite;
  // The upgrade tests drop columns: SQLite has DROP COLUMN from 3.35 on.
  database.can_drop_columns = sqlite3_libversion_number() >= 3035000;
  return database;
}
INSTANTIATE_TEST_SUITE_P(Sqlite, DatabaseContract, ::testing::Values(DatabaseFactory(SqliteDatabase)),
                         [](const ::testing::TestParamInfo<DatabaseFactory>&) { return "File"; });

class SqliteMetadataStoreTest : public ::testing::Test {
 protected:
  const std::string path_ = TempFolder::NewDatabase();
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
};

// The file is in WAL mode, so a watchdog process and a server can share it.
TEST_F(SqliteMetadataStoreTest, AFileIsInWalMode) {
  ASSERT_NE(MustOpen(path_), nullptr);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &stmt, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)), "wal");
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

TEST_F(SqliteMetadataStoreTest, AnUnopenablePathIsAnError) {
  absl::StatusOr<std::unique_ptr<SqliteMetadataStore>> store =
      SqliteMetadataStore::Open((TempFolder::Path() / "no-such-dir" / "x.db").string(), StoreOptions{});
  EXPECT_FALSE(store.ok());
}

TEST_F(SqliteMetadataStoreTest, InMemoryStoresAreSeparate) {
  auto one = MustOpen(":memory:");
  auto two = MustOpen(":memory:");
  ASSERT_OK_AND_ASSIGN(Job job, one->CreateJob(JobSpec{}, now_));
  EXPECT_CODE(two->GetJob(job.id), kNotFound);
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
