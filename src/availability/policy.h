#pragma once
// Policy: when an executor may use its machine. A pure function of (snapshot, state, now): no I/O,
// no clock reads, so every rule is a table test (tests/availability/policy_test.cc). The rules
// and their defaults are in /work/shared/design/owner-availability.md and docs/availability.md.
//
// The owner's activity always wins: unknown signals count against starting (fail closed); a
// signal that becomes unknown while running pauses the work.
//
// Threads: PolicyConfig and PolicyState are values; Decide() is reentrant.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "availability/snapshot.h"

namespace minions::availability {

struct PolicyConfig {
  // Dedicated machine: signals this machine cannot give (no console, no probes) do not block;
  // the ones it gives (owner activity, thermal, ...) still act. Default: an owner's machine.
  bool dedicated = false;
  absl::Duration start_idle = absl::Minutes(10);         // input idle before starting
  absl::Duration start_idle_locked = absl::Minutes(2);   // ... when locked, display asleep, or no console user
  absl::Duration resume_idle = absl::Minutes(5);         // input idle before resuming paused work
  absl::Duration min_paused = absl::Seconds(10);         // paused at least this long before resuming
  double start_max_other_cpu = 0.25;                     // others' CPU share allowed at start
  double pause_other_cpu = 0.50;                         // pause when others use more than this ...
  absl::Duration pause_other_cpu_for = absl::Minutes(2); // ... for this long
  double start_max_other_gpu = 0.10;
  double pause_other_gpu = 0.30;
  absl::Duration pause_other_gpu_for = absl::Seconds(5);
  absl::Duration release_after = absl::Seconds(60);      // paused this long: end the runner
  absl::Duration stop_after = absl::Minutes(10);         // paused this long: hand the work back
  absl::Duration stop_after_large = absl::Minutes(2);    // ... when the work holds a large share of RAM
  double large_memory_share = 0.25;
  double max_memory_share = 1.0;                         // stop when the runner holds more than this share
  absl::Duration kill_after = absl::Seconds(30);         // stop not acknowledged: kill the runner
  absl::Duration backoff_initial = absl::Minutes(5);     // wait after a stop before starting again
  absl::Duration backoff_max = absl::Minutes(60);
  absl::Duration backoff_reset = absl::Hours(1);         // clean running that forgets past stops
  bool allow_battery = false;
  double battery_start_percent = 80;
  double battery_stop_percent = 50;
  // Hours of the local day work may run, as [from, to) pairs (e.g. {{22, 7}} wraps midnight).
  // Empty: any hour.
  std::vector<std::pair<int, int>> hours;
  absl::TimeZone time_zone = absl::UTCTimeZone();
  std::vector<std::string> protected_apps;               // process names (the probe looks for them)

  // Checks ranges; the message names the setting.
  absl::Status Validate() const;
};

enum class Phase {
  kWaiting,   // no work allowed (owner around, or never started); takes no tasks
  kRunning,   // may lease and run tasks
  kPaused,    // runner stopped at a batch boundary (or SIGSTOP); tasks kept
  kReleased,  // paused and the runner ended (memory returned); tasks kept
  kStopping,  // tasks are being handed back (preempted)
};
const char* PhaseName(Phase p);

enum class Action { kNone, kStart, kPause, kResume, kRelease, kStop, kKill, kThrottle, kUnthrottle };
const char* ActionName(Action a);

// What the policy remembers between decisions (owned by the caller, updated from Decision).
struct PolicyState {
  Phase phase = Phase::kWaiting;
  absl::Time phase_since = absl::InfinitePast();
  absl::Time paused_since = absl::InfinitePast();   // first pause of this episode (kept through release)
  absl::Time running_since = absl::InfinitePast();  // start of the current clean run
  bool started_short = false;   // started on the short (locked / display asleep / no console) threshold
  bool throttled = false;
  bool manual_pause = false;    // the owner paused by hand; only a manual resume clears it
  bool holds_work = false;      // the executor holds tasks or a runner (filled by the caller)
  double memory_share = 0;      // share of RAM its runner holds (filled by the caller)
  // Hysteresis timers: since when another process has used the CPU / GPU over the pause limit.
  absl::Time other_cpu_high_since = absl::InfinitePast();
  absl::Time other_gpu_high_since = absl::InfinitePast();
  // Restart backoff.
  absl::Duration backoff = absl::ZeroDuration();
  absl::Time backoff_until = absl::InfinitePast();
};

struct Decision {
  Action action = Action::kNone;
  std::string reason;   // why, in words for the owner ("keyboard or mouse used 3 s ago")
  PolicyState next;     // the state after the action
};

Decision Decide(const PolicyConfig& config, const Snapshot& snapshot, const PolicyState& state, absl::Time now);

// The executor state the server shows (available, busy, owner_active, draining) for a phase.
const char* FleetState(Phase phase, bool holds_work);

}  // namespace minions::availability
