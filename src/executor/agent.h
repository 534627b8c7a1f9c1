#pragma once
// ExecutorAgent: the executor's main loop. Registers, leases a task when it has room, fetches the
// task's input range, drives its runner (kept alive between tasks, so a model loads once),
// uploads the output, and completes. A heartbeat thread renews the lease every third of its TTL,
// reports progress, and acts on the answer: cancel a task, drain, register again.
//
// Both sides enforce the lease: when the agent cannot renew it for a whole TTL it kills its own
// runner, because by then the task belongs to someone else.
//
// Ownership: owns its runner process, its control-plane client and blob client.
// Threads: Run() on one thread (the "main" thread below); Drain()/Stop() from any thread; an
// internal heartbeat thread.

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
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
  absl::Duration idle_poll = absl::Milliseconds(200);  // lease polling while idle
  // CPU threads for the runner when the job does not say; 0: the runner's default (all cores).
  // Several executors on one machine must split the cores, or their threads fight.
  int runner_threads = 0;
};

class ExecutorAgent {
 public:
  ExecutorAgent(AgentOptions options, std::unique_ptr<ControlPlaneClient> client,
                std::unique_ptr<BlobClient> blobs, Clock* clock);
  ~ExecutorAgent();

  // Serves until drained (current task finished) or stopped (current task handed back).
  absl::Status Run();
  // Finish the current task, take no more, return from Run().
  void Drain();
  // Hand the current task back now (as preempted: it does not count as a failure) and return.
  void Stop();

  std::string id() const;
  int64_t tasks_completed() const { return tasks_completed_; }

 private:
  struct ActiveTask {
    v1::TaskLease lease;
    std::string batch;
    std::atomic<int64_t> records_done{0};
    std::atomic<int64_t> records_failed{0};
    std::atomic<bool> cancelled{false};   // the server said stop (job cancelled, lease gone)
    std::atomic<bool> lease_lost{false};  // we could not renew the lease in time
  };

  absl::Status Register();
  void HeartbeatLoop();
  void RunTask(const v1::TaskLease& lease);
  // Starts the runner if it is not running; loads the model.
  absl::Status PrepareRunner(const v1::TaskLease& lease);
  void Report(const std::shared_ptr<ActiveTask>& task, absl::Status outcome, FailureClass failure);
  void KillRunner(const char* why);

  AgentOptions options_;
  std::unique_ptr<ControlPlaneClient> client_;
  std::unique_ptr<BlobClient> blobs_;
  Clock* clock_;

  std::atomic<bool> drain_{false};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> tasks_completed_{0};
  std::atomic<int64_t> ttl_ms_{9000};

  mutable std::mutex mu_;
  std::string id_;                          // guarded by mu_
  std::shared_ptr<ActiveTask> active_;      // guarded by mu_
  std::unique_ptr<RunnerProcess> runner_;   // replaced only by the main thread, under mu_
  std::string loaded_model_;                // main thread only

  std::thread heartbeat_;
  std::atomic<bool> heartbeat_stop_{false};
};

}  // namespace minions
