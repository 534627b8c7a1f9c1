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
// Server restarts: when no heartbeat gets through for a whole TTL the agent keeps running (the
// server may be restarting); the first heartbeat that gets through re-attaches the leases that are
// still its own and cancels the others. Every report is fenced by its attempt, so work that was
// given to someone else meanwhile never reaches the results.
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
#include "executor/executor_metrics.h"
#include "executor/model_access.h"
#include "executor/runner_sandbox.h"
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
  // Checkpoints: a task's finished records are uploaded as a chunk every `checkpoint_records`
  // records or `checkpoint_interval`, whichever comes first, and committed by the next heartbeat.
  // A lost attempt costs at most one chunk (plus a heartbeat) of work.
  int64_t checkpoint_records = 50;
  absl::Duration checkpoint_interval = absl::Seconds(30);
  // Poison records: runner crashes one task may cause while its records are isolated, before the
  // attempt is given up as a retryable failure (the machine, not a record, is then the suspect).
  int max_crashes_per_task = 24;
  ExecutorMetrics* metrics = nullptr;        // observability hooks; null: none (not owned)
  // Where models may be loaded from (executor/model_access.h); null: nowhere, every load refused.
  std::shared_ptr<const ModelAccess> models;
  // How the runner is started: the command is wrapped in the platform's sandbox and an empty
  // environment (executor/runner_sandbox.h); null: as it is (tests that drive a fake runner).
  std::shared_ptr<const RunnerSandbox> sandbox;
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
    std::string key;                      // "job/index#attempt"; the key of active_
    std::string batch;                    // the runner batch running it now; guarded by mu_
    std::vector<std::string> records;     // every record of the task
    std::vector<std::optional<Json>> outputs;
    int64_t resume_from = 0;              // records [0, resume_from) were committed by earlier attempts
    bool in_runner = false;               // main thread only
    absl::Time started;                   // main thread only
    // Main thread only: which records the running batch holds (runner index -> record index).
    std::vector<size_t> batch_records;
    int runs = 0;                         // batches started, for unique batch ids
    // Checkpoints. Main thread only, except `chunks` (guarded by mu_; the heartbeat reports it).
    std::vector<v1::Chunk> chunks;        // uploaded by this attempt, in order
    int64_t chunk_begin = 0;              // first record not in an uploaded chunk
    int64_t prefix_end = 0;               // records [0, prefix_end) all have an output
    absl::Time last_chunk_at;
    // Poison records (main thread only): after the runner died under this task, it runs alone, and
    // the records still to run wait here in groups, halved on every crash until a lone record
    // that still crashes is reported as an error record.
    bool suspect = false;
    std::deque<std::vector<size_t>> isolation;
    int crashes = 0;
    std::atomic<int64_t> records_done{0};
    std::atomic<int64_t> records_failed{0};
    std::atomic<bool> cancelled{false};   // the server said stop (job cancelled, lease gone)
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
  // Records of the task that have no output yet (in record order).
  std::vector<size_t> Unfinished(const TaskPtr& task) const;
  // Uploads the finished prefix as a chunk when one is due (or `final`: everything left).
  absl::Status MaybeCheckpoint(const TaskPtr& task, bool final);
  // The runner died under `task`: isolate its records (see ActiveTask::isolation). Returns false
  // when the attempt is given up.
  bool Isolate(const TaskPtr& task, bool ran_alone, const absl::Status& why);
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
  std::map<std::string, TaskPtr> active_;       // by task key; guarded by mu_
  std::unique_ptr<RunnerProcess> runner_;       // replaced only by the main thread, under mu_

  // Main thread only.
  std::deque<TaskPtr> staged_;                  // leased and fetched, not yet in the runner
  std::map<std::string, TaskPtr> batches_;      // runner batch id -> task, for tasks in the runner
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
  bool yield_observed_ = false;                 // since the owner last took the machine
  void ObserveYield(absl::Time now);
  absl::Time next_throttle_toggle_ = absl::InfinitePast();

  std::thread heartbeat_;
  std::atomic<bool> heartbeat_stop_{false};
  bool detached_ = false;                       // heartbeat thread only: the server has been away a TTL
  std::atomic<bool> killed_on_purpose_{false};  // KillRunner: the runner's death is no crash
  std::atomic<bool> heartbeat_now_{false};      // a chunk waits to be committed: beat now
  absl::Time last_commit_wake_ = absl::InfinitePast();  // main thread only
};

}  // namespace minions
