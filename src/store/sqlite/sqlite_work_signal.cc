#include "store/sqlite/sqlite_work_signal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace minions {

absl::StatusOr<std::unique_ptr<SqliteWorkSignal>> SqliteWorkSignal::Open(const std::string& database_path,
                                                                         absl::Duration poll) {
  const std::string path = CounterPath(database_path);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open '", path, "': ", std::strerror(errno)));
  std::unique_ptr<SqliteWorkSignal> signal(new SqliteWorkSignal(path, fd, poll));
  absl::MutexLock lock(&signal->mu_);
  signal->seen_ = signal->Read();
  return signal;
}

SqliteWorkSignal::~SqliteWorkSignal() {
  Stop();
  ::close(fd_);
}

uint64_t SqliteWorkSignal::Read() const {
  uint64_t value = 0;
  if (::pread(fd_, &value, sizeof value, 0) != static_cast<ssize_t>(sizeof value)) return 0;
  return value;
}

absl::Status SqliteWorkSignal::Announce() {
  if (::flock(fd_, LOCK_EX) != 0) return absl::InternalError(absl::StrCat("cannot lock ", path_));
  const uint64_t next = Read() + 1;
  const bool written = ::pwrite(fd_, &next, sizeof next, 0) == static_cast<ssize_t>(sizeof next);
  ::flock(fd_, LOCK_UN);
  if (!written) return absl::InternalError(absl::StrCat("cannot write ", path_, ": ", std::strerror(errno)));
  absl::MutexLock lock(&mu_);
  // Our own step is no news to our watcher; a step of another process in between still is.
  if (seen_ + 1 == next) seen_ = next;
  return absl::OkStatus();
}

absl::Status SqliteWorkSignal::Start(std::function<void()> on_work) {
  if (watcher_.joinable()) return absl::FailedPreconditionError("the work signal is already started");
  on_work_ = std::move(on_work);
  watcher_ = std::thread([this] { WatchLoop(); });
  return absl::OkStatus();
}

void SqliteWorkSignal::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
}

void SqliteWorkSignal::WatchLoop() {
  while (true) {
    bool changed = false;
    {
      absl::MutexLock lock(&mu_);
      // A real wait, not the Clock's: this watches another process's writes to a file.
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), poll_);
      if (stopping_) return;
      const uint64_t now = Read();
      changed = now != seen_;
      seen_ = now;
    }
    if (changed) on_work_();
  }
}

}  // namespace minions
