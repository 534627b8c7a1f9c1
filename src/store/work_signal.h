#pragma once
// WorkSignal: tells every server on one store that work may have become leasable (a job
// submitted, a task requeued or handed back, a backup requested), so that idle executors' long
// polls wait without asking the store until something changed. Each backend makes its own
// (PostgresWorkSignal: LISTEN/NOTIFY; SqliteWorkSignal: a change counter in a file next to the
// database, read by one thread per process), with one contract:
// - Announce() reaches the watchers of every OTHER process on the store (a process wakes its own
//   waiters directly, for free); it is best-effort: a lost announcement costs latency, not work,
//   because a waiting server also looks again at the store after a while (ServerOptions::
//   idle_recheck).
// - Start(on_work) calls `on_work` on the signal's own thread for each announcement it sees, and
//   once more each time it may have missed some (it reconnected).
// Threads: Announce from any thread; Start once; Stop (or the destructor) from the owner.

#include <functional>

#include "absl/status/status.h"

namespace minions {

class WorkSignal {
 public:
  virtual ~WorkSignal() = default;
  virtual absl::Status Announce() = 0;
  virtual absl::Status Start(std::function<void()> on_work) = 0;
  virtual void Stop() = 0;
};

}  // namespace minions
