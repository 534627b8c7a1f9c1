#pragma once
// PostgresMetadataStore: the MetadataStore on a PostgreSQL database, for several servers (and a
// watchdog) sharing one store: every operation as RowMetadataStore writes it
// (store/common/row_metadata_store.h), the same as on SQLite, over PostgresRowStore's rows
// (postgres_row_store.h: isolation, lock order, retries and commit verification, a heartbeat
// connection of its own) and PostgresTransaction's SQL (postgres_transaction.h: set-based rows,
// pipelined round trips, SKIP LOCKED, counter shards).
// - Open applies the schema migrations the database lacks (store/common/migration.h)
//   under a transaction-scoped advisory lock, and refuses a schema newer than this binary
//   (FailedPrecondition). The schema is the first one in the connection's search_path.
// The watchdog's lock on the same database is PostgresWatchdogLock (postgres_watchdog_lock.h).
// Thread-safe.

#include <memory>
#include <string>

#include "store/common/row_metadata_store.h"

namespace minions {
namespace postgres_store {
class CommitObserver;  // pg_connection.h
}  // namespace postgres_store

class PostgresMetadataStore : public RowMetadataStore {
 public:
  // `conninfo` is a libpq URL (postgresql://user@host:port/db?...) or key=value string. Fails
  // with Unavailable when the server cannot be reached now. Opens up to `pool_size` connections,
  // and one more for heartbeats. `commits` (borrowed; none in production) hears of every writing
  // transaction's COMMIT: a seam for tests that break the connection there.
  static absl::StatusOr<std::unique_ptr<PostgresMetadataStore>> Open(const std::string& conninfo,
                                                                     const StoreOptions& options, int pool_size = 4,
                                                                     postgres_store::CommitObserver* commits = nullptr);

 private:
  using RowMetadataStore::RowMetadataStore;
};

}  // namespace minions
