#pragma once
// ControlPlane: the server process, assembled in one place from its options: the store and blob
// store it is given; the metrics registry, the Authenticator and the four gRPC services built over
// them; the finaliser and (when options.watchdog is set) the watchdog, each with a worker of its
// own; and, once started, the gRPC port and the HTTP port (metrics, health, the web dashboard;
// when options.server.http_listen is set). `minions server`, `minions up` (apps/local_pool.cc)
// and the tests' in-process control plane (tests/executor/fake_control_plane.h) all build it
// here; what differs between them is an option (ControlPlaneOptions, ServerWatchdogOptions).
//
// Holds no job state of its own (the store does); its metrics registry is per process. Serves TLS
// (options.server.tls) on both ports; it refuses to serve plain text anywhere but loopback.
//
// Not started, it serves nothing and runs no thread: its services are called directly and its
// background work is run by the caller (RunBackgroundPass, or its three steps), on any clock.
// Threads: construction, Start and Shutdown on the owning thread; the services run on gRPC's
// threads; once started (with options.server.background_thread), finalisation runs on the
// "finaliser" thread and the watchdog on the "watchdog" thread, so a large merge never delays
// lease expiry; the dashboard's history is recorded on the "history" thread. Every wait is on
// the Clock it is given.

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
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
#include "store/watchdog_lock.h"
#include "watchdog/watchdog.h"

namespace minions {

struct ControlPlaneOptions {
  // Its ports, limits and the services' options.
  ServerOptions server;
  // The watchdog this process runs (ServerWatchdogOptions, adjusted); none: another process runs
  // it (`minions watchdog`, or servers started with --no-watchdog elsewhere).
  std::optional<WatchdogOptions> watchdog;
};

// The watchdog's options for leases of `lease_ttl`, as `minions server`, `minions watchdog` and
// the tests' control plane set them: an executor silent for ExecutorTimeoutFor(ttl) is lost, and
// after a takeover leases are judged only after two TTLs (a heartbeat, plus the reconnection
// backoff), so executors that outlived a server's restart re-attach theirs first.
WatchdogOptions ServerWatchdogOptions(absl::Duration lease_ttl);

class ControlPlane {
 public:
  // `watchdog_lock`: the store's watchdog lock, acquired by the caller; null with
  // options.watchdog set: the watchdog waits on standby (see SetWatchdogLockSource). Ignored
  // without options.watchdog.
  ControlPlane(MetadataStore* store, BlobStore* blobs, Clock* clock, ControlPlaneOptions options,
               std::unique_ptr<WatchdogLock> watchdog_lock = nullptr);
  ~ControlPlane();

  // Where a watchdog on standby (it never held the lock, or lost it with the database's session:
  // a database restart, another server's failover) gets the lock again. The watchdog's pass tries
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

  // Binds the ports, starts listening for other servers' work and (with
  // options.server.background_thread) the finaliser's and the watchdog's threads.
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
  // This process's watchdog; null when another process runs it.
  Watchdog* watchdog() { return watchdog_.get(); }
  ExecutorService& executors() { return executor_service_; }
  ModelService& models() { return model_service_; }
  Authenticator& authenticator() { return authenticator_; }
  IdentityAdmin& identities() { return identities_; }
  metrics::Registry& metrics() { return registry_; }

  // The background work, for a control plane whose caller runs it (not started, or without
  // options.server.background_thread): the finaliser's step (FinalizeReportedJobs), the
  // watchdog's pass (when this process has one) and the finaliser's sweep, in that order. Once
  // started, the finaliser's thread runs the first as soon as a job is reported ready and the
  // sweep every watchdog interval (1 s without a watchdog); the watchdog's thread runs its pass
  // every interval. Failures are logged.
  void RunBackgroundPass() ABSL_LOCKS_EXCLUDED(mu_);
  // Finalises the jobs completions reported ready since the last call; the first failure (every
  // one is logged).
  absl::Status FinalizeReportedJobs() ABSL_LOCKS_EXCLUDED(mu_);
  // One watchdog pass as of `now`: first seeks the lock again when it was lost (see
  // SetWatchdogLockSource); wakes idle executors when the pass requeued work. An empty pass
  // without a watchdog or while on standby. One thread at a time.
  absl::StatusOr<WatchdogPass> RunWatchdogPass(absl::Time now);
  // Finalises the jobs left ready by others (another server, the watchdog, a restart).
  absl::Status SweepReadyJobs();

 private:
  void FinalizerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void WatchdogLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Records the dashboard's history point every options.history_step (dashboard/fleet_view.h).
  void HistoryLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // A completion left `job_id` ready to finalise: the finaliser's thread wakes for it.
  void JobReady(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);

  MetadataStore* store_;
  BlobStore* blobs_;  // the dashboard reads ended jobs' first error lines
  Clock* clock_;
  ServerOptions options_;
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<WorkSignal> work_signal_;  // null: this server alone
  WatchdogLockSource watchdog_lock_source_;  // empty: a lost lock is not sought again
  absl::Duration watchdog_lock_retry_ = absl::Seconds(1);
  absl::Time next_watchdog_lock_try_ = absl::InfinitePast();  // RunWatchdogPass's thread only
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
  std::thread finalizer_thread_;
  std::thread watchdog_thread_;
  std::thread history_thread_;
  absl::Mutex mu_;  // a change to these wakes the finaliser's and the watchdog's threads
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> ready_jobs_ ABSL_GUARDED_BY(mu_);
  bool sweep_requested_ ABSL_GUARDED_BY(mu_) = false;  // by a watchdog pass that touched jobs
};

}  // namespace minions
