#include "store/sqlite/sqlite_row_store.h"

#include <utility>

#include "common/status_macros.h"
#include "store/sqlite/sqlite_transaction.h"

namespace minions {

absl::StatusOr<std::unique_ptr<SqliteRowStore>> SqliteRowStore::Open(const std::string& path,
                                                                     const StoreOptions& options) {
  std::unique_ptr<SqliteRowStore> store(new SqliteRowStore(path, options));
  Clock* clock = options.clock != nullptr ? options.clock : &store->real_clock_;
  ASSIGN_OR_RETURN(std::unique_ptr<sqlite_store::Connection> connection, sqlite_store::Connection::Open(path, clock));
  absl::MutexLock lock(&store->mu_);
  store->connection_ = std::move(connection);
  return store;
}

SqliteRowStore::SqliteRowStore(std::string path, const StoreOptions& options)
    : path_(std::move(path)), options_(options) {}

std::span<const store_common::Migration> SqliteRowStore::Migrations() const {
  return store_common::Migrations(store_common::SqlDialect::kSqlite);
}

absl::Status SqliteRowStore::Run(TransactionKind kind, absl::FunctionRef<absl::Status(RowTransaction&)> body) {
  absl::MutexLock lock(&mu_);
  sqlite_store::Connection& c = *connection_;
  // BEGIN IMMEDIATE takes the write lock up front (waiting up to the busy timeout): a deferred
  // transaction that reads and then writes could fail mid-way when another process wrote first.
  RETURN_IF_ERROR(c.Exec(kind == TransactionKind::kRead ? "BEGIN" : "BEGIN IMMEDIATE"));
  sqlite_store::SqliteTransaction transaction(c, options_, path_);
  const absl::Status answered = body(transaction);
  if (!answered.ok()) {
    (void)c.Exec("ROLLBACK");
    return answered;
  }
  if (absl::Status committed = c.Exec("COMMIT"); !committed.ok()) {
    (void)c.Exec("ROLLBACK");
    return committed;
  }
  return absl::OkStatus();
}

}  // namespace minions
