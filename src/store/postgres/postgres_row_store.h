#pragma once
// PostgresRowStore: the PostgreSQL backend's rows (store/row_store.h RowStore), for several
// servers (and a watchdog) sharing one database. Its row operations are PostgresTransaction's
// (postgres_transaction.h); this class runs them.
//
// - Transactions: each runs on a pooled connection through a TransactionRunner
//   (pg_transaction_runner.h): one the database broke off (the connection lost, a serialization
//   failure or deadlock) is run again for up to 30 seconds, then it is Unavailable; a COMMIT whose
//   answer was lost is looked up, not run twice.
// - Isolation: READ COMMITTED with row locks. A writing transaction locks every row it loads
//   (FOR UPDATE) before a rule changes it, so no update is lost; leasing picks its tasks with FOR
//   UPDATE SKIP LOCKED, so servers leasing at once take disjoint tasks without waiting on each
//   other (and, as PostgreSQL re-checks a locked row's WHERE clause against its newest version,
//   never a task another transaction just granted). SERIALIZABLE would add predicate-lock aborts
//   on every concurrent lease for no extra safety here. Lock order: tasks (in key order) ->
//   executors -> jobs -> counter shards (in job order) -> tokens; settling locks a job alone,
//   after the commit that ended its tasks. Leasing locks its executors first but never waits for
//   a task (SKIP LOCKED keeps the lock of a row it then rejects, one another server just granted,
//   so any method taking job -> task would deadlock against it). A deadlock that still happens is
//   broken by PostgreSQL (after deadlock_timeout) and retried (ConflictsRetried counts them).
// - Settling: transactions ending a job's last tasks at once cannot see each other's counter
//   shards, so a job is settled right after the commit (Settling::kAfterCommit).
// - Connections: a fixed pool (made lazily, re-made when broken) serves all threads; a
//   transaction waits for a free connection. Heartbeats have a connection of their own (their
//   batches commit one at a time, server/heartbeat_batcher.h): in a burst of leases and
//   completions that fill the pool, a batch of heartbeats never waits for a connection (measured
//   at 10,000 executors: 20-45 ms of a heartbeat batch's time went to that wait).
// - The schema: store/common/migration.h, in the first schema in the connection's search_path.
// Owns the pools; borrows the clock of its options. Thread-safe.

#include <memory>
#include <span>
#include <string>

#include "common/clock.h"
#include "store/metadata_store.h"
#include "store/postgres/pg_connection.h"
#include "store/postgres/pg_transaction_runner.h"
#include "store/row_store.h"

namespace minions {

class PostgresRowStore : public RowStore {
 public:
  // `conninfo`: a libpq URL or key=value string. Unavailable when the server cannot be reached
  // now. Up to `pool_size` connections, and one for heartbeats. `commits` (borrowed; null in
  // production) hears of every writing transaction's COMMIT (pg_connection.h CommitObserver).
  static absl::StatusOr<std::unique_ptr<PostgresRowStore>> Open(const std::string& conninfo,
                                                                const StoreOptions& options, int pool_size,
                                                                postgres_store::CommitObserver* commits);
  PostgresRowStore(const PostgresRowStore&) = delete;
  PostgresRowStore& operator=(const PostgresRowStore&) = delete;

  absl::Status Run(TransactionKind kind, absl::FunctionRef<absl::Status(RowTransaction&)> body) override;
  Settling settling() const override { return Settling::kAfterCommit; }
  std::span<const store_common::Migration> Migrations() const override;
  // Both pools'.
  int64_t ConflictsRetried() const override {
    return transactions_.conflicts_retried() + heartbeat_transactions_.conflicts_retried();
  }

 private:
  PostgresRowStore(std::unique_ptr<postgres_store::ConnectionPool> pool,
                   std::unique_ptr<postgres_store::ConnectionPool> heartbeat_pool, const StoreOptions& options);

  const StoreOptions options_;
  RealClock real_clock_;  // when options_.clock is null
  postgres_store::TransactionRunner transactions_;            // owns the connection pool
  postgres_store::TransactionRunner heartbeat_transactions_;  // Heartbeats' own (one connection)
};

}  // namespace minions
