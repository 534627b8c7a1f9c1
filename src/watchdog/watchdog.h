#pragma once
// Watchdog: the reaping loops. Requeues tasks whose lease expired (the next attempt resumes them
// elsewhere), fails them after max_attempts, declares executors lost after missed heartbeats, and
// expires jobs whose completion window has passed.
// Exactly one watchdog should be active per store: WatchdogLock elects it (a file lock for SQLite;
// PostgreSQL uses an advisory lock). Tick() is pure store work with `now` passed in, so tests
// drive it with a fake clock; WatchdogLoop runs it on a real one.

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "metrics/metrics.h"
#include "store/metadata_store.h"
#include "watchdog/stragglers.h"

namespace minions {

struct WatchdogOptions {
  absl::Duration interval = absl::Milliseconds(500);
  absl::Duration job_sweep_interval = absl::Seconds(2);  // deadlines and stragglers
  absl::Duration executor_timeout = absl::Seconds(30);  // no heartbeat for this long: lost
  int batch = 500;                                      // leases expired per pass
  // After the watchdog becomes active, leases are not expired nor executors declared lost for
  // this long: when the control plane was down (a restart), executors need a heartbeat to
  // re-attach their leases before they are judged: a heartbeat interval plus the time a client
  // takes to reconnect. The server and `minions watchdog` use two lease TTLs.
  absl::Duration takeover_grace = absl::ZeroDuration();
  StragglerPolicy stragglers;                // backups for tasks far slower than their peers
  bool backups = true;
  // A job validates inside its SubmitJob call; one still validating this long after it was
  // created lost its server mid-way (a crash, a restart) and would wait for ever: it is failed,
  // with that reason. Far longer than validating the largest input takes.
  absl::Duration validation_timeout = absl::Minutes(30);
};

struct WatchdogPass {
  int leases_expired = 0;
  int tasks_failed = 0;       // expiry that exhausted max_attempts
  int executors_lost = 0;
  int jobs_expired = 0;       // completion window passed
  int jobs_orphaned = 0;      // still validating after validation_timeout: failed
  bool in_grace = false;      // the takeover grace held back lease expiry and lost executors
  int backups_requested = 0;  // stragglers given a backup attempt
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
  absl::Status BackUpStragglers(const Job& job, absl::Time now, WatchdogPass& pass);
  absl::Status FailOrphanedValidation(const Job& job, absl::Time now, WatchdogPass& pass);

  MetadataStore* store_;
  WatchdogOptions options_;
  std::optional<absl::Time> active_since_;  // the first Tick
  absl::Time last_job_sweep_ = absl::InfinitePast();
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
