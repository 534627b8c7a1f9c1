#pragma once
// Watchdog: the reaping loops. Requeues tasks whose lease expired (the next attempt resumes them
// elsewhere), fails them after max_attempts, and declares executors lost after missed heartbeats.
// Exactly one watchdog should be active per store: WatchdogLock elects it (a file lock for SQLite;
// PostgreSQL uses an advisory lock). Tick() is pure store work with `now` passed in, so tests
// drive it with a fake clock; WatchdogLoop runs it on a real one.

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "metrics/metrics.h"
#include "store/metadata_store.h"

namespace minions {

struct WatchdogOptions {
  absl::Duration interval = absl::Milliseconds(500);
  absl::Duration executor_timeout = absl::Seconds(30);  // no heartbeat for this long: lost
  int batch = 500;                                      // leases expired per pass
};

struct WatchdogPass {
  int leases_expired = 0;
  int tasks_failed = 0;       // expiry that exhausted max_attempts
  int executors_lost = 0;
  std::vector<std::string> jobs_touched;  // jobs whose tasks changed (may now need finalising)
};

class Watchdog {
 public:
  Watchdog(MetadataStore* store, WatchdogOptions options) : store_(store), options_(options) {}
  absl::StatusOr<WatchdogPass> Tick(absl::Time now);
  const WatchdogOptions& options() const { return options_; }
  // Counts expired leases and every action of later passes in `registry` (which must outlive
  // this watchdog). Call once, before the first Tick.
  void ExportMetrics(metrics::Registry* registry);

 private:
  MetadataStore* store_;
  WatchdogOptions options_;
  metrics::Counter* leases_expired_ = nullptr;            // null: not exported
  metrics::Family<metrics::Counter>* actions_ = nullptr;
};

// Holds an exclusive lock on a file while alive; the process that holds it runs the watchdog.
// The lock goes with the process, so when it dies another process takes over.
class WatchdogLock {
 public:
  // Unavailable if another process holds it.
  static absl::StatusOr<std::unique_ptr<WatchdogLock>> TryAcquire(const std::string& path);
  ~WatchdogLock();

 private:
  explicit WatchdogLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace minions
