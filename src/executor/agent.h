#pragma once
// ExecutorAgent: the executor's main loop. Registers, leases tasks while it has room, fetches each
// task's input range, pipes the records to its runner (kept alive between tasks, so a model loads
// once), uploads each task's output, and completes it. A heartbeat thread renews every held lease
// every third of its TTL, reports progress, and acts on the answer: cancel a task, drain,
// register again.
//
// Pipelining: the agent keeps up to `prefetch` tasks in the runner at once, so the runner never
// waits for the control plane between tasks. The window adapts to task length: long tasks keep
// two (one running, one queued); tiny ones up to `max_prefetch`, each lease and completion then
// amortised over many records per second.
//
// Both sides enforce the lease: when the agent cannot renew its leases for a whole TTL it kills its
// own runner, because by then the tasks belong to someone else.
//
// Ownership: owns its runner process, its control-plane client and blob client.
// Threads: Run() on one thread (the "main" thread); Drain()/Stop() from any thread; an internal
// heartbeat thread.

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/json_util.h"
#include "executor/availability_controller.h"
#include "executor/blob_client.h"
#include "executor/control_plane_client.h"
#include "model/types.h"
#include "runner/runner_process.h"

namespace minions {

struct AgentOptions {
  std::string name;                          // shown in `minions executors`; default: host name
  std::string state_dir;                     // keeps the executor id across restarts; "" = none
  std::vector<std::string> runner_command;   // default: minions-llama-runner next to this binary
  std::string runner_log;                    // runner stderr; "" = inherit
  absl::Duration idle_poll = absl::Milliseconds(200);  // retry pause after a failed call
  absl::Duration lease_wait = absl::Seconds(1);        // long poll of an idle executor's lease
  // CPU threads for the runner when the job does not say; 0: the runner's default (all cores).
  // Several executors on one machine must split the cores, or their threads fight.
  int runner_threads = 0;
  int max_prefetch = 32;                     // most tasks held at once (tiny tasks)
  // Aim to hold this much work beyond the running task.
  absl::Duration prefetch_target = absl::Milliseconds(500);
};

class ExecutorAgent : public WorkTarget {
 public:
  ExecutorAgent(AgentOptions options, std::unique_ptr<ControlPlaneClient> client,
                std::unique_ptr<BlobClient> blobs, Clock* clock);
  ~ExecutorAgent();

  // Serves until drained (current tasks finished) or stopped (current tasks handed back).
  absl::Status Run();
  // Finish the tasks in hand, take no more, return from Run().
  void Drain();
  // Hand the tasks back now (as preempted: not counted as failures) and return.
  void Stop();

  std::string id() const;
  int64_t tasks_completed() const { return tasks_completed_; }

  // Owner first (agent_yield.cc): the agent obeys `gate`'s mode from then on; null: always run.
  // Set before Run().
  void SetWorkGate(WorkGate* gate) { gate_ = gate; }
  // WorkTarget, for the AvailabilityController (any thread).
  bool HoldsWork() const override;
  int RunnerPid() const override;
  void KillRunner(const char* why) override;

 private:
  struct ActiveTask {
    v1::TaskLease lease;
    std::string batch;
    std::vector<std::string> records;
    std::vector<std::optional<Json>> outputs;
    bool in_runner = false;               // main thread only
    absl::Time started;                   // main thread only
    std::atomic<int64_t> records_done{0};
    std::atomic<int64_t> records_failed{0};
    std::atomic<bool> cancelled{false};   // the server said stop (job cancelled, lease gone)
    std::atomic<bool> lease_lost{false};  // we could not renew the lease in time
  };
  using TaskPtr = std::shared_ptr<ActiveTask>;

  absl::Status Register();
  void HeartbeatLoop();
  // Leases more tasks when the window has room; returns how many arrived.
  int LeaseMore();
  // Fetches a new lease's input; on failure reports it and returns null.
  TaskPtr Stage(const v1::TaskLease& lease);
  // Sends staged tasks to the runner in order (loading the model when it changes, once the
  // runner has drained the previous model's tasks).
  void FeedRunner();
  absl::Status EnsureRunner();
  absl::Status LoadModel(const v1::TaskLease& lease);
  void OnEvent(const runner_protocol::Event& event);
  void FinishTask(const TaskPtr& task, const Json& batch_done);
  void OnRunnerDied(const absl::Status& why);
  // Reports an attempt that ended without success.
  void Report(const TaskPtr& task, absl::Status outcome, FailureClass failure);
  // Completes every uploaded task in one call; keeps them (and their leases, renewed by the
  // heartbeat) for the next try when the server cannot be reached.
  void FlushCompletions();
  void Forget(const TaskPtr& task);
  int PrefetchWindow() const;
  std::vector<TaskPtr> ActiveTasks() const;

  AgentOptions options_;
  std::unique_ptr<ControlPlaneClient> client_;
  std::unique_ptr<BlobClient> blobs_;
  Clock* clock_;

  std::atomic<bool> drain_{false};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> tasks_completed_{0};
  std::atomic<int64_t> ttl_ms_{9000};

  mutable std::mutex mu_;
  std::string id_;                              // guarded by mu_
  std::map<std::string, TaskPtr> active_;       // by batch id; guarded by mu_
  std::unique_ptr<RunnerProcess> runner_;       // replaced only by the main thread, under mu_

  // Main thread only.
  std::deque<TaskPtr> staged_;                  // leased and fetched, not yet in the runner
  std::vector<TaskPtr> to_complete_;            // uploaded, completion not yet accepted
  absl::Time next_completion_try_ = absl::InfinitePast();
  std::string loaded_model_;
  std::string loaded_options_;
  double avg_task_seconds_ = 1.0;               // moving average, drives the prefetch window
  absl::Time last_empty_lease_ = absl::InfinitePast();
  absl::Time next_lease_try_ = absl::InfinitePast();

  // Owner first (agent_yield.cc); main thread only, except gate_ (set before Run).
  // Applies the gate's mode; true when the loop must neither lease nor feed the runner.
  bool ApplyWorkMode();
  void SignalRunner(int sig);
  // Ends the runner; the tasks it held go back to the front of staged_ to run again later.
  void ReleaseRunner();
  // Hands every task not yet finished back to the server as preempted.
  void HandBack();
  // The state and reason the heartbeat reports (any thread).
  std::string FleetState(bool has_tasks, std::string* reason) const;
  WorkGate* gate_ = nullptr;
  bool frozen_ = false;                         // the runner is SIGSTOPped
  absl::Time next_throttle_toggle_ = absl::InfinitePast();

  std::thread heartbeat_;
  std::atomic<bool> heartbeat_stop_{false};
};

}  // namespace minions
