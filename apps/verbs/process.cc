#include "verbs/process.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "cli/credentials.h"
#include "common/logging.h"
#include "common/redact.h"
#include "backends.h"
#include "config.h"
#include "dashboard/status_endpoints.h"
#include "http/metrics_endpoints.h"
#include "identity/authenticator.h"
#include "identity_setup.h"
#include "openai/model_catalog.h"
#include "openai/openai_api.h"
#include "server/control_plane.h"
#include "watchdog/watchdog.h"

namespace minions::apps {
namespace {

// The watchdog's options, the same for a server's watchdog and a standalone one.
minions::WatchdogOptions WatchdogOptionsOf(const minions::apps::MinionsConfig& config) {
  minions::WatchdogOptions options = minions::ServerWatchdogOptions(absl::Milliseconds(config.lease_ttl_ms));
  options.stragglers.factor = config.straggler_factor;
  options.stragglers.min_runtime = absl::Milliseconds(config.straggler_min_runtime_ms);
  return options;
}

// Runs the server until SIGTERM/SIGINT.
int RunServer(const minions::apps::MinionsConfig& config) {
  minions::RealClock clock;
  auto backends = minions::apps::OpenBackends(config, &clock);
  if (!backends.ok()) {
    fprintf(stderr, "error: %s\n", std::string(backends.status().message()).c_str());
    return 1;
  }
  // Servers on one database share one object store: the first records it, one with another stops here.
  if (auto agreed = backends->store->ClaimObjectStore(backends->object_store, clock.Now()); !agreed.ok()) {
    fprintf(stderr, "error: %s\n", std::string(agreed.message()).c_str());
    return 1;
  }
  minions::ControlPlaneOptions cp_options;
  minions::ServerOptions& options = cp_options.server;
  options.listen = config.listen;
  options.http_listen = config.http_listen == "off" ? "" : config.http_listen;
  options.http.health_listen = config.health_listen;
  options.tls = {config.tls_cert, config.tls_key};
  options.lease_ttl = absl::Milliseconds(config.lease_ttl_ms);
  options.heartbeat_batch = static_cast<int>(config.heartbeat_batch);
  options.heartbeat_linger = absl::Microseconds(config.heartbeat_linger_us);
  options.idle_polls_renew = config.idle_polls_renew;
  options.spot_checks = config.spot_checks;  // as the store's (apps/backends.cc)
  options.verify_wait = absl::Seconds(config.verify_wait_s);
  options.require_confined_executors = config.require_confined_executors;
  options.require_executor_approval = config.executor_approval;
  options.task_sizing.target = absl::Seconds(config.task_target_s);
  options.history_step = absl::Seconds(config.history_step_s);
  options.auth.refresh_ttl = absl::Seconds(config.credential_refresh_s);
  options.executor_credential_ttl = absl::Seconds(config.executor_credential_ttl_s);
  options.team_token_ttl = absl::Seconds(config.token_ttl_s);
  options.grpc_memory_bytes = config.grpc_memory_mb << 20;
  options.runner_allowlist = config.runner_allowlist;
  // Executors elsewhere open models by their own paths.
  options.check_model_paths = !absl::StartsWith(config.database, "postgres");
  std::unique_ptr<minions::WatchdogLock> watchdog_lock;
  if (config.watchdog) {
    // Without the lock (another process holds it) the watchdog waits on standby: the server seeks
    // the lock again every second, so when that process goes, or the database restarts and ends
    // every session's lock, one of the servers takes over.
    cp_options.watchdog = WatchdogOptionsOf(config);
    auto lock = minions::apps::TryAcquireWatchdog(config);
    if (lock.ok()) {
      watchdog_lock = std::move(*lock);
    } else {
      MINIONS_LOG(Info) << "another process runs the watchdog; this server stands by";
    }
  }
  MINIONS_LOG(Info) << "backends: " << backends->description;
  // A pool without an admin gets one, in the data folder (the CLI on this machine finds it).
  auto admin = minions::apps::EnsureAdminToken(backends->store.get(), &clock, config.data_dir + "/admin-token");
  if (!admin.ok() && !absl::IsNotFound(admin.status())) {
    fprintf(stderr, "error: %s\n", std::string(admin.status().message()).c_str());
    return 1;
  }
  minions::ControlPlane server(backends->store.get(), backends->blobs.get(), &clock, std::move(cp_options),
                               std::move(watchdog_lock));
  if (config.watchdog) server.SetWatchdogLockSource([config] { return minions::apps::TryAcquireWatchdog(config); });
  // Work submitted through any server wakes executors waiting on every server.
  auto work_signal = minions::apps::OpenWorkSignal(config);
  if (!work_signal.ok()) {
    fprintf(stderr, "error: %s\n", std::string(work_signal.status().message()).c_str());
    return 1;
  }
  server.SetWorkSignal(std::move(*work_signal));
  // The OpenAI Batch API on the HTTP port.
  // Record `model` names resolve through the team's registry, then the --openai-model-dir folders.
  minions::openai::FolderModelCatalog openai_folder_models(config.openai_model_dirs);
  minions::openai::RegistryModelCatalog openai_models(backends->store.get(), &openai_folder_models);
  minions::openai::OpenAiApiOptions openai_options;
  openai_options.max_file_bytes = config.openai_max_file_bytes;
  minions::openai::OpenAiApi openai_api({backends->store.get(), backends->blobs.get(), &clock, &server.authenticator(),
                                         &server.jobs(), &openai_models, {server.options().max_chunk_bytes}},
                                        openai_options);
  server.AddHttpRoutes([&openai_api](minions::HttpServer* http) { openai_api.Install(http); });
  if (auto s = server.Start(); !s.ok()) {
    fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  // The CLI on this machine sends the admin token only to this server (docs/security.md, 40.7c).
  if (admin.ok()) {
    if (auto s = minions::cli::WriteTokenServer(config.data_dir + "/admin-token", server.address(), getpid()); !s.ok()) {
      fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  InstallSignalHandlers();
  while (SignalsReceived() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server.Shutdown();
  return 0;
}

// Runs the watchdog alone (when servers run with --no-watchdog); one active at a time: the others
// wait on standby and take over when it dies. One that loses its lock (its database session
// ended) stops at once and goes back to standby.
// `http_listen` (may be empty): where to serve /metrics and /healthz, so the watchdog's actions are
// counted when it runs apart from the servers.
int RunWatchdog(const minions::apps::MinionsConfig& config, const std::string& http_listen) {
  minions::RealClock clock;
  auto backends = minions::apps::OpenBackends(config, &clock);
  if (!backends.ok()) {
    fprintf(stderr, "error: %s\n", std::string(backends.status().message()).c_str());
    return 1;
  }
  minions::metrics::Registry registry;
  minions::metrics::Gauge* active =
      registry.AddGauge("minions_watchdog_active", "1 while this process is the active watchdog, 0 on standby.");
  minions::RealClock auth_clock;
  minions::Authenticator auth(backends->store.get(), &auth_clock);
  minions::HttpServerOptions http_options;
  http_options.tls_cert_file = config.tls_cert;
  http_options.tls_key_file = config.tls_key;
  minions::HttpServer http(http_options);
  if (!http_listen.empty()) {
    // /metrics for monitor and admin tokens, as on a server.
    minions::InstallMetricsEndpoints(&registry, &http, [&auth](const minions::HttpRequest& request)
                                                           -> std::optional<minions::HttpResponse> {
      auto caller = auth.Authorize(minions::RequestBearer(request), minions::Scope::kMetricsRead);
      if (caller.ok()) return std::nullopt;
      return minions::HttpResponse{absl::IsPermissionDenied(caller.status()) ? 403 : 401, "text/plain; charset=utf-8",
                                   std::string(caller.status().message()) + "\n", {}};
    });
    if (auto s = http.Start(http_listen); !s.ok()) {
      fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  InstallSignalHandlers();
  const minions::WatchdogOptions options = WatchdogOptionsOf(config);
  std::unique_ptr<minions::Watchdog> watchdog;
  // Requeued work wakes the executors waiting on the servers.
  auto work_signal = minions::apps::OpenWorkSignal(config);
  if (!work_signal.ok()) {
    fprintf(stderr, "error: %s\n", std::string(work_signal.status().message()).c_str());
    return 1;
  }
  while (SignalsReceived() == 0) {
    if (watchdog == nullptr || !watchdog->active()) {
      // Standby: try for the lock every second.
      auto lock = minions::apps::TryAcquireWatchdog(config);
      if (!lock.ok()) {
        clock.SleepFor(absl::Seconds(1));
        continue;
      }
      MINIONS_LOG(Info) << "watchdog active on " << backends->description;
      if (watchdog == nullptr) {
        watchdog = std::make_unique<minions::Watchdog>(backends->store.get(), options, std::move(*lock));
        watchdog->ExportMetrics(&registry);
      } else {
        watchdog->Resume(std::move(*lock));
      }
      active->Set(1);
    }
    auto pass = watchdog->Tick(clock.Now());
    if (!watchdog->active()) {
      active->Set(0);  // lost: back to standby (the watchdog said why)
      continue;
    }
    if (!pass.ok()) MINIONS_LOG(Warning) << "watchdog pass failed: " << pass.status().message();
    if (pass.ok() && pass->leases_expired + pass->backups_requested > 0) {
      if (auto s = (*work_signal)->Announce(); !s.ok()) {
        MINIONS_LOG(Warning) << "servers not told of requeued work: " << s.message();
      }
    }
    clock.SleepFor(options.interval);
  }
  return 0;
}

int RunConfigCheck(const minions::apps::MinionsConfig& config, bool connect) {
  auto problems = minions::apps::CheckConfig(config, connect);
  for (std::string& problem : minions::apps::CheckExecutorFiles(config)) problems.push_back(std::move(problem));
  printf("configuration%s\n", config.source.empty() ? " (no file; defaults and environment)" : (" from " + config.source).c_str());
  printf("  http      %s\n", config.http_listen.empty() || config.http_listen == "off" ? "off" : config.http_listen.c_str());
  printf("  server    listen %s, lease ttl %lld ms, watchdog %s, TLS %s\n", config.listen.c_str(),
         static_cast<long long>(config.lease_ttl_ms), config.watchdog ? "on" : "off",
         config.tls_cert.empty() ? "off (loopback only)" : config.tls_cert.c_str());
  // Connection strings may hold a password: printed with it hidden.
  printf("  database  %s\n", config.database.empty() ? (config.data_dir + "/minions.db (SQLite)").c_str()
                                                    : minions::RedactSecrets(config.database).c_str());
  printf("  objects   %s%s\n", config.objects.empty() ? (config.data_dir + "/objects").c_str() : config.objects.c_str(),
         config.s3_endpoint.empty() ? "" : (" at " + minions::RedactSecrets(config.s3_endpoint)).c_str());
  printf("  executor  server %s (%s), name %s, state dir %s, runner %s, runner threads %s\n", config.server.c_str(),
         config.server_source.c_str(), config.executor_name.empty() ? "(host name)" : config.executor_name.c_str(),
         config.executor_state_dir.empty() ? "(default)" : config.executor_state_dir.c_str(),
         config.runner.empty() ? "minions-llama-runner" : config.runner.c_str(),
         config.runner_threads > 0 ? std::to_string(config.runner_threads).c_str() : "all cores but one");
  if (problems.empty()) {
    printf("ok%s\n", connect ? ": the database and the object store answer" : "");
    return 0;
  }
  for (const auto& p : problems) printf("problem: %s\n", p.c_str());
  return 1;
}

// The configuration of `server`, `watchdog` and `config check`: the file's, then the flags'.
absl::StatusOr<minions::apps::MinionsConfig> LoadProcessConfig(const ProcessVerbs& p, const std::string& config_path) {
  auto config = minions::apps::LoadConfig(config_path);
  if (!config.ok()) return config;
  if (!p.flag_listen.empty()) config->listen = p.flag_listen;
  if (!p.flag_http_listen.empty()) config->http_listen = p.flag_http_listen;
  if (!p.flag_data_dir.empty()) config->data_dir = p.flag_data_dir;
  if (!p.flag_tls_cert.empty()) config->tls_cert = p.flag_tls_cert;
  if (!p.flag_tls_key.empty()) config->tls_key = p.flag_tls_key;
  if (!p.flag_database.empty()) config->database = p.flag_database;
  if (!p.flag_objects.empty()) config->objects = p.flag_objects;
  if (p.flag_ttl_ms > 0) config->lease_ttl_ms = p.flag_ttl_ms;
  if (p.flag_straggler_ms >= 0) config->straggler_min_runtime_ms = p.flag_straggler_ms;
  if (p.flag_half_life_s > 0) config->fair_share_half_life_s = p.flag_half_life_s;
  if (p.flag_warm_wait_ms >= 0) config->warm_wait_ms = p.flag_warm_wait_ms;
  if (p.flag_heartbeat_batch > 0) config->heartbeat_batch = p.flag_heartbeat_batch;
  if (p.flag_heartbeat_linger_us >= 0) config->heartbeat_linger_us = p.flag_heartbeat_linger_us;
  if (p.flag_task_target_s > 0) config->task_target_s = p.flag_task_target_s;
  if (p.flag_history_step_s > 0) config->history_step_s = p.flag_history_step_s;
  if (p.flag_credential_refresh_s > 0) config->credential_refresh_s = p.flag_credential_refresh_s;
  if (p.no_watchdog) config->watchdog = false;
  if (p.no_model_affinity) config->model_affinity = false;
  if (p.spot_checks) config->spot_checks = true;
  if (p.no_idle_poll_renewals) config->idle_polls_renew = false;
  if (p.require_confined_executors) config->require_confined_executors = true;
  if (p.require_approval) config->executor_approval = true;
  if (!p.flag_openai_model_dirs.empty()) config->openai_model_dirs = p.flag_openai_model_dirs;
  if (p.flag_openai_max_file_bytes > 0) config->openai_max_file_bytes = p.flag_openai_max_file_bytes;
  return config;
}

}  // namespace

void AddProcessVerbs(CLI::App& app, SharedFlags* shared, ProcessVerbs* p) {
  std::string& config_path = shared->config_path;
  auto* server_cmd = p->server_cmd = app.add_subcommand("server", "run the control plane (gRPC API, watchdog)");
  server_cmd->add_option("--config", config_path, "TOML config file (or MINIONS_CONFIG)");
  server_cmd->add_option("--listen", p->flag_listen, "address to serve on (default 127.0.0.1:7070)");
  server_cmd->add_option("--http-listen", p->flag_http_listen,
                         "HTTP address for /metrics, /healthz, /readyz and the dashboard; off: none (default 127.0.0.1:7080)");
  server_cmd->add_option("--data-dir", p->flag_data_dir, "SQLite database and objects (default ~/.minions/server)");
  server_cmd->add_option("--database", p->flag_database, "postgresql://... or sqlite:/path (default: SQLite in the data dir)");
  server_cmd->add_option("--objects", p->flag_objects, "s3://bucket/prefix or a directory (default: in the data dir)");
  server_cmd->add_option("--tls-cert", p->flag_tls_cert, "TLS certificate for both ports (`minions pki init` makes one)");
  server_cmd->add_option("--tls-key", p->flag_tls_key, "its private key");
  server_cmd->add_option("--lease-ttl-ms", p->flag_ttl_ms, "lease TTL; executors heartbeat every third (default 9000)");
  server_cmd->add_flag("--no-watchdog", p->no_watchdog, "leave the watchdog to a `minions watchdog` process");
  server_cmd->add_option("--fair-share-half-life-s", p->flag_half_life_s,
                         "fair share between teams: past usage halves every this many seconds (default 86400)");
  server_cmd->add_option("--warm-wait-ms", p->flag_warm_wait_ms,
                         "a job's tasks wait this long for an executor holding its model before a cold one "
                         "may take them (default 3000)");
  server_cmd->add_flag("--no-model-affinity", p->no_model_affinity,
                       "place tasks without regard to the executors' models: no warm preference, no warm wait "
                       "(for benchmarks and comparisons; server.model_affinity = false)");
  server_cmd->add_flag("--spot-checks", p->spot_checks,
                       "draw records of committed chunks for other executors to re-score; a job publishes once "
                       "they are judged (server.spot_checks = true)");
  server_cmd->add_flag("--require-approval", p->require_approval,
                       "executors that enrol get no work until an admin runs `minions executors approve ID` "
                       "(server.executor_approval = true)");
  server_cmd->add_flag("--no-idle-poll-renewals", p->no_idle_poll_renewals,
                       "idle executors heartbeat at the idle pace instead of being kept alive by their long "
                       "polls (server.idle_polls_renew = false)");
  server_cmd->add_flag("--require-confined-executors", p->require_confined_executors,
                       "lease work only to executors whose runners run under Landlock and seccomp (macOS: "
                       "sandbox-exec); others are told why (server.require_confined_executors = true)");
  server_cmd->add_option("--heartbeat-batch", p->flag_heartbeat_batch,
                         "write up to this many executors' heartbeats in one store transaction; 1: each alone "
                         "(default 256)");
  server_cmd->add_option("--heartbeat-linger-us", p->flag_heartbeat_linger_us,
                         "under steady load, a batch of heartbeats waits up to this long for more before it is "
                         "written (fewer store transactions); 0: never (default 2000)");
  server_cmd->add_option("--task-target-s", p->flag_task_target_s,
                         "jobs submitted without --shard-size get tasks that run about this many seconds, "
                         "from the measured throughput of their model (default 60)");
  server_cmd->add_option("--history-step-s", p->flag_history_step_s,
                         "the dashboard's history: a point every this many seconds, kept in the store for 6 hours "
                         "(default 15)");
  server_cmd->add_option("--credential-refresh-s", p->flag_credential_refresh_s,
                         "keep a looked-up credential this long before reading it again; revocations are read "
                         "in one batch every 2 s regardless (default 300)");
  server_cmd->add_option("--openai-model-dir", p->flag_openai_model_dirs,
                         "a folder of GGUF files the OpenAI API serves as models, by file name (repeatable)");
  server_cmd->add_option("--openai-max-file-bytes", p->flag_openai_max_file_bytes,
                         "the largest file /v1/files takes (default 256 MiB)");
  server_cmd->add_option("--straggler-min-runtime-ms", p->flag_straggler_ms,
                         "a straggler gets a backup attempt only after running this long (default 30000)");

  auto* watchdog_cmd = p->watchdog_cmd =
      app.add_subcommand("watchdog", "run the watchdog alone (one is active at a time)");
  watchdog_cmd->add_option("--config", config_path, "TOML config file (or MINIONS_CONFIG)");
  watchdog_cmd->add_option("--data-dir", p->flag_data_dir, "the server's data directory");
  watchdog_cmd->add_option("--database", p->flag_database, "the servers' database");
  watchdog_cmd->add_option("--lease-ttl-ms", p->flag_ttl_ms, "the servers' lease TTL");
  watchdog_cmd->add_option("--http-listen", p->watchdog_http_listen, "serve /metrics and /healthz here (default: none)");

  auto* config_cmd = app.add_subcommand("config", "configuration tools");
  auto* config_check_cmd = p->config_check_cmd =
      config_cmd->add_subcommand("check", "say what is wrong with the configuration");
  config_cmd->require_subcommand(1);
  config_check_cmd->add_option("--config", config_path, "TOML config file (or MINIONS_CONFIG)");
  config_check_cmd->add_option("--database", p->flag_database, "override the database");
  config_check_cmd->add_option("--objects", p->flag_objects, "override the object store");
  config_check_cmd->add_flag("--connect", p->connect, "also connect to the database and the object store");
}

int RunProcessVerb(const ProcessVerbs& p, const std::string& config_path) {
  auto config = LoadProcessConfig(p, config_path);
  if (!config.ok()) {
    fprintf(stderr, "error: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  if (p.config_check_cmd->parsed()) return RunConfigCheck(*config, p.connect);
  auto problems = minions::apps::CheckConfig(*config, false);
  if (!problems.empty()) {
    for (const auto& problem : problems) fprintf(stderr, "error: %s\n", problem.c_str());
    return 1;
  }
  minions::SetLogComponent(p.server_cmd->parsed() ? "server" : "watchdog");
  return p.server_cmd->parsed() ? RunServer(*config) : RunWatchdog(*config, p.watchdog_http_listen);
}

}  // namespace minions::apps
