#pragma once
// MinionsServer: the control plane process minus main(): the gRPC services on one port, the
// HTTP port (metrics, health, the web dashboard; when options.http_listen is set), plus the
// background loop that finalises finished jobs and (when this process holds the watchdog lock)
// runs the watchdog. Holds no job state of its own; its metrics registry is per process. Owns the
// Authenticator every call goes through, and serves TLS (options.tls) on both ports; it refuses
// to serve plain text anywhere but loopback.
// Threads: Start/Shutdown from the owning thread; the services run on gRPC's threads; the
// background loop on its own thread.

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "blob/blob_store.h"
#include "common/clock.h"
#include "dashboard/fleet_view.h"
#include "http/http_server.h"
#include "identity/authenticator.h"
#include "identity/identity_admin.h"
#include "server/admin_service.h"
#include "metrics/metrics.h"
#include "server/executor_service.h"
#include "server/job_finalizer.h"
#include "server/job_service.h"
#include "server/server_metrics.h"
#include "server/server_options.h"
#include "store/metadata_store.h"
#include "watchdog/watchdog.h"

namespace minions {

class MinionsServer {
 public:
  // `watchdog` may be null: another process runs it.
  MinionsServer(MetadataStore* store, BlobStore* blobs, Clock* clock, ServerOptions options,
                std::unique_ptr<Watchdog> watchdog);
  ~MinionsServer();

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
  ExecutorService& executors() { return executor_service_; }
  Authenticator& authenticator() { return authenticator_; }
  IdentityAdmin& identities() { return identities_; }
  metrics::Registry& metrics() { return registry_; }

 private:
  void BackgroundLoop();

  MetadataStore* store_;
  Clock* clock_;
  ServerOptions options_;
  std::unique_ptr<Watchdog> watchdog_;
  metrics::Registry registry_;
  ServerMetrics server_metrics_;
  FleetView fleet_view_;
  JobFinalizer finalizer_;
  Authenticator authenticator_;
  IdentityAdmin identities_;
  JobService job_service_;
  ExecutorService executor_service_;
  AdminService admin_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpServer> http_;
  int port_ = 0;
  std::atomic<bool> serving_{false};
  std::atomic<bool> stopping_{false};
  std::thread background_;
  std::mutex ready_mu_;
  std::condition_variable ready_cv_;   // wakes the background loop: a job is ready, or shutdown
  std::set<std::string> ready_jobs_;  // guarded by ready_mu_
};

}  // namespace minions
