#pragma once
// WatchdogLock: the single-instance lock of a store's watchdog. Exactly one process acts as the
// watchdog of a store (expiring leases, declaring executors lost); it is the one that holds this
// lock. Each backend makes its own (SqliteWatchdogLock: a file lock next to the database;
// PostgresWatchdogLock: an advisory lock on a session of its own), with one contract
// (tests/store/watchdog_lock_contract.h):
// - TryAcquire (a static of each backend) gives the lock to one holder at a time; the others get
//   Unavailable.
// - Releasing is destroying the object; a holder that dies releases it too.
// - Check() is OK while the lock is still held. The lock can be lost behind the holder's back (its
//   database session ended, its lock file was removed): then Check() answers Unavailable, now and
//   for good, and the holder must stop acting as the watchdog at once (another may hold the lock
//   already) and acquire a new lock before it acts again. The watchdog checks before every pass.
// Threads: implementations are thread-safe.

#include "absl/status/status.h"

namespace minions {

class WatchdogLock {
 public:
  virtual ~WatchdogLock() = default;
  virtual absl::Status Check() = 0;
};

}  // namespace minions
