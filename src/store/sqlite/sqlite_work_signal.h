#pragma once
// SqliteWorkSignal: the WorkSignal (store/work_signal.h) of a SQLite store, for the rare case of
// several servers on one database file: a change counter in a file next to it
// (<database>.work). Announce increments it under an flock; one thread per process reads it
// every `poll` (a pread of 8 bytes: no SQL, no database lock) and reports a change made by
// another process. A single server on the file never hears anything (it wakes its own waiters
// directly), and pays a pread per `poll`.
// Threads: Announce from any thread; Start once; the watcher runs on its own thread; Stop from
// the owner.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "store/work_signal.h"

namespace minions {

class SqliteWorkSignal : public WorkSignal {
 public:
  static std::string CounterPath(const std::string& database_path) { return database_path + ".work"; }
  static absl::StatusOr<std::unique_ptr<SqliteWorkSignal>> Open(const std::string& database_path,
                                                                absl::Duration poll = absl::Milliseconds(100));
  ~SqliteWorkSignal() override;

  absl::Status Announce() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Start(std::function<void()> on_work) override;
  void Stop() override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  SqliteWorkSignal(std::string path, int fd, absl::Duration poll) : path_(std::move(path)), fd_(fd), poll_(poll) {}
  // The counter as the file holds it (0 for an empty file).
  uint64_t Read() const;
  void WatchLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string path_;
  const int fd_;
  const absl::Duration poll_;
  std::function<void()> on_work_;
  std::thread watcher_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t seen_ ABSL_GUARDED_BY(mu_) = 0;  // the counter as this process last knew it
};

}  // namespace minions
