// minions: one binary, subcommands. Wiring only: the verbs live in src/cli, the server in
// src/server, the executor in src/executor; this file picks the concrete backends.

#include <signal.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <atomic>
#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "common/host_port.h"
#include "cli/admin_verbs.h"
#include "cli/client_verbs.h"
#include "cli/credentials.h"
#include "cli/demo.h"
#include "cli/local_run.h"
#include "cli/model_verbs.h"
#include "common/logging.h"
#include "common/private_files.h"
#include "common/redact.h"
#include "model/liveness.h"
#include "executor/agent.h"
#include "dashboard/status_endpoints.h"
#include "runner/process_runner.h"
#include "http/metrics_endpoints.h"
#include "openai/model_catalog.h"
#include "openai/openai_api.h"
#include "identity/authenticator.h"
#include "identity/pki.h"
#include "rpc/tls.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "config.h"
#include "executor_commands.h"
#include "identity_setup.h"
#include "local_pool.h"
#include "minions/version.h"

namespace {

std::atomic<int> g_signals{0};
void OnSignal(int) { g_signals.fetch_add(1); }

void InstallSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

void AddLoadOptions(CLI::App* cmd, minions::runner_protocol::LoadOptions* load) {
  cmd->add_option("--parallel", load->n_parallel, "sequences decoded together")->capture_default_str();
  cmd->add_option("--ctx-per-seq", load->n_ctx_per_seq, "context tokens per sequence (0: model's, at most 4096)");
  cmd->add_option("--threads", load->n_threads, "CPU threads (0: all cores)");
  cmd->add_option("--gpu-layers", load->n_gpu_layers, "layers offloaded to the GPU (-1: all)");
}

void AddServerAddress(CLI::App* cmd, minions::cli::Connection* connection) {
  cmd->add_option("--server", connection->server,
                  "server address (default: MINIONS_SERVER, else [executor] server of the config file, else "
                  "127.0.0.1:7070)");
  cmd->add_option("--ca", connection->tls.ca_file, "the pool's CA certificate: talk TLS (or MINIONS_CA)");
  cmd->add_option("--tls-server-name", connection->tls.server_name,
                  "the name the server's certificate carries, when it is not the address dialled");
}

// --server, --ca, --token-file and --token; and --config, unless the command has one already
// (`config_path` null).
void AddConnection(CLI::App* cmd, minions::cli::Connection* connection, std::string* config_path) {
  AddServerAddress(cmd, connection);
  cmd->add_option("--token-file", connection->token_file, "file holding your token, mode 0600 (or MINIONS_TOKEN_FILE)");
  cmd->add_option("--token", connection->token, "your token (or MINIONS_TOKEN; a file is safer)");
  if (config_path != nullptr) {
    cmd->add_option("--config", *config_path, "TOML config file (or MINIONS_CONFIG) for [executor] server");
  }
}

// What a bare `minions` prints: the verbs, grouped for a person who has not used it before. Each
// verb's line is its own description (so it cannot drift); verbs not named in a group are listed
// under "More".
void PrintVerbs(CLI::App& app) {
  const std::vector<std::pair<const char*, std::vector<const char*>>> groups = {
      {"Start here", {"demo", "up"}},
      {"Submit and follow work", {"submit", "jobs", "status", "watch", "results", "cancel"}},
      {"Models", {"models"}},
      {"The fleet", {"executors", "drain"}},
      {"Teams and access", {"teams", "admin", "pki"}},
      {"Run the pieces yourself", {"server", "watchdog", "executor", "config"}},
      {"Without a server", {"local-run"}},
  };
  printf("%s\n\nUsage: minions VERB [options]   (minions VERB --help says more)\n", app.get_description().c_str());
  std::set<std::string> listed;
  auto line = [&](const CLI::App* verb) {
    printf("  %-11s %s\n", verb->get_name().c_str(), verb->get_description().c_str());
    listed.insert(verb->get_name());
  };
  const std::vector<CLI::App*> verbs = app.get_subcommands({});
  for (const auto& [title, names] : groups) {
    printf("\n%s:\n", title);
    for (const char* name : names) {
      for (const CLI::App* verb : verbs) {
        if (verb->get_name() == name) line(verb);
      }
    }
  }
  bool more = false;
  for (const CLI::App* verb : verbs) {
    if (listed.count(verb->get_name())) continue;
    if (!more) printf("\nMore:\n");
    more = true;
    line(verb);
  }
  printf("\nNew here? `minions demo` runs a whole batch on this machine; `minions up` starts a pool to submit to.\n");
}

// The watchdog's options, the same for a server's watchdog and a standalone one.
minions::WatchdogOptions WatchdogOptionsOf(const minions::apps::MinionsConfig& config) {
  const absl::Duration ttl = absl::Milliseconds(config.lease_ttl_ms);
  minions::WatchdogOptions options;
  options.executor_timeout = minions::ExecutorTimeoutFor(ttl);
  options.takeover_grace = ttl * 2;  // a heartbeat, plus the reconnection backoff
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
  minions::ServerOptions options;
  options.listen = config.listen;
  options.http_listen = config.http_listen == "off" ? "" : config.http_listen;
  options.tls = {config.tls_cert, config.tls_key};
  options.lease_ttl = absl::Milliseconds(config.lease_ttl_ms);
  options.heartbeat_batch = static_cast<int>(config.heartbeat_batch);
  options.heartbeat_linger = absl::Microseconds(config.heartbeat_linger_us);
  options.idle_polls_renew = config.idle_polls_renew;
  options.task_sizing.target = absl::Seconds(config.task_target_s);
  options.auth.refresh_ttl = absl::Seconds(config.credential_refresh_s);
  // Executors elsewhere open models by their own paths.
  options.check_model_paths = !absl::StartsWith(config.database, "postgres");
  std::unique_ptr<minions::Watchdog> watchdog;
  if (config.watchdog) {
    // Without the lock (another process holds it) the watchdog waits on standby: the server seeks
    // the lock again every second, so when that process goes, or the database restarts and ends
    // every session's lock, one of the servers takes over.
    auto lock = minions::apps::TryAcquireWatchdog(config);
    if (!lock.ok()) MINIONS_LOG(Info) << "another process runs the watchdog; this server stands by";
    watchdog = std::make_unique<minions::Watchdog>(backends->store.get(), WatchdogOptionsOf(config),
                                                   lock.ok() ? std::move(*lock) : nullptr);
  }
  MINIONS_LOG(Info) << "backends: " << backends->description;
  // A pool without an admin gets one, in the data folder (the CLI on this machine finds it).
  auto admin = minions::apps::EnsureAdminToken(backends->store.get(), &clock, config.data_dir + "/admin-token");
  if (!admin.ok() && !absl::IsNotFound(admin.status())) {
    fprintf(stderr, "error: %s\n", std::string(admin.status().message()).c_str());
    return 1;
  }
  minions::MinionsServer server(backends->store.get(), backends->blobs.get(), &clock, options, std::move(watchdog));
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
  InstallSignalHandlers();
  while (g_signals.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
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
      auto caller = auth.Authorize(minions::RequestToken(request), minions::Scope::kMetricsRead);
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
  while (g_signals.load() == 0) {
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

// The join token an executor enrols with (used only when it has no credential yet): from a file
// (--join-token-file, MINIONS_JOIN_TOKEN_FILE) or MINIONS_JOIN_TOKEN. Taken out of the
// environment either way, with MINIONS_TOKEN: nothing the executor starts (its runner) inherits a
// credential.
absl::StatusOr<std::string> TakeJoinToken(const std::string& file) {
  std::string token;
  if (const char* env = std::getenv("MINIONS_JOIN_TOKEN"); env && *env) token = env;
  unsetenv("MINIONS_JOIN_TOKEN");
  unsetenv("MINIONS_TOKEN");
  if (!file.empty()) return minions::cli::ReadTokenFile(file);
  return token;
}

int RunExecutor(const minions::cli::Connection& connection, minions::AgentOptions options,
                minions::ProcessRunner::Options runner, bool exit_with_parent,
                const minions::AvailabilityOptions& availability, minions::UrlPolicy url_policy,
                const std::string& join_token_file) {
#ifdef __linux__
  if (exit_with_parent) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() == 1) return 0;
  }
#endif
  minions::SetLogComponent("executor");
  minions::RealClock clock;
  std::string state_dir = options.state_dir;
  auto join_token = TakeJoinToken(join_token_file);
  if (!join_token.ok()) {
    fprintf(stderr, "error: %s\n", std::string(join_token.status().message()).c_str());
    return 1;
  }
  auto channel = minions::rpc::OpenChannel(connection.server, connection.tls, minions::rpc::ChannelUse::kExecutor);
  if (!channel.ok()) {
    fprintf(stderr, "error: %s\n", std::string(channel.status().message()).c_str());
    return 1;
  }
  // The executor's identity: its credential, in its state folder (mode 0600).
  minions::ExecutorCredentials credentials;
  credentials.credential_file =
      (state_dir.empty() ? minions::apps::DefaultExecutorStateDir() : state_dir) + "/credential";
  credentials.join_token = *join_token;
  // Registry models: fetched into the cache by the leases' URLs, under the same URL policy.
  minions::PolicyBlobClient cache_blobs(
      url_policy, std::make_unique<minions::UrlBlobClient>(minions::UrlBlobClient::Options{.clock = &clock}));
  minions::ModelCacheOptions cache_options;
  cache_options.dir = minions::apps::ModelCacheDir(state_dir);
  cache_options.max_bytes = availability.model_cache_bytes;
  cache_options.free_disk_floor_bytes = availability.free_disk_floor_bytes;
  cache_options.bytes_per_second = availability.model_download_bytes_per_second;
  auto cache = minions::ModelCache::Open(cache_options, &cache_blobs, &clock);
  if (!cache.ok()) {
    fprintf(stderr, "error: %s\n", std::string(cache.status().message()).c_str());
    return 1;
  }
  options.model_cache = std::move(*cache);
  options.owner_memory_share = availability.policy.max_memory_share;
  minions::ExecutorAgent agent(std::move(options), minions::MakeGrpcControlPlaneClient(*channel, credentials),
                               std::make_unique<minions::PolicyBlobClient>(
                                   std::move(url_policy),
                                   std::make_unique<minions::UrlBlobClient>(minions::UrlBlobClient::Options{.clock = &clock})),
                               std::make_unique<minions::ProcessRunnerFactory>(std::move(runner)), &clock);
  // Owner first: the availability controller and the owner's control channel (executor_commands.cc).
  auto owner = minions::apps::OwnerSide::Start(availability, &agent, &clock, state_dir);
  if (!owner.ok()) {
    fprintf(stderr, "error: %s\n", std::string(owner.status().message()).c_str());
    return 1;
  }
  InstallSignalHandlers();
  // First signal: drain (finish the current task). Second: hand the task back now.
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    int seen = 0;
    while (!done) {
      int now = g_signals.load();
      if (now > seen) {
        if (seen == 0) {
          MINIONS_LOG(Info) << "draining: finishing the current task (signal again to stop now)";
          agent.Drain();
        }
        if (now >= 2) agent.Stop();
        seen = now;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  absl::Status s = agent.Run();
  done = true;
  watcher.join();
  if (!s.ok()) {
    fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

int RunUp(const minions::cli::PoolOptions& options) {
  auto pool = minions::apps::StartLocalPool(options);
  if (!pool.ok()) {
    fprintf(stderr, "error: %s\n", std::string(pool.status().message()).c_str());
    return 1;
  }
  const std::string ca = (*pool)->ca_file().empty() ? "" : " --ca " + (*pool)->ca_file();
  printf("pool up: server %s with %d executors (data in %s)\n"
         "  submit:    minions submit FILE --model PATH --server %s%s\n"
         "  admin:     its token is in %s (mode 0600); the CLI on this machine finds it%s\n",
         (*pool)->address().c_str(), (*pool)->executor_count(), options.data_dir.c_str(), (*pool)->address().c_str(),
         ca.c_str(), (*pool)->admin_token_file().c_str(),
         (*pool)->admin_token_file() == minions::cli::MinionsHome() + "/pool/admin-token"
             ? ""
             : absl::StrCat(" when MINIONS_TOKEN_FILE=", (*pool)->admin_token_file()).c_str());
  if (!(*pool)->dashboard_url().empty()) {
    printf("  dashboard: %s  (Prometheus metrics at %smetrics)\n", (*pool)->dashboard_url().c_str(),
           (*pool)->dashboard_url().c_str());
  }
  printf("  Ctrl-C stops the pool\n");
  fflush(stdout);
  InstallSignalHandlers();
  while (g_signals.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  pool->reset();
  return 0;
}

// --- the verb groups: each Add* registers its verbs' options into its struct (bound by reference,
// so a struct must outlive the parse); each Run* runs the verb that was parsed. main() calls them
// in the order the verbs are listed by --help. ---

// What the verb groups share: one variable each for the connection to the server, --json and
// --config, bound to every verb that takes it.
struct SharedFlags {
  minions::cli::Connection connection;
  bool json = false;
  std::string home = minions::cli::MinionsHome();
  std::string config_path;
};

// `server`, `watchdog` and `config check`. Flags override the environment, which overrides the
// config file (see apps/config.h).
struct ProcessVerbs {
  std::string flag_listen, flag_http_listen, flag_data_dir, flag_database, flag_objects, flag_tls_cert, flag_tls_key;
  int64_t flag_ttl_ms = 0, flag_straggler_ms = -1, flag_half_life_s = 0, flag_warm_wait_ms = -1,
          flag_heartbeat_batch = 0, flag_heartbeat_linger_us = -1, flag_task_target_s = 0, flag_credential_refresh_s = 0;
  std::vector<std::string> flag_openai_model_dirs;
  int64_t flag_openai_max_file_bytes = 0;
  bool no_watchdog = false;
  bool no_model_affinity = false;
  bool no_idle_poll_renewals = false;
  std::string watchdog_http_listen;  // watchdog --http-listen
  bool connect = false;              // config check --connect
  CLI::App* server_cmd = nullptr;
  CLI::App* watchdog_cmd = nullptr;
  CLI::App* config_check_cmd = nullptr;
};

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
  server_cmd->add_flag("--no-idle-poll-renewals", p->no_idle_poll_renewals,
                       "idle executors heartbeat at the idle pace instead of being kept alive by their long "
                       "polls (server.idle_polls_renew = false)");
  server_cmd->add_option("--heartbeat-batch", p->flag_heartbeat_batch,
                         "write up to this many executors' heartbeats in one store transaction; 1: each alone "
                         "(default 256)");
  server_cmd->add_option("--heartbeat-linger-us", p->flag_heartbeat_linger_us,
                         "under steady load, a batch of heartbeats waits up to this long for more before it is "
                         "written (fewer store transactions); 0: never (default 2000)");
  server_cmd->add_option("--task-target-s", p->flag_task_target_s,
                         "jobs submitted without --shard-size get tasks that run about this many seconds, "
                         "from the measured throughput of their model (default 60)");
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
  if (p.flag_credential_refresh_s > 0) config->credential_refresh_s = p.flag_credential_refresh_s;
  if (p.no_watchdog) config->watchdog = false;
  if (p.no_model_affinity) config->model_affinity = false;
  if (p.no_idle_poll_renewals) config->idle_polls_renew = false;
  if (!p.flag_openai_model_dirs.empty()) config->openai_model_dirs = p.flag_openai_model_dirs;
  if (p.flag_openai_max_file_bytes > 0) config->openai_max_file_bytes = p.flag_openai_max_file_bytes;
  return config;
}

// Runs `server`, `watchdog` or `config check`, whichever was parsed.
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

// `executor` and its owner verbs (apps/executor_commands.cc).
struct ExecutorVerb {
  minions::AgentOptions agent_options;
  minions::ProcessRunner::Options runner_options;
  std::string runner_program, executor_metrics_listen;
  bool exit_with_parent = false;
  std::string join_token_file;
  int64_t checkpoint_interval_ms = 0;
  int64_t runner_hang_ms = 0;
  minions::apps::ExecutorFlags executor_flags;
  std::string owner_state_dir;
  std::string gang_address;  // --gang-address, else [gang] address
  CLI::App* executor_cmd = nullptr;
};

void AddExecutorVerb(CLI::App& app, SharedFlags* shared, ExecutorVerb* e) {
  minions::AgentOptions& agent_options = e->agent_options;
  auto* executor_cmd = e->executor_cmd =
      app.add_subcommand("executor", "run the agent that leases and runs tasks on this machine");
  AddServerAddress(executor_cmd, &shared->connection);
  executor_cmd->add_option("--join-token-file", e->join_token_file,
                           "join token to enrol with when this executor has no credential yet (or "
                           "MINIONS_JOIN_TOKEN_FILE, MINIONS_JOIN_TOKEN)");
  executor_cmd->add_option("--name", agent_options.name, "name shown in `minions executors` (default: host name)");
  executor_cmd->add_option("--state-dir", agent_options.state_dir, "keeps the executor id across restarts");
  executor_cmd->add_option("--runner", e->runner_program, "runner program (default: minions-llama-runner)");
  executor_cmd->add_option("--runner-log", e->runner_options.stderr_path, "file for the runner's log");
  executor_cmd->add_option("--metrics-listen", e->executor_metrics_listen,
                           "serve this executor's /metrics on host:port (default: none)");
  executor_cmd->add_flag("--exit-with-parent", e->exit_with_parent, "exit when the parent process does (Linux)");
  executor_cmd->add_option("--runner-threads", agent_options.runner_threads,
                           "CPU threads for the runner when the job does not set them (default: all cores but one)");
  e->checkpoint_interval_ms = absl::ToInt64Milliseconds(agent_options.checkpoint_interval);
  executor_cmd->add_option("--checkpoint-records", agent_options.checkpoint_records,
                           "upload a task's finished records as a checkpoint every this many records")
      ->capture_default_str();
  executor_cmd->add_option("--checkpoint-interval-ms", e->checkpoint_interval_ms,
                           "... or this often, whichever comes first")
      ->capture_default_str();
  e->runner_hang_ms = absl::ToInt64Milliseconds(agent_options.hang.min_silence);
  executor_cmd->add_option("--runner-hang-ms", e->runner_hang_ms,
                           "a runner holding work and silent this long (and 10x its slowest record) is killed as hung")
      ->capture_default_str();
  executor_cmd->add_option("--gang-address", e->gang_address,
                           "host:port of this machine on the gang network: joins gangs, serving their leaders there "
                           "(or [gang] address; default: joins none)");
  minions::apps::AddExecutorCommands(executor_cmd, &e->executor_flags, &e->owner_state_dir);
}

// Runs `executor` (an owner verb, or the agent). `client_config`: the config file read for it
// (LoadClientConfig).
int RunExecutorVerb(ExecutorVerb* e, minions::cli::Connection* connection,
                    const std::optional<minions::apps::MinionsConfig>& client_config) {
  minions::AgentOptions& agent_options = e->agent_options;
  minions::ProcessRunner::Options& runner_options = e->runner_options;
  const minions::apps::ExecutorFlags& executor_flags = e->executor_flags;
  if (auto code = minions::apps::RunOwnerVerb(executor_flags, e->owner_state_dir)) return *code;
  auto availability = minions::apps::LoadAvailability(executor_flags);
  if (!availability.ok()) {
    fprintf(stderr, "error: %s\n", std::string(availability.status().message()).c_str());
    return 1;
  }
  if (e->executor_cmd->count("--name") == 0 && !client_config->executor_name.empty()) {
    agent_options.name = client_config->executor_name;
  }
  if (e->executor_cmd->count("--state-dir") == 0 && !client_config->executor_state_dir.empty()) {
    agent_options.state_dir = client_config->executor_state_dir;
  }
  if (e->runner_program.empty()) e->runner_program = client_config->runner;
  if (e->executor_cmd->count("--runner-threads") == 0) agent_options.runner_threads = client_config->runner_threads;
  if (!e->runner_program.empty()) runner_options.command = {e->runner_program};
  agent_options.checkpoint_interval = absl::Milliseconds(e->checkpoint_interval_ms);
  agent_options.hang.min_silence = absl::Milliseconds(e->runner_hang_ms);
  if (agent_options.runner_threads == 0) {
    // Leave a core to the machine's owner and to this agent (see docs/architecture.md).
    agent_options.runner_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1);
  }
  minions::ExecutorMetrics executor_metrics;
  if (!e->executor_metrics_listen.empty()) {
    if (auto s = executor_metrics.Serve(e->executor_metrics_listen); !s.ok()) {
      fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    agent_options.metrics = &executor_metrics;
  }
  // The config file's [executor] keys fill what the flags and environment left unset.
  auto config = minions::apps::LoadConfig(executor_flags.config_path);
  if (config.ok()) {
    if (connection->tls.ca_file.empty()) connection->tls.ca_file = config->ca;
    if (e->join_token_file.empty()) e->join_token_file = config->join_token_file;
    if (e->gang_address.empty()) e->gang_address = config->gang_address;
  }
  if (!e->gang_address.empty()) {
    // Gangs (docs/architecture.md): its rpc-server is served on this address to gang leaders only.
    std::string host;
    int port = 0;
    if (auto s = minions::SplitHostPort(e->gang_address, &host, &port);
        !s.ok() || host.empty() || host == "0.0.0.0" || host == "::" || port < 1) {
      fprintf(stderr, "error: the gang address must be host:port with this machine's address on the gang network "
                      "(one address, not every interface), not '%s'\n", e->gang_address.c_str());
      return 1;
    }
    minions::AgentOptions::Gang gang;
    gang.address = e->gang_address;
    if (!runner_options.stderr_path.empty()) gang.rpc_log = runner_options.stderr_path + ".rpc-server";
    agent_options.gang = gang;
  }
  // Trust nothing sent: object URLs, model paths, the runner's confinement (executor_commands.cc).
  // The runner's command and environment are decided here (ProcessRunner::Options).
  if (runner_options.command.empty()) runner_options.command = {minions::SiblingProgram("minions-llama-runner")};
  auto url_policy = minions::apps::ApplyExecutorTrust(executor_flags, connection->server, &agent_options,
                                                      &runner_options);
  if (!url_policy.ok()) {
    fprintf(stderr, "error: %s\n", std::string(url_policy.status().message()).c_str());
    return 1;
  }
  return RunExecutor(*connection, agent_options, runner_options, e->exit_with_parent, *availability,
                     *std::move(url_policy), e->join_token_file);
}

// The verbs that run everything on this machine: `up` (a pool), `demo` and `local-run` (no
// server).
struct LocalVerbs {
  minions::cli::PoolOptions pool_options;
  minions::cli::DemoOptions demo;
  minions::cli::LocalRunOptions local;
  CLI::App* up_cmd = nullptr;
  CLI::App* demo_cmd = nullptr;
  CLI::App* local_cmd = nullptr;
};

void AddUpVerb(CLI::App& app, const SharedFlags& shared, LocalVerbs* l) {
  minions::cli::PoolOptions& pool_options = l->pool_options;
  pool_options.data_dir = shared.home + "/pool";
  pool_options.listen = "127.0.0.1:7070";
  pool_options.http_listen = "127.0.0.1:7080";
  auto* up_cmd = l->up_cmd =
      app.add_subcommand("up", "run a whole pool on this machine: server, watchdog, executors");
  up_cmd->add_option("--executors", pool_options.executors, "executor processes")->capture_default_str();
  up_cmd->add_option("--listen", pool_options.listen, "server address")->capture_default_str();
  up_cmd->add_option("--http-listen", pool_options.http_listen, "dashboard and metrics address (off: none)")
      ->capture_default_str();
  up_cmd->add_option("--data-dir", pool_options.data_dir, "database, objects, logs")->capture_default_str();
  up_cmd->add_flag("--tls", pool_options.tls, "TLS from a private CA made in DATA_DIR/tls (needed off loopback)");
  up_cmd->add_option("--tls-cert", pool_options.tls_cert, "TLS certificate of your own");
  up_cmd->add_option("--tls-key", pool_options.tls_key, "its private key");
  up_cmd->add_option("--ca", pool_options.tls_ca, "the CA that signed --tls-cert");
  up_cmd->add_option("--models", pool_options.model_folders,
                     "a folder the executors may load models from (repeat; default ~/.minions/models)");
}

// `demo` and `local-run`: the main job and the server-less path.
void AddDemoAndLocalRun(CLI::App& app, const SharedFlags& shared, LocalVerbs* l) {
  minions::cli::DemoOptions& demo = l->demo;
  demo.workdir = shared.home + "/demo";
  auto* demo_cmd = l->demo_cmd =
      app.add_subcommand("demo", "the main job: a pool of 2 executors runs a batch end to end");
  demo_cmd->add_option("--workdir", demo.workdir, "where the model, input, output and pool data go")->capture_default_str();
  demo_cmd->add_option("--records", demo.records, "number of sample records")->capture_default_str();
  demo_cmd->add_option("--executors", demo.executors, "executor processes")->capture_default_str();

  minions::cli::LocalRunOptions& local = l->local;
  auto* local_cmd = l->local_cmd =
      app.add_subcommand("local-run", "run a JSONL file through one runner on this machine, no server");
  local_cmd->add_option("input", local.input_path, "OpenAI Batch request lines (JSONL)")->required();
  local_cmd->add_option("--model", local.model_path, "GGUF model file")->required();
  local_cmd->add_option("-o,--output", local.output_path, "output lines")->required();
  local_cmd->add_option("--errors", local.errors_path, "error lines (default: OUTPUT.errors.jsonl)");
  local_cmd->add_option("--runner", local.runner, "runner program (default: minions-llama-runner)");
  local_cmd->add_option("--batch-size", local.batch_size, "records per runner batch")->capture_default_str();
  local_cmd->add_flag("!--no-progress", local.progress, "no progress line");
  AddLoadOptions(local_cmd, &local.load);
}

int RunLocalRun(minions::cli::LocalRunOptions local) {
  if (local.errors_path.empty()) local.errors_path = local.output_path + ".errors.jsonl";
  auto summary = minions::cli::RunLocally(local);
  if (!summary.ok()) {
    fprintf(stderr, "error: %s\n", std::string(summary.status().message()).c_str());
    return 1;
  }
  printf("%zu records (%zu errors) in %.2f s: %.1f records/s, %.1f generated tokens/s\n", summary->records,
         summary->errors, summary->seconds, summary->records / std::max(summary->seconds, 1e-9),
         summary->completion_tokens / std::max(summary->seconds, 1e-9));
  return 0;
}

// The client verbs: they talk to a server with a token.
struct ClientVerbs {
  minions::cli::SubmitOptions submit;
  int parallel = 0;
  std::string job_id, state_filter, output_path, executor_id;
  bool errors = false, show_tasks = false;
  CLI::App* submit_cmd = nullptr;
  CLI::App* jobs_cmd = nullptr;
  CLI::App* status_cmd = nullptr;
  CLI::App* watch_cmd = nullptr;
  CLI::App* results_cmd = nullptr;
  CLI::App* cancel_cmd = nullptr;
  CLI::App* executors_cmd = nullptr;
  CLI::App* teams_cmd = nullptr;
  CLI::App* revoke_executor_cmd = nullptr;
  CLI::App* whoami_cmd = nullptr;
  CLI::App* drain_cmd = nullptr;  // AddDrainVerb
  minions::cli::ModelOptions model;
  CLI::App* models_cmd = nullptr;
  CLI::App* models_push_cmd = nullptr;
  CLI::App* models_list_cmd = nullptr;
  CLI::App* models_show_cmd = nullptr;
  CLI::App* models_rm_cmd = nullptr;
};

// submit, jobs, status, watch, results, cancel, executors (revoke) and whoami.
void AddClientVerbs(CLI::App& app, SharedFlags* shared, ClientVerbs* c) {
  minions::cli::Connection& connection = shared->connection;
  std::string& config_path = shared->config_path;
  bool& json = shared->json;
  minions::cli::SubmitOptions& submit = c->submit;
  auto* submit_cmd = c->submit_cmd = app.add_subcommand("submit", "submit a JSONL batch file; prints the job id");
  AddConnection(submit_cmd, &connection, &config_path);
  submit_cmd->add_option("file", submit.input_path, "OpenAI Batch request lines (JSONL)")->required();
  submit_cmd->add_option("--model", submit.model,
                         "a pushed model (NAME or NAME@sha256:...), or a GGUF path the executors can open")
      ->required();
  submit_cmd->add_option("--runner", submit.runner, "the runner that serves it (default llama; or one executors declare)");
  submit_cmd->add_option("--shard-size", submit.shard_size,
                         "records per task (default: the server sizes tasks to run about a minute, from the "
                         "measured throughput of the model; 100 when nothing was measured yet)");
  submit_cmd->add_option("--max-attempts", submit.max_attempts, "failures before a task fails (default 4)");
  submit_cmd->add_option("--priority", submit.priority, "higher runs first");
  submit_cmd->add_option("--team", submit.team, "owner team");
  submit_cmd->add_option("--parallel", c->parallel, "sequences each runner decodes together");
  submit_cmd->add_option("--runner-options", submit.runner_options_json, "runner load options as JSON");
  submit_cmd->add_option("--gang", submit.gang,
                         "run each task on a gang of N executors that split the model between them (2..17)");
  submit_cmd->add_option("--completion-window", submit.completion_window,
                         "deadline after submission (24h, 90m); the job then expires with what it finished");
  submit_cmd->add_flag("--wait", submit.wait, "watch the job until it ends");
  submit_cmd->add_flag("--json", submit.json, "JSON output");

  auto* jobs_cmd = c->jobs_cmd = app.add_subcommand("jobs", "list jobs, newest first");
  AddConnection(jobs_cmd, &connection, &config_path);
  jobs_cmd->add_option("--state", c->state_filter, "only jobs in this state");
  jobs_cmd->add_flag("--json", json, "JSON output");
  auto* status_cmd = c->status_cmd =
      app.add_subcommand("status", "one job: state, request counts, where its results are");
  AddConnection(status_cmd, &connection, &config_path);
  status_cmd->add_option("job", c->job_id, "job id")->required();
  status_cmd->add_flag("--tasks", c->show_tasks, "list the job's tasks");
  status_cmd->add_flag("--json", json, "JSON output");
  auto* watch_cmd = c->watch_cmd = app.add_subcommand("watch", "progress bar with rate and ETA until the job ends");
  AddConnection(watch_cmd, &connection, &config_path);
  watch_cmd->add_option("job", c->job_id, "job id")->required();
  watch_cmd->add_flag("--json", json, "one JSON progress line per update");
  auto* results_cmd = c->results_cmd =
      app.add_subcommand("results", "the merged output (or error) file of a completed job");
  AddConnection(results_cmd, &connection, &config_path);
  results_cmd->add_option("job", c->job_id, "job id")->required();
  results_cmd->add_option("-o,--output", c->output_path, "file to write (default: standard output)");
  results_cmd->add_flag("--errors", c->errors, "the error file instead");
  auto* cancel_cmd = c->cancel_cmd =
      app.add_subcommand("cancel", "cancel a job; executors stop its tasks within a heartbeat");
  AddConnection(cancel_cmd, &connection, &config_path);
  cancel_cmd->add_option("job", c->job_id, "job id")->required();
  cancel_cmd->add_flag("--json", json, "JSON output");
  auto* executors_cmd = c->executors_cmd =
      app.add_subcommand("executors", "the fleet: each executor's state and current tasks");
  AddConnection(executors_cmd, &connection, &config_path);
  executors_cmd->add_flag("--json", json, "JSON output");
  auto* teams_cmd = c->teams_cmd = app.add_subcommand(
      "teams", "every team's fair-share weight, share, usage, running tasks and limits (no credentials shown)");
  AddConnection(teams_cmd, &connection, &config_path);
  teams_cmd->add_flag("--json", json, "JSON output");
  auto* revoke_executor_cmd = c->revoke_executor_cmd =
      executors_cmd->add_subcommand("revoke", "cut an executor off now: its credentials stop working, its tasks go back");
  revoke_executor_cmd->add_option("executor", c->executor_id, "executor id")->required();
  AddConnection(revoke_executor_cmd, &connection, &config_path);
  revoke_executor_cmd->add_flag("--json", json, "JSON output");
  // models: push, list, show, rm (a bare `minions models` lists).
  auto* models_cmd = c->models_cmd = app.add_subcommand("models", "the team's models: push a GGUF file, list, show, rm");
  AddConnection(models_cmd, &connection, &config_path);
  models_cmd->add_option("--team", c->model.team, "the team (admins: any; default your credential's)");
  models_cmd->add_flag("--json", c->model.json, "JSON output");
  auto* push = c->models_push_cmd =
      models_cmd->add_subcommand("push", "upload a GGUF model for the team (resumable; the same bytes again are free)");
  push->add_option("file", c->model.path, "the GGUF file")->required();
  push->add_option("--name", c->model.name, "the name jobs use (--model NAME)")->required();
  auto* list = c->models_list_cmd = models_cmd->add_subcommand("list", "the team's models");
  auto* show = c->models_show_cmd = models_cmd->add_subcommand("show", "one model: what its header says, what a task needs");
  show->add_option("model", c->model.name, "NAME or NAME@sha256:...")->required();
  auto* rm = c->models_rm_cmd =
      models_cmd->add_subcommand("rm", "remove a model (every digest of NAME, or NAME@sha256:...); refused while a job needs it");
  rm->add_option("model", c->model.name, "NAME or NAME@sha256:...")->required();
  for (CLI::App* verb : {push, list, show, rm}) {
    AddConnection(verb, &connection, &config_path);
    verb->add_option("--team", c->model.team, "the team (admins: any; default your credential's)");
    verb->add_flag("--json", c->model.json, "JSON output");
  }
  auto* whoami_cmd = c->whoami_cmd =
      app.add_subcommand("whoami", "which credential this client presents, and what it may do");
  AddConnection(whoami_cmd, &connection, &config_path);
  whoami_cmd->add_flag("--json", json, "JSON output");
}

// `drain`, registered after `pki` (the order of --help).
void AddDrainVerb(CLI::App& app, SharedFlags* shared, ClientVerbs* c) {
  auto* drain_cmd = c->drain_cmd = app.add_subcommand("drain", "ask an executor to finish its task and take no more");
  AddConnection(drain_cmd, &shared->connection, &shared->config_path);
  drain_cmd->add_option("executor", c->executor_id, "executor id")->required();
  drain_cmd->add_flag("--json", shared->json, "JSON output");
}

// Runs the client verb parsed among submit ... whoami (not drain); nullopt: none of them.
std::optional<int> RunClientVerb(ClientVerbs* c, const minions::cli::Connection& connection, bool json) {
  if (c->submit_cmd->parsed()) {
    if (c->parallel > 0 && c->submit.runner_options_json.empty()) {
      c->submit.runner_options_json = "{\"n_parallel\": " + std::to_string(c->parallel) + "}";
    }
    return minions::cli::Submit(connection, c->submit);
  }
  if (c->jobs_cmd->parsed()) return minions::cli::ListJobs(connection, c->state_filter, json);
  if (c->status_cmd->parsed()) return minions::cli::Status(connection, c->job_id, json, c->show_tasks);
  if (c->watch_cmd->parsed()) return minions::cli::Watch(connection, c->job_id, json);
  if (c->results_cmd->parsed()) return minions::cli::Results(connection, c->job_id, c->output_path, c->errors);
  if (c->cancel_cmd->parsed()) return minions::cli::Cancel(connection, c->job_id, json);
  if (c->revoke_executor_cmd->parsed()) {
    return minions::cli::RevokeExecutor(*minions::cli::RemoteAdmin(connection), c->executor_id, json);
  }
  if (c->executors_cmd->parsed()) return minions::cli::ListExecutors(connection, json);
  if (c->teams_cmd->parsed()) return minions::cli::ListTeams(connection, json);
  if (c->models_cmd->parsed()) {
    c->model.json = c->model.json || json;
    if (c->models_push_cmd->parsed()) return minions::cli::PushModel(connection, c->model);
    if (c->models_show_cmd->parsed()) return minions::cli::ShowModel(connection, c->model);
    if (c->models_rm_cmd->parsed()) return minions::cli::RemoveModel(connection, c->model);
    return minions::cli::ListModels(connection, c->model);
  }
  if (c->whoami_cmd->parsed()) return minions::cli::WhoAmI(*minions::cli::RemoteAdmin(connection), json);
  return std::nullopt;
}

// `admin` (over the network with an admin token, or on the server's own data) and `pki`.
struct AdminVerbs {
  std::string admin_data_dir, admin_database;
  minions::cli::TeamOptions team_options;
  minions::cli::IssueOptions issue;
  std::string token_id, token_team, token_role;
  bool all_tokens = false;
  minions::cli::IssueOptions join_issue;
  minions::pki::InitOptions pki_options;
  CLI::App* admin_cmd = nullptr;
  CLI::App* team_create_cmd = nullptr;
  CLI::App* team_set_cmd = nullptr;
  CLI::App* teams_cmd = nullptr;
  CLI::App* token_issue_cmd = nullptr;
  CLI::App* token_revoke_cmd = nullptr;
  CLI::App* tokens_cmd = nullptr;
  CLI::App* join_cmd = nullptr;
  CLI::App* pki_init_cmd = nullptr;
};

void AddAdminVerbs(CLI::App& app, SharedFlags* shared, AdminVerbs* a) {
  auto* admin_cmd = a->admin_cmd =
      app.add_subcommand("admin", "teams and credentials (an admin token, or --data-dir/--database)");
  admin_cmd->require_subcommand(1);
  AddConnection(admin_cmd, &shared->connection, nullptr);  // its --config is below
  admin_cmd->add_option("--data-dir", a->admin_data_dir, "act on this server's own data instead of over the network");
  admin_cmd->add_option("--database", a->admin_database, "... or on this database (postgresql://..., sqlite:/path)");
  admin_cmd->add_option("--config", shared->config_path, "... or on the database of this config file");
  admin_cmd->add_flag("--json", shared->json, "JSON output");
  minions::cli::TeamOptions& team_options = a->team_options;
  auto* team_cmd = admin_cmd->add_subcommand("team", "create or change a team");
  team_cmd->require_subcommand(1);
  auto add_team_options = [&](CLI::App* cmd) {
    cmd->add_option("name", team_options.name, "team name (lower case letters, digits, - and _)")->required();
    cmd->add_option("--max-priority", team_options.max_priority, "its jobs' priority ceiling (new teams: 10)");
    cmd->add_option("--max-queued-jobs,--max-active-jobs", team_options.max_active_jobs,
                    "its jobs not yet ended (queued or running) at once; a submit over it is refused (0: no limit)");
    cmd->add_option("--weight", team_options.weight, "fair-share weight, 1 or more (new teams: 1)");
    cmd->add_option("--max-running", team_options.max_running_tasks, "its tasks running at once (0: no limit)");
    cmd->add_option("--requests-per-second", team_options.requests_per_second,
                    "API calls per second per server (0: no limit)");
  };
  auto* team_create_cmd = a->team_create_cmd = team_cmd->add_subcommand("create", "create a team");
  add_team_options(team_create_cmd);
  auto* team_set_cmd = a->team_set_cmd = team_cmd->add_subcommand("set", "change a team's settings");
  add_team_options(team_set_cmd);
  auto* teams_cmd = a->teams_cmd = admin_cmd->add_subcommand("teams", "list the teams: fair-share weight, share, usage, running tasks, quotas");
  minions::cli::IssueOptions& issue = a->issue;
  auto* token_cmd = admin_cmd->add_subcommand("token", "issue or revoke a token");
  token_cmd->require_subcommand(1);
  auto* token_issue_cmd = a->token_issue_cmd = token_cmd->add_subcommand("issue", "issue a token (shown once)");
  token_issue_cmd->add_option("--role", issue.role, "admin, submitter, viewer, monitor or join")->required();
  token_issue_cmd->add_option("--team", issue.team, "the team of a submitter or viewer");
  token_issue_cmd->add_option("--name", issue.name, "who will hold it (alice, ci, prometheus)")->required();
  token_issue_cmd->add_option("--expires", issue.expires, "lifetime: 90d, 12h (default: none; join tokens 24h)");
  token_issue_cmd->add_option("--uses", issue.uses, "join tokens: how many executors may enrol with it (default 1)");
  token_issue_cmd->add_option("--scopes", issue.scopes, "fewer scopes than the role's, e.g. \"jobs:read\"");
  token_issue_cmd->add_option("-o,--output", issue.output, "write the token to this file (mode 0600)");
  auto* token_revoke_cmd = a->token_revoke_cmd = token_cmd->add_subcommand("revoke", "revoke a token now");
  token_revoke_cmd->add_option("id", a->token_id, "token id (tok-...)")->required();
  auto* tokens_cmd = a->tokens_cmd = admin_cmd->add_subcommand("tokens", "list tokens (never their text)");
  tokens_cmd->add_option("--team", a->token_team, "only this team's");
  tokens_cmd->add_option("--role", a->token_role, "only this role's");
  tokens_cmd->add_flag("--all", a->all_tokens, "revoked ones too");
  minions::cli::IssueOptions& join_issue = a->join_issue;
  join_issue.role = "join";
  join_issue.name = "join";
  auto* join_cmd = a->join_cmd = admin_cmd->add_subcommand("join-token", "issue a token executors enrol with");
  join_cmd->add_option("--uses", join_issue.uses, "how many executors may enrol with it (default 1)");
  join_cmd->add_option("--expires", join_issue.expires, "lifetime (default 24h)");
  join_cmd->add_option("--name", join_issue.name, "a label (which machines it is for)");
  join_cmd->add_option("-o,--output", join_issue.output, "write the token to this file (mode 0600)");

  // The connection and --json flags of `admin` may come after its verbs too.
  for (CLI::App* cmd : {team_cmd, team_create_cmd, team_set_cmd, teams_cmd, token_cmd, token_issue_cmd,
                        token_revoke_cmd, tokens_cmd, join_cmd}) {
    cmd->fallthrough();
  }

  minions::pki::InitOptions& pki_options = a->pki_options;
  auto* pki_cmd = app.add_subcommand("pki", "a private certificate authority for a pool's TLS");
  pki_cmd->require_subcommand(1);
  auto* pki_init_cmd = a->pki_init_cmd =
      pki_cmd->add_subcommand("init", "make a CA (if none) and a server certificate signed by it");
  pki_init_cmd->add_option("--dir", pki_options.dir, "where the files go")->required();
  pki_init_cmd->add_option("--host", pki_options.hosts,
                           "a name or address clients dial (repeat; localhost, 127.0.0.1 and this host's name are added)");
}

// Runs the `admin` verb parsed: on the server's own data (no token needed: whoever reads the
// database is its admin), or over the network with an admin token.
int RunAdminVerb(const AdminVerbs& a, const SharedFlags& shared) {
  std::unique_ptr<minions::cli::AdminBackend> admin;
  minions::apps::Backends local;
  minions::RealClock clock;
  if (!a.admin_data_dir.empty() || !a.admin_database.empty() || !shared.config_path.empty()) {
    auto config = minions::apps::LoadConfig(shared.config_path);
    if (!config.ok()) {
      fprintf(stderr, "error: %s\n", std::string(config.status().message()).c_str());
      return 1;
    }
    if (!a.admin_data_dir.empty()) config->data_dir = a.admin_data_dir;
    if (!a.admin_database.empty()) config->database = a.admin_database;
    auto backends = minions::apps::OpenBackends(*config, &clock);
    if (!backends.ok()) {
      fprintf(stderr, "error: %s\n", std::string(backends.status().message()).c_str());
      return 1;
    }
    local = std::move(*backends);
    admin = minions::apps::LocalAdmin(local.store.get(), &clock);
  } else {
    admin = minions::cli::RemoteAdmin(shared.connection);
  }
  const bool json = shared.json;
  if (a.team_create_cmd->parsed()) return minions::cli::CreateTeam(*admin, a.team_options, json);
  if (a.team_set_cmd->parsed()) return minions::cli::UpdateTeam(*admin, a.team_options, json);
  if (a.teams_cmd->parsed()) return minions::cli::ListTeams(*admin, json);
  if (a.token_issue_cmd->parsed()) return minions::cli::IssueToken(*admin, a.issue, json);
  if (a.token_revoke_cmd->parsed()) return minions::cli::RevokeToken(*admin, a.token_id, json);
  if (a.tokens_cmd->parsed()) return minions::cli::ListTokens(*admin, a.token_team, a.token_role, a.all_tokens, json);
  if (a.join_cmd->parsed()) return minions::cli::IssueToken(*admin, a.join_issue, json);
  return 1;
}

int RunPkiInit(const minions::pki::InitOptions& pki_options) {
  auto files = minions::pki::Init(pki_options, absl::Now());
  if (!files.ok()) {
    fprintf(stderr, "error: %s\n", std::string(files.status().message()).c_str());
    return 1;
  }
  printf("%s %s\nserver certificate %s (key %s) for %s\n"
         "  server:     minions server --tls-cert %s --tls-key %s ...\n"
         "  clients and executors: --ca %s (or MINIONS_CA); keep %s on this machine\n",
         files->ca_created ? "made the CA" : "kept the CA", files->ca_cert.c_str(), files->server_cert.c_str(),
         files->server_key.c_str(), absl::StrJoin(minions::pki::ServerNames(pki_options.hosts), ", ").c_str(),
         files->server_cert.c_str(), files->server_key.c_str(), files->ca_cert.c_str(), files->ca_key.c_str());
  return 0;
}

// Where the client verbs and the executor find the server: --server, else MINIONS_SERVER, else
// [executor] server in the config file, else the default; messages say which it was. The
// executor also takes its other [executor] settings from the file where no flag gives them.
// Sets `client_config` to the file read for the verb parsed (left unset when none of these was).
absl::Status LoadClientConfig(const ClientVerbs& c, const AdminVerbs& a, const ExecutorVerb& e,
                              SharedFlags* shared, std::optional<minions::apps::MinionsConfig>* client_config) {
  minions::cli::Connection& connection = shared->connection;
  for (CLI::App* cmd : {c.submit_cmd, c.jobs_cmd, c.status_cmd, c.watch_cmd, c.results_cmd, c.cancel_cmd,
                        c.executors_cmd, c.teams_cmd, c.drain_cmd, c.revoke_executor_cmd, c.whoami_cmd, c.models_cmd,
                        c.models_push_cmd, c.models_list_cmd, c.models_show_cmd, c.models_rm_cmd, a.admin_cmd,
                        e.executor_cmd}) {
    if (!cmd->parsed()) continue;
    // `models VERB` is parsed as both: the sub-verb's own --server is the one to honour.
    if (cmd == c.models_cmd && (c.models_push_cmd->parsed() || c.models_list_cmd->parsed() ||
                                c.models_show_cmd->parsed() || c.models_rm_cmd->parsed())) {
      continue;
    }
    // `executors revoke` is parsed as both: the sub-verb's own --server is the one to honour.
    if (cmd == c.executors_cmd && c.revoke_executor_cmd->parsed()) continue;
    auto config =
        minions::apps::LoadConfig(cmd == e.executor_cmd ? e.executor_flags.config_path : shared->config_path);
    if (!config.ok()) return config.status();
    if (cmd->count("--server") > 0) {
      connection.server_source = "--server";
    } else {
      connection.server = config->server;
      connection.server_source = config->server_source;
    }
    if (connection.tls.ca_file.empty()) connection.tls.ca_file = config->ca;  // [executor] ca
    *client_config = *std::move(config);
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil is built without NDEBUG, so every Mutex lock would also update Abseil's global
  // lock-order graph (deadlock detection) under one process-wide lock: at 3,000 executors that
  // was the server's hottest user-space function and a source of futex contention. The unit tests
  // keep it (they catch lock-order inversions); the program does not pay for it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  CLI::App app{"Minions: a virtual GPU cloud made of idle machines, for batch inference"};
  app.set_version_flag("--version", std::string("minions ") + minions::kVersion);
  app.require_subcommand(0, 1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "debug logging");

  // Registered in the order --help lists them.
  SharedFlags shared;
  ProcessVerbs process;
  ExecutorVerb executor;
  LocalVerbs local;
  ClientVerbs client;
  AdminVerbs admin;
  AddProcessVerbs(app, &shared, &process);    // server, watchdog, config
  AddExecutorVerb(app, &shared, &executor);   // executor
  AddUpVerb(app, shared, &local);             // up
  AddClientVerbs(app, &shared, &client);      // submit ... whoami
  AddAdminVerbs(app, &shared, &admin);        // admin, pki
  AddDrainVerb(app, &shared, &client);        // drain
  AddDemoAndLocalRun(app, shared, &local);    // demo, local-run

  CLI11_PARSE(app, argc, argv);
  if (verbose) minions::SetLogLevel(minions::LogLevel::kDebug);
  if (app.get_subcommands().empty()) {
    PrintVerbs(app);
    return 0;
  }
  // The processes that keep data (databases, objects, state, logs) create it for their own account
  // only; the client verbs leave the user's umask alone (their output files are the user's).
  if (process.server_cmd->parsed() || process.watchdog_cmd->parsed() || executor.executor_cmd->parsed() ||
      local.up_cmd->parsed() || local.demo_cmd->parsed()) {
    minions::UsePrivateUmask();
  }
  shared.connection.FromEnvironment();
  std::optional<minions::apps::MinionsConfig> client_config;
  if (auto s = LoadClientConfig(client, admin, executor, &shared, &client_config); !s.ok()) {
    fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return 1;
  }

  if (process.server_cmd->parsed() || process.watchdog_cmd->parsed() || process.config_check_cmd->parsed()) {
    return RunProcessVerb(process, shared.config_path);
  }
  if (executor.executor_cmd->parsed()) return RunExecutorVerb(&executor, &shared.connection, client_config);
  if (local.up_cmd->parsed()) return RunUp(local.pool_options);
  if (auto code = RunClientVerb(&client, shared.connection, shared.json)) return *code;
  if (admin.admin_cmd->parsed()) return RunAdminVerb(admin, shared);
  if (admin.pki_init_cmd->parsed()) return RunPkiInit(admin.pki_options);
  if (client.drain_cmd->parsed()) {
    return minions::cli::DrainExecutor(shared.connection, client.executor_id, shared.json);
  }
  if (local.demo_cmd->parsed()) {
    // The pool's server logs go to a file; the demo's own output stays readable.
    return minions::cli::RunDemo(local.demo, minions::apps::StartLocalPool);
  }
  if (local.local_cmd->parsed()) return RunLocalRun(local.local);
  return 0;
}
