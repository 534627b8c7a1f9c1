#include "store/sqlite/sqlite_connection.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "common/status_macros.h"

namespace minions::sqlite_store {
namespace {

// The waits between tries while busy (then the last, again and again): SQLite's own schedule.
constexpr int kBusyDelaysMs[] = {1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100};

}  // namespace

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(const std::string& path, Clock* clock) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status error = absl::UnavailableError(
        absl::StrCat("cannot open metadata store ", path, ": ", db ? sqlite3_errmsg(db) : sqlite3_errstr(rc)));
    sqlite3_close_v2(db);
    return error;
  }
  std::unique_ptr<Connection> connection(new Connection(db, clock));
  sqlite3_extended_result_codes(db, 1);
  // The busy handler first: switching to WAL itself may wait for another process.
  sqlite3_busy_handler(db, &Connection::OnBusy, connection.get());
  // WAL lets readers and one writer of several processes work at once; NORMAL synchronisation is
  // durable across application crashes (a power cut may lose the last transactions, never corrupt
  // the file). ":memory:" databases stay in "memory" journal mode.
  RETURN_IF_ERROR(connection->Exec("PRAGMA journal_mode = WAL"));
  RETURN_IF_ERROR(connection->Exec("PRAGMA synchronous = NORMAL"));
  RETURN_IF_ERROR(connection->Exec("PRAGMA foreign_keys = ON"));
  return connection;
}

Connection::~Connection() {
  for (auto& [sql, stmt] : statements_) sqlite3_finalize(stmt);
  sqlite3_close_v2(db_);
}

int Connection::OnBusy(void* arg, int count) {
  auto* connection = static_cast<Connection*>(arg);
  const absl::Time now = connection->clock_->Now();
  if (count == 0) connection->busy_since_ = now;
  if (now - connection->busy_since_ >= kBusyTimeout) return 0;  // give up: SQLITE_BUSY
  const int n = static_cast<int>(std::size(kBusyDelaysMs));
  connection->clock_->SleepFor(absl::Milliseconds(kBusyDelaysMs[std::min(count, n - 1)]));
  return 1;
}

absl::StatusOr<Statement> Connection::Prepare(const char* sql) {
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    sqlite3_stmt* stmt = nullptr;
    int rc = sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
    if (rc != SQLITE_OK) return SqliteError(db_, rc, absl::StrCat("prepare ", Excerpt(sql, 60)));
    it = statements_.emplace(sql, stmt).first;
  }
  return Statement(db_, it->second);
}

absl::Status Connection::Exec(const char* sql) {
  int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, Excerpt(sql, 60));
  return absl::OkStatus();
}

}  // namespace minions::sqlite_store
