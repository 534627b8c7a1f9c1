#include "store/sqlite/sqlite_watchdog_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace minions {

absl::StatusOr<std::unique_ptr<SqliteWatchdogLock>> SqliteWatchdogLock::TryAcquire(const std::string& database_path) {
  const std::string path = LockPath(database_path);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open lock file '", path, "': ", std::strerror(errno)));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("another watchdog is active (it holds ", path, ")"));
  }
  struct stat locked;
  if (::fstat(fd, &locked) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat lock file '", path, "': ", std::strerror(error)));
  }
  return std::unique_ptr<SqliteWatchdogLock>(new SqliteWatchdogLock(path, fd, locked.st_dev, locked.st_ino));
}

SqliteWatchdogLock::~SqliteWatchdogLock() { ::close(fd_); }

absl::Status SqliteWatchdogLock::Check() {
  absl::MutexLock lock(&mu_);
  if (!lost_.ok()) return lost_;
  // The flock lives as long as the descriptor; what can go is the file behind the path.
  struct stat now;
  if (::stat(path_.c_str(), &now) != 0 || now.st_dev != device_ || now.st_ino != inode_) {
    lost_ = absl::UnavailableError(
        absl::StrCat("the watchdog lock was lost: ", path_, " is no longer the file this process locked"));
  }
  return lost_;
}

}  // namespace minions
