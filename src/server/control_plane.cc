#include "server/control_plane.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "dashboard/status_endpoints.h"
#include "model/liveness.h"
#include "rpc/rpc.h"
#include "server/call_auth.h"
#include "server/call_caps.h"

namespace minions {
namespace {

// A duration as a gRPC channel argument (int milliseconds, at least 1).
int MillisecondsArg(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, INT32_MAX));
}

}  // namespace

WatchdogOptions ServerWatchdogOptions(absl::Duration lease_ttl) {
  WatchdogOptions options;
  options.executor_timeout = ExecutorTimeoutFor(lease_ttl);
  options.takeover_grace = lease_ttl * 2;  // a heartbeat, plus the reconnection backoff
  return options;
}

ControlPlane::ControlPlane(MetadataStore* store, BlobStore* blobs, Clock* clock, ControlPlaneOptions options,
                           std::unique_ptr<WatchdogLock> watchdog_lock)
    : store_(store),
      blobs_(blobs),
      clock_(clock),
      options_(std::move(options.server)),
      watchdog_(options.watchdog ? std::make_unique<Watchdog>(store, *options.watchdog, std::move(watchdog_lock))
                                 : nullptr),
      server_metrics_(&registry_, store),
      rpc_faults_(clock, &registry_),
      fleet_view_(store, clock, &progress_, absl::Seconds(1), absl::Seconds(30), options_.history_step),
      finalizer_(store, blobs, clock, {options_.max_chunk_bytes}, options_.verify_wait),
      authenticator_(store, clock, options_.auth),
      identities_(store, clock,
                  IdentityPolicy{options_.require_executor_approval, options_.executor_credential_ttl,
                                 options_.team_token_ttl, options_.credential_rotation_grace}),
      job_service_(store, blobs, clock, &authenticator_, options_, [this] { executor_service_.WorkArrived(); },
                   &server_metrics_, &progress_),
      executor_service_(store, blobs, clock, &authenticator_, &identities_, options_,
                        [this](const std::string& job_id) { JobReady(job_id); }, &server_metrics_),
      admin_service_(store, clock, &authenticator_, &identities_, [this] { executor_service_.WorkArrived(); }),
      model_service_(store, blobs, clock, &authenticator_, options_) {
  fleet_view_.ExportMetrics(&registry_);
  if (watchdog_) watchdog_->ExportMetrics(&registry_);
}

ControlPlane::~ControlPlane() { Shutdown(); }

absl::Status ControlPlane::Start() {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      rpc::ServerCredentials(options_.listen, options_.tls);
  if (!credentials.ok()) return credentials.status();
  // A call without a valid credential is refused from its headers, before its message is read
  // (call_auth.h), on TLS and plain text (loopback) alike.
  (*credentials)->SetAuthMetadataProcessor(std::make_shared<CredentialGate>(&authenticator_));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, *credentials, &port_);
  builder.RegisterService(&job_service_);
  builder.RegisterService(&executor_service_);
  builder.RegisterService(&admin_service_);
  builder.RegisterService(&model_service_);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<RpcFaultInterceptors>(&rpc_faults_));
  // Each address and each credential gets a share of the calls served at once, never all of them.
  interceptors.push_back(
      std::make_unique<CallCaps>(CallCapOptions{options_.max_calls_per_peer, options_.max_calls_per_credential}));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // Limits on what a caller can make this process hold (docs/operations.md, "Limits"): no message
  // larger than a few MiB (inputs and models travel in parts below it); every call in flight holds a thread of the synchronous server, so
  // the threads are capped (past the cap a call gets RESOURCE_EXHAUSTED), as are the streams one
  // connection may open and the size of a call's metadata.
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::clamp<int64_t>(options_.max_message_bytes, 2 << 20, INT32_MAX)));
  builder.SetMaxSendMessageSize(64 << 20);
  grpc::ResourceQuota quota("minions-server");
  quota.SetMaxThreads(std::max(options_.max_threads, 4));
  if (options_.grpc_memory_bytes > 0) quota.Resize(static_cast<size_t>(options_.grpc_memory_bytes));
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 256);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, 16 << 10);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, MillisecondsArg(options_.grpc_handshake_timeout));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, MillisecondsArg(options_.grpc_idle_connection_timeout));
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
    StatusSources sources{store_, clock_, &fleet_view_, &progress_, &registry_, [this] { return serving_.load(); },
                          &authenticator_, blobs_};
    // The dashboard's downloads read the files `minions results` reads.
    sources.results_of = [this](const Job& job) -> absl::StatusOr<std::pair<std::string, std::string>> {
      auto keys = finalizer_.ResultsOf(job);
      if (!keys.ok()) return keys.status();
      return std::make_pair(keys->output, keys->errors);
    };
    InstallStatusEndpoints(sources, http_.get());
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
    finalizer_thread_ = std::thread([this] {
      NameThisThread("finaliser");
      FinalizerLoop();
    });
    history_thread_ = std::thread([this] {
      NameThisThread("history");
      HistoryLoop();
    });
    if (watchdog_) {
      watchdog_thread_ = std::thread([this] {
        NameThisThread("watchdog");
        WatchdogLoop();
      });
    }
  }
  serving_ = true;
  MINIONS_LOG(Info) << "server listening on " << address() << (options_.tls.enabled() ? " (TLS)" : " (plain text, loopback)")
                    << (!watchdog_             ? ""
                        : watchdog_->active() ? " running the watchdog"
                                              : " with the watchdog on standby (another process runs it)")
                    << (http_ ? absl::StrCat("; dashboard and metrics on ", dashboard_url()) : "");
  return absl::OkStatus();
}

