#pragma once
// SqliteWatchdogLock: the watchdog's lock for a SQLite store: an exclusive flock on the file
// "<database>.watchdog.lock", held while this object lives. The lock goes with the process, so
// when it dies another process takes over. Check() also makes sure that the file at that path is
// still the one locked: a lock file removed (or replaced) would let a second process lock a new
// one. The contract: store/watchdog_lock.h.
// Threads: thread-safe.

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "store/watchdog_lock.h"

namespace minions {

class SqliteWatchdogLock : public WatchdogLock {
 public:
  // The lock of the store in `database_path`. Unavailable if another process holds it; Internal
  // if the lock file cannot be opened.
  static absl::StatusOr<std::unique_ptr<SqliteWatchdogLock>> TryAcquire(const std::string& database_path);
  ~SqliteWatchdogLock() override;
  SqliteWatchdogLock(const SqliteWatchdogLock&) = delete;
  SqliteWatchdogLock& operator=(const SqliteWatchdogLock&) = delete;

  absl::Status Check() override ABSL_LOCKS_EXCLUDED(mu_);

  // The lock file of the store in `database_path`.
  static std::string LockPath(const std::string& database_path) { return database_path + ".watchdog.lock"; }

 private:
  SqliteWatchdogLock(std::string path, int fd, dev_t device, ino_t inode)
      : path_(std::move(path)), fd_(fd), device_(device), inode_(inode) {}
  const std::string path_;
  const int fd_;
  const dev_t device_;  // of the file locked
  const ino_t inode_;
  absl::Mutex mu_;
  absl::Status lost_ ABSL_GUARDED_BY(mu_);  // once not OK, for good
};

}  // namespace minions
