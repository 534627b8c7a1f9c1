#pragma once
// AvailabilityController: the owner's side of an executor. A thread samples the probes, asks the
// pure policy what to do, and sets the WorkMode the agent's main loop obeys: run, throttle,
// pause (stop feeding the runner; SIGSTOP after a grace), release (end the runner so its memory
// returns), stop (hand the tasks back as preempted). It also serves the owner's hand controls
// (pause, resume, "I am here") and the status they print.
//
// Ownership: owns the sampler (and its probes), the policy state and the sleep guard; borrows
// the agent through WorkTarget.
// Threads: Start() runs the sampling thread; every public method is safe from any thread, except
// Attach() and OnChange(), which come before Start(). One decision (Tick) at a time.

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "availability/policy.h"
#include "availability/probe.h"
#include "availability/sampler.h"
#include "availability/sleep_guard.h"
#include "common/clock.h"

namespace minions {

// What the agent may do with the machine right now.
enum class WorkMode { kRun, kThrottle, kPause, kRelease, kStop };
const char* WorkModeName(WorkMode mode);

// The agent as the controller sees it (ExecutorAgent implements it).
class WorkTarget {
 public:
  virtual ~WorkTarget() = default;
  virtual bool HoldsWork() const = 0;          // tasks in hand or a runner alive
  virtual int RunnerPid() const = 0;           // 0: none
  virtual void KillRunner(const char* why) = 0;
};

// The agent's view of the controller: the mode it must obey.
class WorkGate {
 public:
  virtual ~WorkGate() = default;
  virtual WorkMode mode() const = 0;
  virtual absl::Time mode_since() const = 0;
  // The state and reason the server shows in `minions executors`.
  virtual std::string FleetState(bool holds_work) const = 0;
  virtual std::string Reason() const = 0;
  // How long a paused runner, asked to cancel its batches, may take to stop (its next decode
  // step) before it is SIGSTOPped.
  virtual absl::Duration pause_grace() const = 0;
};

struct AvailabilityOptions {
  enum class Mode { kOwner, kDedicated, kOff };
  Mode mode = Mode::kOwner;
  availability::PolicyConfig policy;
  availability::ProbeOptions probes;
  // The built-in runner stops at its next decode step (milliseconds on a CPU); the grace bounds
  // a runner that does not obey `cancel`, or a step that takes longer (a slow device): stopped
  // well within 250 ms either way (issue 41, point 6).
  absl::Duration pause_grace = absl::Milliseconds(100);
  absl::Duration tick = absl::Seconds(1);  // at least one decision this often
  // The model cache (executor/model_cache.h): the most bytes it keeps, the free disk space it
  // never takes from the owner, and how fast it may download (0: no limit).
  int64_t model_cache_bytes = int64_t{64} << 30;
  int64_t free_disk_floor_bytes = int64_t{10} << 30;
  int64_t model_download_bytes_per_second = 0;
};

// Applies one setting by name ("start_idle" = "10m", "allow_battery" = "true", "hours" =
// "22-7,12-13", "protected_apps" = "zoom,obs", "mode" = "owner|dedicated|off", ...): the one
// parser behind the TOML [availability] section, MINIONS_AVAILABILITY* variables and
// --availability-set flags. The error names the setting and what it accepts.
absl::Status ApplyAvailabilitySetting(const std::string& key, const std::string& value, AvailabilityOptions* options);
// Every setting name ApplyAvailabilitySetting knows (for messages and docs).
std::vector<std::string> AvailabilitySettingNames();

class AvailabilityController : public WorkGate {
 public:
  AvailabilityController(AvailabilityOptions options, std::vector<std::unique_ptr<availability::Probe>> probes,
                         Clock* clock);
  ~AvailabilityController() override;

  void Attach(WorkTarget* target);
  // Called whenever the mode changes (the agent wakes its main loop).
  void OnChange(std::function<void()> callback);
  void Start();
  void Shutdown();
  // One sample and decision now (the thread calls it; tests and dry runs too).
  void Tick();

  // Owner controls.
  void ManualPause();
  void ManualResume();
  void ReportActivity();
  // Phase, mode, reason, the snapshot and the last actions, for `minions executor status`.
  std::string Status() const;
  // Answers one control-channel command: pause, resume, activity, status.
  std::string HandleCommand(const std::string& command);

  // WorkGate.
  WorkMode mode() const override;
  absl::Time mode_since() const override;
  std::string FleetState(bool holds_work) const override;
  std::string Reason() const override;
  absl::Duration pause_grace() const override { return options_.pause_grace; }
  availability::Phase phase() const;

 private:
  void Loop();
  void TickLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(tick_mu_);
  // Keeps an action in the recent history (Status) and logs it; kNone is not kept.
  void Record(const availability::Decision& d, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  AvailabilityOptions options_;
  Clock* const clock_;
  const std::unique_ptr<Alarm> alarm_;  // rings the sampling thread (shutdown)
  std::function<void()> on_change_;           // set before Start()
  WorkTarget* target_ = nullptr;              // set before Start()

  absl::Mutex tick_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one decision at a time
  availability::Sampler sampler_ ABSL_GUARDED_BY(tick_mu_);
  availability::SleepGuard sleep_guard_ ABSL_GUARDED_BY(tick_mu_);

  mutable absl::Mutex mu_;
  availability::PolicyState state_ ABSL_GUARDED_BY(mu_);
  availability::Snapshot snapshot_ ABSL_GUARDED_BY(mu_);  // the last one
  WorkMode mode_ ABSL_GUARDED_BY(mu_) = WorkMode::kRelease;
  absl::Time mode_since_ ABSL_GUARDED_BY(mu_);
  std::string reason_ ABSL_GUARDED_BY(mu_) = "starting";
  std::deque<std::string> history_ ABSL_GUARDED_BY(mu_);  // the last actions, newest last

  std::thread thread_;
  std::atomic<bool> stop_{false};
};

}  // namespace minions
