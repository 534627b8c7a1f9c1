#pragma once
// SqliteRowStore: the SQLite backend's rows (store/row_store.h RowStore) on one file (or
// ":memory:"), the embedded default for a single machine.
//
// - The file is in WAL mode with a busy handler, so several processes (a server and a watchdog)
//   may open it at once; a writing transaction begins with BEGIN IMMEDIATE, so that two writers
//   serialise instead of failing half-way; a database still locked by another process after the
//   busy timeout is Unavailable.
// - One writer at a time sees every count, so a job is settled in the transaction that ended its
//   last task (Settling::kInTransaction), and rows need no locks of their own.
// - The schema: store/common/migration.h.
// Owns one connection (sqlite_connection.h), guarded by a mutex: transactions from any thread run
// one at a time.

#include <memory>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "store/metadata_store.h"
#include "store/row_store.h"
#include "store/sqlite/sqlite_connection.h"

namespace minions {

class SqliteRowStore : public RowStore {
 public:
  // `path` is a file name (created when missing) or ":memory:" for a private in-memory database.
  static absl::StatusOr<std::unique_ptr<SqliteRowStore>> Open(const std::string& path, const StoreOptions& options);
  SqliteRowStore(const SqliteRowStore&) = delete;
  SqliteRowStore& operator=(const SqliteRowStore&) = delete;

  absl::Status Run(TransactionKind kind, absl::FunctionRef<absl::Status(RowTransaction&)> body) override
      ABSL_LOCKS_EXCLUDED(mu_);
  Settling settling() const override { return Settling::kInTransaction; }
  std::span<const store_common::Migration> Migrations() const override;

 private:
  SqliteRowStore(std::string path, const StoreOptions& options);

  const std::string path_;
  const StoreOptions options_;
  RealClock real_clock_;  // when options_.clock is null
  absl::Mutex mu_;
  std::unique_ptr<sqlite_store::Connection> connection_ ABSL_GUARDED_BY(mu_);
};

}  // namespace minions
