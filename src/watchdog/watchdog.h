#pragma once
// Watchdog: the reaping loops. Requeues tasks whose lease expired (the next attempt resumes them
// elsewhere), fails them after max_attempts, declares executors lost after missed heartbeats, and
// expires jobs whose completion window has passed.
// Exactly one watchdog may be active per store: the store's WatchdogLock (store/watchdog_lock.h)
// elects it. The watchdog holds that lock and checks it before every pass: a lost lock stops it at
// once (another process may be the watchdog already) until it is given a new one (Resume).
// Tick() is store work with `now` passed in, so tests drive it with a fake clock; the server's
// background loop and `minions watchdog` run it on a real one.
// Threads: one thread at a time (whoever runs the passes).

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "metrics/metrics.h"
#include "store/metadata_store.h"
#include "store/watchdog_lock.h"
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
  // `lock`: the store's watchdog lock, acquired by the caller.
  Watchdog(MetadataStore* store, WatchdogOptions options, std::unique_ptr<WatchdogLock> lock)
      : store_(store), options_(options), lock_(std::move(lock)) {}

  // One pass, after checking that this process still holds the lock. FailedPrecondition when it
  // does not (the pass did nothing): the first time, the lock has just been found lost and is
  // dropped; every later pass answers the same until Resume.
  absl::StatusOr<WatchdogPass> Tick(absl::Time now);
  // Whether it holds its lock, as of the last pass.
  bool active() const { return lock_ != nullptr; }
  // A lock acquired again after a loss: passes act again, after the takeover grace (executors
  // get time to re-attach their leases, as after any takeover).
  void Resume(std::unique_ptr<WatchdogLock> lock);
  const WatchdogOptions& options() const { return options_; }
  // Counts expired leases and every action of later passes in `registry` (which must outlive
  // this watchdog). Call once, before the first Tick.
  void ExportMetrics(metrics::Registry* registry);

 private:
  absl::Status BackUpStragglers(const Job& job, absl::Time now, WatchdogPass& pass);
  absl::Status FailOrphanedValidation(const Job& job, absl::Time now, WatchdogPass& pass);

  MetadataStore* store_;
  WatchdogOptions options_;
  std::unique_ptr<WatchdogLock> lock_;      // null once lost
  std::optional<absl::Time> active_since_;  // the first Tick with this lock
  absl::Time last_job_sweep_ = absl::InfinitePast();
  metrics::Counter* leases_expired_ = nullptr;            // null: not exported
  metrics::Family<metrics::Counter>* actions_ = nullptr;
};

}  // namespace minions