std::string ControlPlane::dashboard_url() const {
  if (!http_) return "";
  std::string host = options_.http_listen.substr(0, options_.http_listen.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  return absl::StrCat(options_.tls.enabled() ? "https://" : "http://", host, ":", http_->port(), "/");
}

std::string ControlPlane::address() const {
  std::string host = options_.listen.substr(0, options_.listen.rfind(':'));
  return absl::StrCat(host, ":", port_);
}

void ControlPlane::JobReady(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  ready_jobs_.insert(job_id);
}

absl::Status ControlPlane::FinalizeReportedJobs() {
  std::set<std::string> ready;
  {
    absl::MutexLock lock(&mu_);
    ready.swap(ready_jobs_);
  }
  absl::Status first;
  for (const auto& job : ready) {
    auto result = finalizer_.Finalize(job);
    if (result.ok()) continue;
    MINIONS_LOG(Warning) << "job=" << job << " finalisation failed: " << result.status().message();
    first.Update(result.status());
  }
  return first;
}

absl::StatusOr<WatchdogPass> ControlPlane::RunWatchdogPass(absl::Time now) {
  if (!watchdog_) return WatchdogPass{};
  if (!watchdog_->active() && watchdog_lock_source_ && now >= next_watchdog_lock_try_) {
    next_watchdog_lock_try_ = now + watchdog_lock_retry_;
    auto lock = watchdog_lock_source_();
    if (lock.ok()) {
      MINIONS_LOG(Info) << "this server runs the watchdog again (after its takeover grace)";
      watchdog_->Resume(std::move(*lock));
    }
  }
  if (!watchdog_->active()) return WatchdogPass{};
  auto pass = watchdog_->Tick(now);
  // A lost lock the watchdog logs itself, once; this server then seeks it again (above).
  if (!pass.ok() && watchdog_->active()) MINIONS_LOG(Warning) << "watchdog pass failed: " << pass.status().message();
  // Requeued tasks and backups of stragglers are work for idle executors.
  if (pass.ok() && pass->leases_expired + pass->backups_requested > 0) executor_service_.WorkArrived();
  return pass;
}

absl::Status ControlPlane::SweepReadyJobs() {
  auto swept = finalizer_.FinalizeReady();
  if (!swept.ok()) MINIONS_LOG(Warning) << "finaliser sweep failed: " << swept.status().message();
  return swept.status();
}

void ControlPlane::RunBackgroundPass() {
  (void)FinalizeReportedJobs();
  (void)RunWatchdogPass(clock_->Now());
  // Jobs finished by another server, by the watchdog, or left over from a restart.
  (void)SweepReadyJobs();
}

void ControlPlane::FinalizerLoop() {
  // The sweep's pace is the watchdog's: jobs it finishes are swept up within a pass or two.
  const absl::Duration interval = watchdog_ ? watchdog_->options().interval : absl::Seconds(1);
  absl::Time next_sweep = clock_->Now();
  while (true) {
    (void)FinalizeReportedJobs();
    bool sweep_now = false;
    {
      absl::MutexLock lock(&mu_);
      std::swap(sweep_now, sweep_requested_);
    }
    if (sweep_now || clock_->Now() >= next_sweep) {
      (void)SweepReadyJobs();
      next_sweep = clock_->Now() + interval;
    }
    // A job becoming ready (or shutdown) ends the wait early; the condition is evaluated under the
    // lock, so a job reported between the step's swap and this wait is not missed.
    absl::MutexLock lock(&mu_);
    auto woken = [this] {
      mu_.AssertHeld();
      return stopping_ || !ready_jobs_.empty() || sweep_requested_;
    };
    clock_->AwaitWithDeadline(mu_, absl::Condition(&woken), next_sweep);
    if (stopping_) return;
  }
}

void ControlPlane::WatchdogLoop() {
  const absl::Duration interval = watchdog_->options().interval;
  while (true) {
    auto pass = RunWatchdogPass(clock_->Now());
    {
      absl::MutexLock lock(&mu_);
      // Jobs whose tasks it changed may be ready now: the finaliser sweeps for them at once (one
      // look in the store, not one per job touched).
      if (pass.ok() && !pass->jobs_touched.empty()) sweep_requested_ = true;
      auto stopping = [this] {
        mu_.AssertHeld();
        return stopping_;
      };
      clock_->AwaitWithDeadline(mu_, absl::Condition(&stopping), clock_->Now() + interval);
      if (stopping_) return;
    }
  }
}

void ControlPlane::HistoryLoop() {
  const absl::Duration step = options_.history_step;
  while (true) {
    // A failure (the store is down) is that step's gap in the charts.
    if (auto s = fleet_view_.RecordHistory(); !s.ok()) {
      MINIONS_LOG(Warning) << "dashboard history: cannot read the fleet: " << s.message();
    }
    // The tokens this server admitted in the step that ended (kept, and added later, on failure).
    if (auto s = fleet_view_.RecordTokens(server_metrics_.TokensAdmittedSoFar()); !s.ok()) {
      MINIONS_LOG(Warning) << "dashboard history: cannot record the tokens admitted: " << s.message();
    }
    absl::MutexLock lock(&mu_);
    auto stopping = [this] {
      mu_.AssertHeld();
      return stopping_;
    };
    // Wakes as the next step begins, so each point is taken at the start of its step.
    clock_->AwaitWithDeadline(mu_, absl::Condition(&stopping), HistoryStepOf(clock_->Now(), step) + step);
    if (stopping_) return;
  }
}

void ControlPlane::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  serving_ = false;  // /readyz says so while the rest winds down
  executor_service_.Shutdown();  // long-polling leases answer now
  if (server_) clock_->Wake();  // WatchJob streams sleeping on the clock (none unless started)
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (finalizer_thread_.joinable()) finalizer_thread_.join();
  if (watchdog_thread_.joinable()) watchdog_thread_.join();
  if (history_thread_.joinable()) history_thread_.join();
  if (work_signal_) work_signal_->Stop();
  if (http_) http_->Stop();
  // Nothing is admitted any more: the tokens of the step under way, which the history thread
  // would have written as the step ended, are written now (the dashboard's tokens/s chart).
  if (options_.background_thread) {
    if (auto s = fleet_view_.RecordTokens(server_metrics_.TokensAdmittedSoFar(), /*stopping=*/true); !s.ok()) {
      MINIONS_LOG(Warning) << "dashboard history: the tokens of the last step are not recorded: " << s.message();
    }
  }
}

void ControlPlane::Wait() {
  if (server_) server_->Wait();
}

}  // namespace minions
