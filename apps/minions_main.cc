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
#include "cli/client_verbs.h"
#include "cli/demo.h"
#include "cli/local_run.h"
#include "common/logging.h"
#include "common/private_files.h"
#include "common/redact.h"
#include "executor/agent.h"
#include "runner/process_runner.h"
#include "http/metrics_endpoints.h"
#include "absl/strings/match.h"
#include "config.h"
#include "executor_commands.h"
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

// --server and --token; and --config, unless the command has one already (`config_path` null).
void AddConnection(CLI::App* cmd, minions::cli::Connection* connection, std::string* config_path) {
  cmd->add_option("--server", connection->server,
                  "server address (default: MINIONS_SERVER, else [executor] server of the config file, else "
                  "127.0.0.1:7070)");
  cmd->add_option("--token", connection->token, "access token (or MINIONS_TOKEN)");
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
      {"The fleet", {"executors", "drain"}},
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
  options.executor_timeout = ttl * 3;
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
  minions::ServerOptions options;
  options.listen = config.listen;
  options.http_listen = config.http_listen == "off" ? "" : config.http_listen;
  options.token = config.token;
  options.lease_ttl = absl::Milliseconds(config.lease_ttl_ms);
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
  minions::MinionsServer server(backends->store.get(), backends->blobs.get(), &clock, options, std::move(watchdog));
  if (config.watchdog) server.SetWatchdogLockSource([config] { return minions::apps::TryAcquireWatchdog(config); });
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
  minions::HttpServer http;
  if (!http_listen.empty()) {
    minions::InstallMetricsEndpoints(&registry, &http);
    if (auto s = http.Start(http_listen); !s.ok()) {
      fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  InstallSignalHandlers();
  const minions::WatchdogOptions options = WatchdogOptionsOf(config);
  std::unique_ptr<minions::Watchdog> watchdog;
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
    clock.SleepFor(options.interval);
  }
  return 0;
}

int RunConfigCheck(const minions::apps::MinionsConfig& config, bool connect) {
  auto problems = minions::apps::CheckConfig(config, connect);
  printf("configuration%s\n", config.source.empty() ? " (no file; defaults and environment)" : (" from " + config.source).c_str());
  printf("  http      %s\n", config.http_listen.empty() || config.http_listen == "off" ? "off" : config.http_listen.c_str());
  printf("  server    listen %s, lease ttl %lld ms, watchdog %s, token %s\n", config.listen.c_str(),
         static_cast<long long>(config.lease_ttl_ms), config.watchdog ? "on" : "off", config.token.empty() ? "none" : "set");
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

int RunExecutor(const minions::cli::Connection& connection, minions::AgentOptions options,
                minions::ProcessRunner::Options runner, bool exit_with_parent,
                const minions::AvailabilityOptions& availability, minions::UrlPolicy url_policy) {
#ifdef __linux__
  if (exit_with_parent) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() == 1) return 0;
  }
#endif
  minions::SetLogComponent("executor");
  minions::RealClock clock;
  std::string state_dir = options.state_dir;
  minions::ExecutorAgent agent(std::move(options), minions::MakeGrpcControlPlaneClient(connection.server, connection.token),
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
  printf("pool up: server %s with %d executors (data in %s)\n"
         "  submit:    minions submit FILE --model PATH --server %s\n",
         (*pool)->address().c_str(), (*pool)->executor_count(), options.data_dir.c_str(), (*pool)->address().c_str());
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Minions: a virtual GPU cloud made of idle machines, for batch inference"};
  app.set_version_flag("--version", std::string("minions ") + minions::kVersion);
  app.require_subcommand(0, 1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "debug logging");

  minions::cli::Connection connection;
  bool json = false;
  std::string home = minions::cli::MinionsHome();

  // --- processes ---
  // Flags override the environment, which overrides the config file (see apps/config.h).
  std::string config_path, flag_listen, flag_http_listen, flag_data_dir, flag_token, flag_database, flag_objects;
  int64_t flag_ttl_ms = 0, flag_straggler_ms = -1;
  bool no_watchdog = false;
  auto* server_cmd = app.add_subcommand("server", "run the control plane (gRPC API, watchdog)");
  server_cmd->add_option("--config", config_path, "TOML config file (or MINIONS_CONFIG)");
  server_cmd->add_option("--listen", flag_listen, "address to serve on (default 127.0.0.1:7070)");
  server_cmd->add_option("--http-listen", flag_http_listen,
                         "HTTP address for /metrics, /healthz, /readyz and the dashboard; off: none (default 127.0.0.1:7080)");
  server_cmd->add_option("--data-dir", flag_data_dir, "SQLite database and objects (default ~/.minions/server)");
  server_cmd->add_option("--database", flag_database, "postgresql://... or sqlite:/path (default: SQLite in the data dir)");
  server_cmd->add_option("--objects", flag_objects, "s3://bucket/prefix or a directory (default: in the data dir)");
  server_cmd->add_option("--token", flag_token, "require this token from clients and executors");
  server_cmd->add_option("--lease-ttl-ms", flag_ttl_ms, "lease TTL; executors heartbeat every third (default 9000)");
  server_cmd->add_flag("--no-watchdog", no_watchdog, "leave the watchdog to a `minions watchdog` process");
  server_cmd->add_option("--straggler-min-runtime-ms", flag_straggler_ms,
                         "a straggler gets a backup attempt only after running this long (default 30000)");

  auto* watchdog_cmd = app.add_subcommand("watchdog", "run the watchdog alone (one is active at a time)");
  watchdog_cmd->add_option("--config", config_path, "TOML config file (or MINIONS_CONFIG)");
  watchdog_cmd->add_option("--data-dir", flag_data_dir, "the server's data directory");
  watchdog_cmd->add_option("--database", flag_database, "the servers' database");
  watchdog_cmd->add_option("--lease-ttl-ms", flag_ttl_ms, "the servers' lease TTL");
  std::string watchdog_http_listen;
  watchdog_cmd->add_option("--http-listen", watchdog_http_listen, "serve /metrics and /healthz here (default: none)");

  bool connect = false;
  auto* config_cmd = app.add_subcommand("config", "configuration tools");
  auto* config_check_cmd = config_cmd->add_subcommand("check", "say what is wrong with the configuration");
  config_cmd->require_subcommand(1);
  config_check_cmd->add_option("--config", config_path, "TOML config file (or MINIONS_CONFIG)");
  config_check_cmd->add_option("--database", flag_database, "override the database");
  config_check_cmd->add_option("--objects", flag_objects, "override the object store");
  config_check_cmd->add_flag("--connect", connect, "also connect to the database and the object store");

  minions::AgentOptions agent_options;
  minions::ProcessRunner::Options runner_options;
  std::string runner_program, executor_metrics_listen;
  bool exit_with_parent = false;
  auto* executor_cmd = app.add_subcommand("executor", "run the agent that leases and runs tasks on this machine");
  AddConnection(executor_cmd, &connection, nullptr);  // its --config comes with the availability flags
  executor_cmd->add_option("--name", agent_options.name, "name shown in `minions executors` (default: host name)");
  executor_cmd->add_option("--state-dir", agent_options.state_dir, "keeps the executor id across restarts");
  executor_cmd->add_option("--runner", runner_program, "runner program (default: minions-llama-runner)");
  executor_cmd->add_option("--runner-log", runner_options.stderr_path, "file for the runner's log");
  executor_cmd->add_option("--metrics-listen", executor_metrics_listen,
                           "serve this executor's /metrics on host:port (default: none)");
  executor_cmd->add_flag("--exit-with-parent", exit_with_parent, "exit when the parent process does (Linux)");
  executor_cmd->add_option("--runner-threads", agent_options.runner_threads,
                           "CPU threads for the runner when the job does not set them (default: all cores but one)");
  int64_t checkpoint_interval_ms = absl::ToInt64Milliseconds(agent_options.checkpoint_interval);
  executor_cmd->add_option("--checkpoint-records", agent_options.checkpoint_records,
                           "upload a task's finished records as a checkpoint every this many records")
      ->capture_default_str();
  executor_cmd->add_option("--checkpoint-interval-ms", checkpoint_interval_ms,
                           "... or this often, whichever comes first")
      ->capture_default_str();
  int64_t runner_hang_ms = absl::ToInt64Milliseconds(agent_options.hang.min_silence);
  executor_cmd->add_option("--runner-hang-ms", runner_hang_ms,
                           "a runner holding work and silent this long (and 10x its slowest record) is killed as hung")
      ->capture_default_str();
  minions::apps::ExecutorFlags executor_flags;
  std::string owner_state_dir;
  minions::apps::AddExecutorCommands(executor_cmd, &executor_flags, &owner_state_dir);

  minions::cli::PoolOptions pool_options;
  pool_options.data_dir = home + "/pool";
  pool_options.listen = "127.0.0.1:7070";
  pool_options.http_listen = "127.0.0.1:7080";
  auto* up_cmd = app.add_subcommand("up", "run a whole pool on this machine: server, watchdog, executors");
  up_cmd->add_option("--executors", pool_options.executors, "executor processes")->capture_default_str();
  up_cmd->add_option("--listen", pool_options.listen, "server address")->capture_default_str();
  up_cmd->add_option("--http-listen", pool_options.http_listen, "dashboard and metrics address (off: none)")
      ->capture_default_str();
  up_cmd->add_option("--data-dir", pool_options.data_dir, "database, objects, logs")->capture_default_str();
  up_cmd->add_option("--models", pool_options.model_folders,
                     "a folder the executors may load models from (repeat; default ~/.minions/models)");

  // --- client verbs ---
  minions::cli::SubmitOptions submit;
  int parallel = 0;
  auto* submit_cmd = app.add_subcommand("submit", "submit a JSONL batch file; prints the job id");
  AddConnection(submit_cmd, &connection, &config_path);
  submit_cmd->add_option("file", submit.input_path, "OpenAI Batch request lines (JSONL)")->required();
  submit_cmd->add_option("--model", submit.model, "model the executors load (a GGUF path)")->required();
  submit_cmd->add_option("--shard-size", submit.shard_size, "records per task (default 100)");
  submit_cmd->add_option("--max-attempts", submit.max_attempts, "failures before a task fails (default 4)");
  submit_cmd->add_option("--priority", submit.priority, "higher runs first");
  submit_cmd->add_option("--team", submit.team, "owner team");
  submit_cmd->add_option("--parallel", parallel, "sequences each runner decodes together");
  submit_cmd->add_option("--runner-options", submit.runner_options_json, "runner load options as JSON");
  submit_cmd->add_option("--completion-window", submit.completion_window,
                         "deadline after submission (24h, 90m); the job then expires with what it finished");
  submit_cmd->add_flag("--wait", submit.wait, "watch the job until it ends");
  submit_cmd->add_flag("--json", submit.json, "JSON output");

  std::string job_id, state_filter, output_path, executor_id;
  bool errors = false, show_tasks = false;
  auto* jobs_cmd = app.add_subcommand("jobs", "list jobs, newest first");
  AddConnection(jobs_cmd, &connection, &config_path);
  jobs_cmd->add_option("--state", state_filter, "only jobs in this state");
  jobs_cmd->add_flag("--json", json, "JSON output");
  auto* status_cmd = app.add_subcommand("status", "one job: state, request counts, where its results are");
  AddConnection(status_cmd, &connection, &config_path);
  status_cmd->add_option("job", job_id, "job id")->required();
  status_cmd->add_flag("--tasks", show_tasks, "list the job's tasks");
  status_cmd->add_flag("--json", json, "JSON output");
  auto* watch_cmd = app.add_subcommand("watch", "progress bar with rate and ETA until the job ends");
  AddConnection(watch_cmd, &connection, &config_path);
  watch_cmd->add_option("job", job_id, "job id")->required();
  watch_cmd->add_flag("--json", json, "one JSON progress line per update");
  auto* results_cmd = app.add_subcommand("results", "the merged output (or error) file of a completed job");
  AddConnection(results_cmd, &connection, &config_path);
  results_cmd->add_option("job", job_id, "job id")->required();
  results_cmd->add_option("-o,--output", output_path, "file to write (default: standard output)");
  results_cmd->add_flag("--errors", errors, "the error file instead");
  auto* cancel_cmd = app.add_subcommand("cancel", "cancel a job; executors stop its tasks within a heartbeat");
  AddConnection(cancel_cmd, &connection, &config_path);
  cancel_cmd->add_option("job", job_id, "job id")->required();
  cancel_cmd->add_flag("--json", json, "JSON output");
  auto* executors_cmd = app.add_subcommand("executors", "the fleet: each executor's state and current tasks");
  AddConnection(executors_cmd, &connection, &config_path);
  executors_cmd->add_flag("--json", json, "JSON output");
  auto* drain_cmd = app.add_subcommand("drain", "ask an executor to finish its task and take no more");
  AddConnection(drain_cmd, &connection, &config_path);
  drain_cmd->add_option("executor", executor_id, "executor id")->required();
  drain_cmd->add_flag("--json", json, "JSON output");

  // --- the main job and the server-less path ---
  minions::cli::DemoOptions demo;
  demo.workdir = home + "/demo";
  auto* demo_cmd = app.add_subcommand("demo", "the main job: a pool of 2 executors runs a batch end to end");
  demo_cmd->add_option("--workdir", demo.workdir, "where the model, input, output and pool data go")->capture_default_str();
  demo_cmd->add_option("--records", demo.records, "number of sample records")->capture_default_str();
  demo_cmd->add_option("--executors", demo.executors, "executor processes")->capture_default_str();

  minions::cli::LocalRunOptions local;
  auto* local_cmd = app.add_subcommand("local-run", "run a JSONL file through one runner on this machine, no server");
  local_cmd->add_option("input", local.input_path, "OpenAI Batch request lines (JSONL)")->required();
  local_cmd->add_option("--model", local.model_path, "GGUF model file")->required();
  local_cmd->add_option("-o,--output", local.output_path, "output lines")->required();
  local_cmd->add_option("--errors", local.errors_path, "error lines (default: OUTPUT.errors.jsonl)");
  local_cmd->add_option("--runner", local.runner, "runner program (default: minions-llama-runner)");
  local_cmd->add_option("--batch-size", local.batch_size, "records per runner batch")->capture_default_str();
  local_cmd->add_flag("!--no-progress", local.progress, "no progress line");
  AddLoadOptions(local_cmd, &local.load);

  CLI11_PARSE(app, argc, argv);
  if (verbose) minions::SetLogLevel(minions::LogLevel::kDebug);
  if (app.get_subcommands().empty()) {
    PrintVerbs(app);
    return 0;
  }
  // The processes that keep data (databases, objects, state, logs) create it for their own account
  // only; the client verbs leave the user's umask alone (their output files are the user's).
  if (server_cmd->parsed() || watchdog_cmd->parsed() || executor_cmd->parsed() || up_cmd->parsed() ||
      demo_cmd->parsed()) {
    minions::UsePrivateUmask();
  }
  connection.FromEnvironment();

  // Where the client verbs and the executor find the server: --server, else MINIONS_SERVER, else
  // [executor] server in the config file, else the default; messages say which it was. The
  // executor also takes its other [executor] settings from the file where no flag gives them.
  std::optional<minions::apps::MinionsConfig> client_config;
  for (CLI::App* cmd : {submit_cmd, jobs_cmd, status_cmd, watch_cmd, results_cmd, cancel_cmd, executors_cmd,
                        drain_cmd, executor_cmd}) {
    if (!cmd->parsed()) continue;
    auto config = minions::apps::LoadConfig(cmd == executor_cmd ? executor_flags.config_path : config_path);
    if (!config.ok()) {
      fprintf(stderr, "error: %s\n", std::string(config.status().message()).c_str());
      return 1;
    }
    if (cmd->count("--server") > 0) {
      connection.server_source = "--server";
    } else {
      connection.server = config->server;
      connection.server_source = config->server_source;
    }
    client_config = *std::move(config);
  }

  auto load_config = [&]() -> absl::StatusOr<minions::apps::MinionsConfig> {
    auto config = minions::apps::LoadConfig(config_path);
    if (!config.ok()) return config;
    if (!flag_listen.empty()) config->listen = flag_listen;
    if (!flag_http_listen.empty()) config->http_listen = flag_http_listen;
    if (!flag_data_dir.empty()) config->data_dir = flag_data_dir;
    if (!flag_database.empty()) config->database = flag_database;
    if (!flag_objects.empty()) config->objects = flag_objects;
    if (!flag_token.empty()) config->token = flag_token;
    if (flag_ttl_ms > 0) config->lease_ttl_ms = flag_ttl_ms;
    if (flag_straggler_ms >= 0) config->straggler_min_runtime_ms = flag_straggler_ms;
    if (no_watchdog) config->watchdog = false;
    return config;
  };
  if (server_cmd->parsed() || watchdog_cmd->parsed() || config_check_cmd->parsed()) {
    auto config = load_config();
    if (!config.ok()) {
      fprintf(stderr, "error: %s\n", std::string(config.status().message()).c_str());
      return 1;
    }
    if (config_check_cmd->parsed()) return RunConfigCheck(*config, connect);
    auto problems = minions::apps::CheckConfig(*config, false);
    if (!problems.empty()) {
      for (const auto& p : problems) fprintf(stderr, "error: %s\n", p.c_str());
      return 1;
    }
    minions::SetLogComponent(server_cmd->parsed() ? "server" : "watchdog");
    return server_cmd->parsed() ? RunServer(*config) : RunWatchdog(*config, watchdog_http_listen);
  }
  if (executor_cmd->parsed()) {
    if (auto code = minions::apps::RunOwnerVerb(executor_flags, owner_state_dir)) return *code;
    auto availability = minions::apps::LoadAvailability(executor_flags);
    if (!availability.ok()) {
      fprintf(stderr, "error: %s\n", std::string(availability.status().message()).c_str());
      return 1;
    }
    if (executor_cmd->count("--name") == 0 && !client_config->executor_name.empty()) {
      agent_options.name = client_config->executor_name;
    }
    if (executor_cmd->count("--state-dir") == 0 && !client_config->executor_state_dir.empty()) {
      agent_options.state_dir = client_config->executor_state_dir;
    }
    if (runner_program.empty()) runner_program = client_config->runner;
    if (executor_cmd->count("--runner-threads") == 0) agent_options.runner_threads = client_config->runner_threads;
    if (!runner_program.empty()) runner_options.command = {runner_program};
    agent_options.checkpoint_interval = absl::Milliseconds(checkpoint_interval_ms);
    agent_options.hang.min_silence = absl::Milliseconds(runner_hang_ms);
    if (agent_options.runner_threads == 0) {
      // Leave a core to the machine's owner and to this agent (see docs/architecture.md).
      agent_options.runner_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1);
    }
    minions::ExecutorMetrics executor_metrics;
    if (!executor_metrics_listen.empty()) {
      if (auto s = executor_metrics.Serve(executor_metrics_listen); !s.ok()) {
        fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
        return 1;
      }
      agent_options.metrics = &executor_metrics;
    }
    // Trust nothing sent: object URLs, model paths, the runner's confinement (executor_commands.cc).
    // The runner's command and environment are decided here (ProcessRunner::Options).
    if (runner_options.command.empty()) runner_options.command = {minions::SiblingProgram("minions-llama-runner")};
    auto url_policy = minions::apps::ApplyExecutorTrust(executor_flags, connection.server, &agent_options,
                                                        &runner_options);
    if (!url_policy.ok()) {
      fprintf(stderr, "error: %s\n", std::string(url_policy.status().message()).c_str());
      return 1;
    }
    return RunExecutor(connection, agent_options, runner_options, exit_with_parent, *availability,
                       *std::move(url_policy));
  }
  if (up_cmd->parsed()) return RunUp(pool_options);
  if (submit_cmd->parsed()) {
    if (parallel > 0 && submit.runner_options_json.empty()) {
      submit.runner_options_json = "{\"n_parallel\": " + std::to_string(parallel) + "}";
    }
    return minions::cli::Submit(connection, submit);
  }
  if (jobs_cmd->parsed()) return minions::cli::ListJobs(connection, state_filter, json);
  if (status_cmd->parsed()) return minions::cli::Status(connection, job_id, json, show_tasks);
  if (watch_cmd->parsed()) return minions::cli::Watch(connection, job_id, json);
  if (results_cmd->parsed()) return minions::cli::Results(connection, job_id, output_path, errors);
  if (cancel_cmd->parsed()) return minions::cli::Cancel(connection, job_id, json);
  if (executors_cmd->parsed()) return minions::cli::ListExecutors(connection, json);
  if (drain_cmd->parsed()) return minions::cli::DrainExecutor(connection, executor_id, json);
  if (demo_cmd->parsed()) {
    // The pool's server logs go to a file; the demo's own output stays readable.
    return minions::cli::RunDemo(demo, minions::apps::StartLocalPool);
  }
  if (local_cmd->parsed()) {
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
  return 0;
}
