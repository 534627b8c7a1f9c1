#include "store/postgres/postgres_watchdog_lock.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "store/postgres/pg_connection.h"
#include "store/postgres/postgres_statements.h"

namespace minions {

using postgres_store::CheckConninfo;
using postgres_store::Params;
using postgres_store::PgResult;
namespace sql = postgres_store::sql;

absl::StatusOr<std::unique_ptr<PostgresWatchdogLock>> PostgresWatchdogLock::TryAcquire(const std::string& conninfo) {
  RETURN_IF_ERROR(CheckConninfo(conninfo));
  auto connection = std::make_unique<Connection>(conninfo);
  RETURN_IF_ERROR(connection->EnsureConnected());
  ASSIGN_OR_RETURN(PgResult got, connection->Exec(sql::kTryWatchdogLock, Params().Int(kLockClass)));
  if (!got.Bool(0, 0)) {
    return absl::UnavailableError(
        absl::StrCat("another watchdog holds the PostgreSQL advisory lock of this store (", kLockClass,
                     ", hashtext of its schema)"));
  }
  return std::unique_ptr<PostgresWatchdogLock>(new PostgresWatchdogLock(std::move(connection)));
}

PostgresWatchdogLock::PostgresWatchdogLock(std::unique_ptr<Connection> connection)
    : connection_(std::move(connection)) {}

PostgresWatchdogLock::~PostgresWatchdogLock() {
  absl::MutexLock lock(&mu_);
  // Unlocking first makes the release immediate (closing alone releases it once the server has
  // noticed); a dead process gets the second.
  if (!connection_->Broken()) (void)connection_->Exec(sql::kWatchdogUnlock, Params().Int(kLockClass));
  connection_->Close();
}

absl::Status PostgresWatchdogLock::Check() {
  absl::MutexLock lock(&mu_);
  if (!lost_.ok()) return lost_;
  // The session is the lock: the connection never reconnects by itself, so a live connection
  // still holds it.
  absl::StatusOr<PgResult> alive = connection_->Exec(sql::kPing);
  if (!alive.ok() || connection_->Broken()) {
    lost_ = absl::UnavailableError(absl::StrCat("the watchdog lock was lost with its connection: ",
                                                alive.ok() ? "connection broken" : alive.status().message()));
    connection_->Close();  // whatever is left of the session goes, and the lock with it
  }
  return lost_;
}

}  // namespace minions
