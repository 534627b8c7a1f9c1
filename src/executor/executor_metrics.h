#pragma once
// ExecutorMetrics: what one executor exports on its own optional /metrics port (the server's
// /metrics shows the fleet; this shows the machine): its availability state, its runner's memory
// (resident set of the runner process, read at scrape time) and how long it takes to yield the
// machine when the owner comes back.
//
// The agent reports through the setters; nothing here knows the agent, so availability detection
// (owner present / away) and the agent loop can call it from wherever the event happens.
//
// Ownership: owns its registry and, after Serve(), an HTTP server.
// Threads: setters from any thread; Serve/Stop from the owning thread.

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "http/http_server.h"
#include "metrics/metrics.h"
#include "model/types.h"

namespace minions {

class ExecutorMetrics {
 public:
  ExecutorMetrics();
  ~ExecutorMetrics();

  // The state the executor reports to the server, and why (owner present, draining, ...).
  void SetState(ExecutorState state, const std::string& reason = "");
  // Owner came back -> the runner stopped using the machine.
  void ObserveYieldSeconds(double seconds);
  // The runner process now running (0: none). Its memory is read at each scrape.
  void SetRunnerPid(pid_t pid) { runner_pid_ = pid; }
  void TaskCompleted() { tasks_completed_->Increment(); }

  metrics::Registry& registry() { return registry_; }
  // Serves /metrics and /healthz on `listen` ("127.0.0.1:0" picks a port).
  absl::Status Serve(const std::string& listen);
  int port() const { return http_ ? http_->port() : 0; }

 private:
  void Collect(std::vector<metrics::FamilySnapshot>* out);

  metrics::Registry registry_;
  metrics::Family<metrics::Gauge>* state_;
  metrics::Histogram* yield_seconds_;
  metrics::Counter* tasks_completed_;
  std::atomic<pid_t> runner_pid_{0};
  std::unique_ptr<HttpServer> http_;
};

// Resident memory of a process in bytes (Linux /proc); NotFound when it is gone or unknown.
absl::StatusOr<int64_t> ResidentBytes(pid_t pid);

}  // namespace minions
