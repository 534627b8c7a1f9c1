#pragma once
// PostgresWatchdogLock: the watchdog's single-instance lock on a PostgreSQL database:
// pg_try_advisory_lock on a connection of its own, held for as long as this object lives.
// Releasing is closing the connection, so a watchdog process that dies (or whose connection
// breaks) releases it too; the connection never reconnects, so a live one still holds the lock.
// The contract: store/watchdog_lock.h.
// Threads: thread-safe.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "store/watchdog_lock.h"

namespace minions {
namespace postgres_store {
class Connection;  // pg_connection.h
}  // namespace postgres_store

class PostgresWatchdogLock : public WatchdogLock {
 public:
  // The advisory lock is (kLockClass, hashtext(the schema)): one watchdog per store, and stores in
  // two schemas of one database have one each.
  static constexpr int32_t kLockClass = 0x6d696e69;  // "mini"

  // Unavailable when another session holds the lock or the server cannot be reached.
  static absl::StatusOr<std::unique_ptr<PostgresWatchdogLock>> TryAcquire(const std::string& conninfo);
  ~PostgresWatchdogLock() override;
  PostgresWatchdogLock(const PostgresWatchdogLock&) = delete;
  PostgresWatchdogLock& operator=(const PostgresWatchdogLock&) = delete;

  // OK while the lock is still held: the connection is alive (a server restart ends the session
  // and with it the lock; the holder must then stop and try to acquire again).
  absl::Status Check() override;

 private:
  using Connection = postgres_store::Connection;
  explicit PostgresWatchdogLock(std::unique_ptr<Connection> connection);
  absl::Mutex mu_;
  std::unique_ptr<Connection> connection_ ABSL_GUARDED_BY(mu_);
  absl::Status lost_ ABSL_GUARDED_BY(mu_);  // once not OK, for good
};

}  // namespace minions
