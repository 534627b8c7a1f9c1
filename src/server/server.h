#pragma once
// MinionsServer: the control plane process minus main(): the gRPC services on one port, the
// HTTP port (metrics, health, the web dashboard; when options.http_listen is set), plus the
// background loop that finalises finished jobs and (when this process holds the watchdog lock)
// runs the watchdog. Holds no job state of its own; its metrics registry is per process. Owns the
// Authenticator every call goes through, and serves TLS (options.tls) on both ports; it refuses
// to serve plain text anywhere but loopback.
// Threads: Start/Shutdown from the owning thread; the services run on gRPC's threads; the
// background loop on its own thread (or, with options.background_thread off, wherever
// RunBackgroundPass is called). Every wait is on the Clock it is given.

#include <functional>
#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "blob/blob_store.h"
#include "common/clock.h"
#include "dashboard/fleet_view.h"
#include "http/http_server.h"
#include "identity/authenticator.h"
#include "identity/identity_admin.h"
#include "server/admin_service.h"
#include "metrics/metrics.h"
#include "model/progress_estimator.h"
#include "server/executor_service.h"
#include "server/job_finalizer.h"
#include "server/job_service.h"
#include "server/model_service.h"
#include "server/rpc_faults.h"
#include "server/server_metrics.h"
#include "server/server_options.h"
#include "store/metadata_store.h"
#include "store/work_signal.h"
#include "watchdog/watchdog.h"

namespace minions {

class MinionsServer {
 public:
  // `watchdog` may be null: another process runs it. A watchdog without its lock is on standby
  // (see SetWatchdogLockSource).
  MinionsServer(MetadataStore* store, BlobStore* blobs, Clock* clock, ServerOptions options,
                std::unique_ptr<Watchdog> watchdog);
  ~MinionsServer();

  // Where a watchdog on standby (it never held the lock, or lost it with the database's session:
  // a database restart, another server's failover) gets the lock again. The background loop tries
  // once per `retry` until it holds it, so some server always runs the watchdog while any serves.
  // Call before Start.
  using WatchdogLockSource = std::function<absl::StatusOr<std::unique_ptr<WatchdogLock>>()>;
  void SetWatchdogLockSource(WatchdogLockSource source, absl::Duration retry = absl::Seconds(1)) {
    watchdog_lock_source_ = std::move(source);
    watchdog_lock_retry_ = retry;
  }

  // How work submitted or requeued through this server reaches the other servers on the store,
  // and theirs this one (store/work_signal.h). Without one, this server wakes only its own
  // waiting leases (right for a server alone on its store). Call before Start.
  void SetWorkSignal(std::unique_ptr<WorkSignal> signal) {
    work_signal_ = std::move(signal);
    executor_service_.SetWorkSignal(work_signal_.get());
  }

  // More routes on the HTTP port (the OpenAI API, which apps/ wires in): `install` is called with
  // the HTTP server before it starts. Call before Start; ignored without HTTP.
  void AddHttpRoutes(std::function<void(HttpServer*)> install) { http_routes_.push_back(std::move(install)); }

  absl::Status Start();
  // The port actually bound (useful with ":0").
  int port() const { return port_; }
  std::string address() const;
  // The HTTP port actually bound; 0 when the server serves no HTTP.
  int http_port() const { return http_ ? http_->port() : 0; }
  // "http://host:port/" of the dashboard; "" without HTTP.
  std::string dashboard_url() const;
  void Shutdown();
  void Wait();

  JobService& jobs() { return job_service_; }
  const ServerOptions& options() const { return options_; }
  ExecutorService& executors() { return executor_service_; }
  ModelService& models() { return model_service_; }
  Authenticator& authenticator() { return authenticator_; }
  IdentityAdmin& identities() { return identities_; }
  metrics::Registry& metrics() { return registry_; }

  // One pass of the background loop: finalises the jobs reported ready, runs the watchdog (when
  // this server has one), then sweeps for jobs left ready by others. The loop runs it every
  // watchdog interval (1 s without a watchdog) and as soon as a job is reported ready.
  void RunBackgroundPass() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void BackgroundLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // A completion left `job_id` ready to finalise: the loop wakes for it.
  void JobReady(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);

  MetadataStore* store_;
  Clock* clock_;
  ServerOptions options_;
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<WorkSignal> work_signal_;  // null: this server alone
  WatchdogLockSource watchdog_lock_source_;  // empty: a lost lock is not sought again
  absl::Duration watchdog_lock_retry_ = absl::Seconds(1);
  absl::Time next_watchdog_lock_try_ = absl::InfinitePast();  // the background loop's thread only
  metrics::Registry registry_;
  ServerMetrics server_metrics_;
  RpcFaults rpc_faults_;  // every gRPC call's faults, counted and logged (server/rpc_faults.h)
  ProgressTracker progress_;  // every job's progress estimate: watch streams, dashboard, metrics
  FleetView fleet_view_;
  JobFinalizer finalizer_;
  Authenticator authenticator_;
  IdentityAdmin identities_;
  JobService job_service_;
  ExecutorService executor_service_;
  AdminService admin_service_;
  ModelService model_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpServer> http_;
  std::vector<std::function<void(HttpServer*)>> http_routes_;
  int port_ = 0;
  std::atomic<bool> serving_{false};
  std::thread background_;
  absl::Mutex mu_;                    // a change to these wakes the background loop
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> ready_jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace minions
