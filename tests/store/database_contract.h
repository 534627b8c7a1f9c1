#pragma once
// The database contract: what a store's database keeps for the stores that open it, one suite
// every backend passes. The schema's migrations (one runner, store/common/schema_migrator.h):
// applied once, whoever opens the database first or at once, never renumbered, a newer schema
// refused; the data across reopening; and several stores (servers, a watchdog) on one database.
// A backend's test file instantiates it with a factory that makes a fresh, empty database and
// says how to open it and to reach it raw, as another tool (or an older or newer binary) would:
//
//   INSTANTIATE_TEST_SUITE_P(Sqlite, DatabaseContract, ::testing::Values(DatabaseFactory([] { ... })));
//
// The tests live in database_contract.cc.

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "metadata_store_contract.h"
#include "store/common/migration.h"
#include "store/common/row_metadata_store.h"

namespace minions {

// One database of one backend.
struct TestDatabase {
  // Opens a store on the database (the same database every call).
  std::function<absl::StatusOr<std::unique_ptr<RowMetadataStore>>()> open;
  // Runs constant SQL on the database directly: "" on success, else the error.
  std::function<std::string(const std::string& sql)> exec;
  // The one integer constant SQL answers (-1 when it fails).
  std::function<int64_t(const std::string& sql)> count;
  // The backend's SQL.
  store_common::SqlDialect dialect;
  // Whether the backend's library can drop columns (UndoMigrations' statements); the upgrade
  // tests skip where it cannot.
  bool can_drop_columns = true;
};

// Statements that take a database of the latest schema back to schema `version` (its data kept,
// running_since_us as schema 12 had it), in `dialect`'s SQL: the upgrade tests migrate it again.
// A new migration adds its undoing at the top of the list (database_contract.cc).
std::vector<std::string> UndoMigrations(int version, store_common::SqlDialect dialect);

// A queued job of `n_tasks` one-record tasks, submitted at `now` ("" after reporting a failure).
inline std::string SubmitTo(MetadataStore& store, int n_tasks, absl::Time now) {
  std::vector<Task> tasks(n_tasks);
  for (int i = 0; i < n_tasks; ++i) {
    tasks[i].index = i;
    tasks[i].first_record = i;
    tasks[i].n_records = 1;
  }
  JobSpec spec;
  spec.model = "m.gguf";
  absl::StatusOr<Job> job = store.CreateJob(spec, now);
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return "";
  EXPECT_OK(store.AddTasks(job->id, tasks, n_tasks, now));
  return job->id;
}

// An executor called `name` with 8 GiB, registered at `now` ("" after reporting a failure).
inline std::string RegisterWith(MetadataStore& store, const std::string& name, absl::Time now) {
  ExecutorInfo info;
  info.name = name;
  info.memory_bytes = int64_t{8} << 30;
  absl::StatusOr<Executor> executor = store.RegisterExecutor("", info, now);
  EXPECT_TRUE(executor.ok()) << executor.status();
  return executor.ok() ? executor->id : "";
}

using DatabaseFactory = std::function<TestDatabase()>;
inline void PrintTo(const DatabaseFactory&, std::ostream* os) { *os << "a database factory"; }

class DatabaseContract : public ::testing::TestWithParam<DatabaseFactory> {
 protected:
  const absl::Duration kTtl = absl::Seconds(30);

  void SetUp() override { database_ = GetParam()(); }

  std::unique_ptr<RowMetadataStore> Open() {
    absl::StatusOr<std::unique_ptr<RowMetadataStore>> store = database_.open();
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }
  std::span<const store_common::Migration> Migrations() const { return store_common::Migrations(database_.dialect); }
  int LatestVersion() const { return store_common::LatestVersion(Migrations()); }
  // Takes the database back to schema `version`: UndoMigrations, and its rows of schema_migrations.
  void UndoTo(int version) {
    for (const std::string& sql : UndoMigrations(version, database_.dialect)) ASSERT_EQ(database_.exec(sql), "") << sql;
    ASSERT_EQ(database_.exec(absl::StrCat("DELETE FROM schema_migrations WHERE version > ", version)), "");
    ASSERT_EQ(database_.count("SELECT MAX(version) FROM schema_migrations"), version);
  }

  TestDatabase database_;
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
};

}  // namespace minions
