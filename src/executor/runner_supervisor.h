#pragma once
// RunnerSupervisor: the executor's runner process — which runner program runs (the built-in
// "llama" or one its owner declared), the TCP ports its sandbox lets it reach, which model it has
// (or loads) and since when it loads, how many runners were started, whether it is hung
// (RunnerWatch) or stopped for the owner (SIGSTOP), and the gang tunnels that live and die with
// it. It starts, loads, feeds, freezes and ends the runner as the agent says; it decides nothing
// about tasks: which task's batch is in the runner, and what a runner's death costs each, are the
// agent's (executor/agent.h).
//
// Ownership: its runner factories, its runner and that runner's tunnels, under its own lock.
// Threads: the agent's main loop starts, loads, feeds, polls and ends the runner; any thread may
// ask whether one runs, its pid and model, or kill it (the availability controller, the
// heartbeat). A runner is ended (killed and reaped) outside the lock, so those callers never wait
// for a reap.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "executor/executor_metrics.h"
#include "executor/gang_tunnel.h"
#include "executor/runner_watch.h"
#include "runner/runner.h"

namespace minions {

class RunnerSupervisor {
 public:
  // The runner every executor has; a lease that names none runs there.
  static constexpr char kBuiltInRunner[] = "llama";

  struct Options {
    RunnerWatch::Options hang;  // when a runner holding work and saying nothing is hung
    absl::Duration load_timeout = absl::Minutes(10);  // a load not answered by then has failed
    ExecutorMetrics* metrics = nullptr;               // told the runner's pid; null: none
  };
  // `built_in` starts "llama"; `declared` the owner's other runners, by name. `on_event` is called
  // (on any thread) whenever the runner has something new (it rings the agent's main loop).
  RunnerSupervisor(Options options, std::unique_ptr<RunnerFactory> built_in,
                   std::map<std::string, std::shared_ptr<RunnerFactory>> declared, std::function<void()> on_event);
  ~RunnerSupervisor();
  RunnerSupervisor(const RunnerSupervisor&) = delete;
  RunnerSupervisor& operator=(const RunnerSupervisor&) = delete;

  // --- the main loop ---
  bool running() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a runner runs that has (or loads) `model` (a model key: ExecutorAgent::ModelKey).
  bool Has(const std::string& model) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the runner that runs is `name`, sandboxed for `ports`.
  bool Is(const std::string& name, const std::vector<int>& ports) const ABSL_LOCKS_EXCLUDED(mu_);
  // Runners started so far: a runner is the same one while this has not moved.
  int64_t generation() const ABSL_LOCKS_EXCLUDED(mu_);
  // Starts the runner `name` (none runs), allowed to reach `tcp_ports`; the tunnels kept
  // (KeepTunnels) admit its process.
  absl::Status Start(const std::string& name, const std::vector<int>& tcp_ports = {}) ABSL_LOCKS_EXCLUDED(mu_);
  // Gang tunnels for the next runner to reach its members through (executor/gang_tunnel.h): they
  // replace those kept (which stop), and end with the runner.
  void KeepTunnels(std::vector<std::unique_ptr<GangTunnel>> tunnels) ABSL_LOCKS_EXCLUDED(mu_);
  // Asks the runner to load `request`, as `model` (a model key), reported to the server as
  // `reported` (the digest, or the path); it loads from `now` until Loaded or LoadFailed.
  void Load(const runner_protocol::LoadRequest& request, const std::string& model, const std::string& reported,
            absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  bool loading() const ABSL_LOCKS_EXCLUDED(mu_);
  void Loaded() ABSL_LOCKS_EXCLUDED(mu_);
  // It could not load: it has no model (the next lease of that model asks again).
  void LoadFailed() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether its load has taken load_timeout.
  bool LoadTimedOut(absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);
  // Work for it (the watch counts it from `now`).
  void StartBatch(const std::string& batch, const std::vector<std::string>& records, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);
  void StartRescore(const rescore::Request& request, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  void Cancel(const std::string& batch) ABSL_LOCKS_EXCLUDED(mu_);
  // It said something of its work at `now`; `busy`: it still holds work.
  void Heard(absl::Time now, bool busy) ABSL_LOCKS_EXCLUDED(mu_);
  // Its next event (Runner::Poll); FailedPrecondition when none runs.
  absl::StatusOr<std::optional<runner_protocol::Event>> Poll() ABSL_LOCKS_EXCLUDED(mu_);
  // Hung: it holds work and has said nothing for far longer than its work takes (never while
  // frozen). How long it has been silent, and the limit it passed.
  bool Hung(absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Duration Silence(absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Duration hang_limit() const ABSL_LOCKS_EXCLUDED(mu_);
  // When it is next due a look (its hang, its load's timeout); InfiniteFuture: not on the clock.
  absl::Time NextCheck() const ABSL_LOCKS_EXCLUDED(mu_);
  // SIGSTOP (true) or SIGCONT it for the owner; a stopped runner is not hung for its silence.
  void Freeze(bool frozen, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  bool frozen() const ABSL_LOCKS_EXCLUDED(mu_);
  // Asks it to exit once it has read what was queued; Drained takes (and drops) what it still
  // says, and answers whether it has ended.
  void RequestShutdown() ABSL_LOCKS_EXCLUDED(mu_);
  bool Drained() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends it now (SIGKILL, reaped) and its tunnels; it has no model, load or watch after.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether its end was Kill's (on purpose: no crash), forgetting it.
  bool TakeKilledOnPurpose() ABSL_LOCKS_EXCLUDED(mu_);

  // --- any thread ---
  int pid() const ABSL_LOCKS_EXCLUDED(mu_);  // 0: none runs
  // What it has loaded (or loads), as reported to the server; "" when none.
  std::string model_loaded() const ABSL_LOCKS_EXCLUDED(mu_);
  // Kills it now, on purpose (its end is no crash: no record is to blame).
  void Kill(const char* why) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const Options options_;
  const std::unique_ptr<RunnerFactory> built_in_;
  const std::map<std::string, std::shared_ptr<RunnerFactory>> declared_;
  const std::function<void()> on_event_;

  mutable absl::Mutex mu_;
  std::unique_ptr<Runner> runner_ ABSL_GUARDED_BY(mu_);
  std::string name_ ABSL_GUARDED_BY(mu_);        // which runner it is
  std::vector<int> ports_ ABSL_GUARDED_BY(mu_);  // the TCP ports its sandbox lets it reach
  std::string model_ ABSL_GUARDED_BY(mu_);       // the model key it has (or loads)
  std::string reported_ ABSL_GUARDED_BY(mu_);    // that model as the server knows it
  std::optional<absl::Time> loading_since_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  RunnerWatch watch_ ABSL_GUARDED_BY(mu_);
  bool frozen_ ABSL_GUARDED_BY(mu_) = false;
  bool killed_on_purpose_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<GangTunnel>> tunnels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace minions
