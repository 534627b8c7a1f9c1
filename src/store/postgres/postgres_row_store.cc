#include "store/postgres/postgres_row_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "store/postgres/pg_connection_pool.h"
#include "store/postgres/postgres_transaction.h"

namespace minions {

using postgres_store::ConnectionPool;

absl::StatusOr<std::unique_ptr<PostgresRowStore>> PostgresRowStore::Open(const std::string& conninfo,
                                                                         const StoreOptions& options, int pool_size,
                                                                         postgres_store::CommitObserver* commits) {
  RETURN_IF_ERROR(postgres_store::CheckConninfo(conninfo));
  if (pool_size < 1) return absl::InvalidArgumentError(absl::StrCat("pool size ", pool_size, " < 1"));
  auto pool = std::make_unique<ConnectionPool>(conninfo, pool_size, commits);
  {
    // A server that cannot be reached at all now is an error at once; retrying is for a server
    // that goes away while we use it.
    postgres_store::Borrowed connection(pool.get());
    RETURN_IF_ERROR(connection->EnsureConnected());
  }
  return std::unique_ptr<PostgresRowStore>(
      new PostgresRowStore(std::move(pool), std::make_unique<ConnectionPool>(conninfo, 1, commits), options));
}

PostgresRowStore::PostgresRowStore(std::unique_ptr<ConnectionPool> pool, std::unique_ptr<ConnectionPool> heartbeat_pool,
                                   const StoreOptions& options)
    : options_(options),
      transactions_(std::move(pool), options.clock != nullptr ? options.clock : &real_clock_),
      heartbeat_transactions_(std::move(heartbeat_pool), options.clock != nullptr ? options.clock : &real_clock_) {}

std::span<const store_common::Migration> PostgresRowStore::Migrations() const {
  return store_common::Migrations(store_common::SqlDialect::kPostgres);
}

absl::Status PostgresRowStore::Run(TransactionKind kind, absl::FunctionRef<absl::Status(RowTransaction&)> body) {
  postgres_store::TransactionRunner& runner =
      kind == TransactionKind::kHeartbeats ? heartbeat_transactions_ : transactions_;
  return runner.InTransaction(kind != TransactionKind::kRead, [&](postgres_store::Connection& c) -> absl::Status {
    postgres_store::PostgresTransaction transaction(c, options_);
    return body(transaction);
  });
}

}  // namespace minions
