#pragma once
// PostgresWorkSignal: the WorkSignal (store/work_signal.h) of a PostgreSQL store: NOTIFY on a
// channel named after the store's schema, LISTENed to on a connection of its own by one thread
// per process. An idle LISTEN connection costs the database nothing but a backend: no statements
// run while nothing is announced. Announcements carry this object's random id, so a process
// ignores its own. After reconnecting the listener reports a wake-up, since it may have missed
// announcements while it was away.
// Threads: Announce from any thread (one connection, serialised); Start once; the listener runs
// on its own thread; Stop from the owner.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "store/work_signal.h"

typedef struct pg_conn PGconn;

namespace minions {

class PostgresWorkSignal : public WorkSignal {
 public:
  // InvalidArgument unless `conninfo` parses; nothing connects before the first use.
  static absl::StatusOr<std::unique_ptr<PostgresWorkSignal>> Create(const std::string& conninfo);
  ~PostgresWorkSignal() override;
  PostgresWorkSignal(const PostgresWorkSignal&) = delete;
  PostgresWorkSignal& operator=(const PostgresWorkSignal&) = delete;

  absl::Status Announce() override;
  absl::Status Start(std::function<void()> on_work) override;
  void Stop() override;

  // Announcements this process's listener has seen from others (tests, metrics).
  int64_t announcements_seen() const { return seen_.load(); }

 private:
  explicit PostgresWorkSignal(std::string conninfo);
  void ListenLoop();
  // Connects `conn` (closing what was there) and answers the channel of its schema.
  absl::StatusOr<std::string> Connect(PGconn*& conn);

  const std::string conninfo_;
  const std::string id_;  // the payload of this process's announcements
  absl::Mutex announce_mu_;
  PGconn* announcer_ ABSL_GUARDED_BY(announce_mu_) = nullptr;
  std::string channel_ ABSL_GUARDED_BY(announce_mu_);
  std::function<void()> on_work_;
  std::thread listener_;
  int wake_pipe_[2] = {-1, -1};  // Stop writes a byte: the listener's poll returns
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> seen_{0};
};

}  // namespace minions
