#include "server/server.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "dashboard/status_endpoints.h"
#include "rpc/rpc.h"

namespace minions {

MinionsServer::MinionsServer(MetadataStore* store, BlobStore* blobs, Clock* clock, ServerOptions options,
                             std::unique_ptr<Watchdog> watchdog)
    : store_(store),
      clock_(clock),
      options_(std::move(options)),
      watchdog_(std::move(watchdog)),
      server_metrics_(&registry_, store),
      rpc_faults_(clock, &registry_),
      fleet_view_(store, clock, &progress_),
      finalizer_(store, blobs, clock, {options_.max_chunk_bytes}),
      authenticator_(store, clock, options_.auth),
      identities_(store, clock),
      job_service_(store, blobs, clock, &authenticator_, options_, [this] { executor_service_.WorkArrived(); },
                   &server_metrics_, &progress_),
      executor_service_(store, blobs, clock, &authenticator_, &identities_, options_,
                        [this](const std::string& job_id) { JobReady(job_id); }, &server_metrics_),
      admin_service_(store, clock, &authenticator_, &identities_, [this] { executor_service_.WorkArrived(); }),
      model_service_(store, blobs, clock, &authenticator_, options_) {
  fleet_view_.ExportMetrics(&registry_);
  if (watchdog_) watchdog_->ExportMetrics(&registry_);
}

MinionsServer::~MinionsServer() { Shutdown(); }

absl::Status MinionsServer::Start() {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      rpc::ServerCredentials(options_.listen, options_.tls);
  if (!credentials.ok()) return credentials.status();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, *credentials, &port_);
  builder.RegisterService(&job_service_);
  builder.RegisterService(&executor_service_);
  builder.RegisterService(&admin_service_);
  builder.RegisterService(&model_service_);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<RpcFaultInterceptors>(&rpc_faults_));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // Limits on what a caller can make this process hold (docs/operations.md, "Limits"): the largest
  // message is an inline input; every call in flight holds a thread of the synchronous server, so
  // the threads are capped (past the cap a call gets RESOURCE_EXHAUSTED), as are the streams one
  // connection may open and the size of a call's metadata.
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(options_.max_input_bytes + (1 << 20), INT32_MAX)));
  builder.SetMaxSendMessageSize(64 << 20);
  grpc::ResourceQuota quota("minions-server");
  quota.SetMaxThreads(std::max(options_.max_threads, 4));
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 256);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, 16 << 10);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, rpc::kServerBdpProbe ? 1 : 0);  // why: rpc.h
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.listen,
                                               " (is another server running there?)"));
  }
  if (!options_.http_listen.empty()) {
    HttpServerOptions http_options = options_.http;
    http_options.tls_cert_file = options_.tls.cert_file;
    http_options.tls_key_file = options_.tls.key_file;
    http_ = std::make_unique<HttpServer>(http_options);
    InstallStatusEndpoints({store_, clock_, &fleet_view_, &progress_, &registry_, [this] { return serving_.load(); },
                            &authenticator_},
                           http_.get());
    for (const auto& install : http_routes_) install(http_.get());
    if (auto s = http_->Start(options_.http_listen); !s.ok()) {
      server_->Shutdown();
      http_.reset();
      return s;
    }
  }
  if (work_signal_) {
    // Work announced by other servers wakes this one's waiting leases.
    if (auto s = work_signal_->Start([this] { executor_service_.NotifyWork(); }); !s.ok()) {
      server_->Shutdown();
      if (http_) http_->Stop();
      return s;
    }
  }
  if (options_.background_thread) {
    background_ = std::thread([this] {
      NameThisThread("server-bg");
      BackgroundLoop();
    });
  }
  serving_ = true;
  MINIONS_LOG(Info) << "server listening on " << address() << (options_.tls.enabled() ? " (TLS)" : " (plain text, loopback)")
                    << (!watchdog_             ? ""
                        : watchdog_->active() ? " running the watchdog"
                                              : " with the watchdog on standby (another process runs it)")
                    << (http_ ? absl::StrCat("; dashboard and metrics on ", dashboard_url()) : "");
  return absl::OkStatus();
}

std::string MinionsServer::dashboard_url() const {
  if (!http_) return "";
  std::string host = options_.http_listen.substr(0, options_.http_listen.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  return absl::StrCat(options_.tls.enabled() ? "https://" : "http://", host, ":", http_->port(), "/");
}

std::string MinionsServer::address() const {
  std::string host = options_.listen.substr(0, options_.listen.rfind(':'));
  return absl::StrCat(host, ":", port_);
}

void MinionsServer::JobReady(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  ready_jobs_.insert(job_id);
}

void MinionsServer::RunBackgroundPass() {
  std::set<std::string> ready;
  {
    absl::MutexLock lock(&mu_);
    ready.swap(ready_jobs_);
  }
  for (const auto& job : ready) {
    auto result = finalizer_.Finalize(job);
    if (!result.ok()) MINIONS_LOG(Warning) << "job=" << job << " finalisation failed: " << result.status().message();
  }
  if (watchdog_ && !watchdog_->active() && watchdog_lock_source_ && clock_->Now() >= next_watchdog_lock_try_) {
    next_watchdog_lock_try_ = clock_->Now() + watchdog_lock_retry_;
    auto lock = watchdog_lock_source_();
    if (lock.ok()) {
      MINIONS_LOG(Info) << "this server runs the watchdog again (after its takeover grace)";
      watchdog_->Resume(std::move(*lock));
    }
  }
  if (watchdog_ && watchdog_->active()) {
    auto pass = watchdog_->Tick(clock_->Now());
    // A lost lock the watchdog logs itself, once; this server then seeks it again (above).
    if (!pass.ok() && watchdog_->active()) MINIONS_LOG(Warning) << "watchdog pass failed: " << pass.status().message();
    // Requeued tasks and backups of stragglers are work for idle executors.
    if (pass.ok() && pass->leases_expired + pass->backups_requested > 0) executor_service_.WorkArrived();
  }
  // Jobs finished by another server, by the watchdog, or left over from a restart.
  auto swept = finalizer_.FinalizeReady();
  if (!swept.ok()) MINIONS_LOG(Warning) << "finaliser sweep failed: " << swept.status().message();
}

void MinionsServer::BackgroundLoop() {
  const absl::Duration interval = watchdog_ ? watchdog_->options().interval : absl::Seconds(1);
  while (true) {
    RunBackgroundPass();
    // A job becoming ready (or shutdown) ends the wait early; the condition is evaluated under the
    // lock, so a job reported between the pass's swap and this wait is not missed.
    absl::MutexLock lock(&mu_);
    auto woken = [this] {
      mu_.AssertHeld();
      return stopping_ || !ready_jobs_.empty();
    };
    clock_->AwaitWithDeadline(mu_, absl::Condition(&woken), clock_->Now() + interval);
    if (stopping_) return;
  }
}

void MinionsServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  serving_ = false;  // /readyz says so while the rest winds down
  executor_service_.Shutdown();  // long-polling leases answer now
  clock_->Wake();  // WatchJob streams sleeping on the clock
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (background_.joinable()) background_.join();
  if (work_signal_) work_signal_->Stop();
  if (http_) http_->Stop();
}

void MinionsServer::Wait() {
  if (server_) server_->Wait();
}

}  // namespace minions
