#pragma once
// sqlite_store::Connection: one SQLite connection of the store, with its cache of prepared
// statements and its busy handler (a database another connection or process writes is waited
// for on the store's clock, a little longer each time, for up to kBusyTimeout per statement, then
// the statement is Unavailable). Internal to minions_store_sqlite.
// Owns the sqlite3 handle (closed by the destructor) and the prepared statements. Not
// thread-safe: SqliteRowStore uses it under its mutex.

#include <sqlite3.h>

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "store/sqlite/sqlite_statement.h"

namespace minions::sqlite_store {

// How long a statement waits for another connection's (or process's) write transaction before
// giving up with Unavailable. Transactions here are short; seconds of waiting mean something is
// stuck.
inline constexpr absl::Duration kBusyTimeout = absl::Seconds(5);

class Connection {
 public:
  // Opens `path` (created when missing; ":memory:" a private in-memory database) in WAL mode, its
  // waits on `clock` (borrowed; outlives the connection).
  static absl::StatusOr<std::unique_ptr<Connection>> Open(const std::string& path, Clock* clock);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // A cached prepared statement for constant `sql`, reset and with its bindings cleared.
  absl::StatusOr<Statement> Prepare(const char* sql);
  // Constant text of one or more statements, no parameters.
  absl::Status Exec(const char* sql);

 private:
  Connection(sqlite3* db, Clock* clock) : db_(db), clock_(clock) {}
  // sqlite3_busy_handler: waits on the clock, a little longer each time, for up to kBusyTimeout.
  static int OnBusy(void* connection, int count);

  sqlite3* const db_;
  Clock* const clock_;
  absl::Time busy_since_;  // when the current statement first found the database busy
  // Prepared statements by their (constant) SQL text's address; finalized by the destructor.
  std::map<const char*, sqlite3_stmt*> statements_;
};

}  // namespace minions::sqlite_store
