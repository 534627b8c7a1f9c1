#include "verbs/executor.h"

#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "cli/credentials.h"
#include "common/host_port.h"
#include "common/logging.h"
#include "executor/control_plane_client.h"
#include "executor/failover_client.h"
#include "executor/runner_devices.h"
#include "rpc/tls.h"

namespace minions::apps {
namespace {

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
  // The executor's identity: its credential, in its state folder (mode 0600).
  minions::ExecutorCredentials credentials;
  credentials.credential_file =
      (state_dir.empty() ? minions::apps::DefaultExecutorStateDir() : state_dir) + "/credential";
  credentials.join_token = *join_token;
  // --server A,B,...: the servers of one fleet, the next used when one is gone
  // (executor/failover_client.h). Each address is checked now, not at the failover.
  std::vector<std::string> servers = absl::StrSplit(connection.server, ',', absl::SkipWhitespace());
  for (std::string& server : servers) server = std::string(absl::StripAsciiWhitespace(server));
  if (servers.empty()) {
    fprintf(stderr, "error: --server names no address\n");
    return 1;
  }
  auto open = [tls = connection.tls, credentials](const std::string& address)
      -> absl::StatusOr<std::unique_ptr<minions::ControlPlaneClient>> {
    auto channel = minions::rpc::OpenChannel(address, tls, minions::rpc::ChannelUse::kExecutor);
    if (!channel.ok()) return channel.status();
    return minions::MakeGrpcControlPlaneClient(*channel, credentials);
  };
  for (const std::string& server : servers) {
    if (auto channel = minions::rpc::OpenChannel(server, connection.tls, minions::rpc::ChannelUse::kExecutor);
        !channel.ok()) {
      fprintf(stderr, "error: %s\n", std::string(channel.status().message()).c_str());
      return 1;
    }
  }
  std::unique_ptr<minions::ControlPlaneClient> control;
  if (servers.size() == 1) {
    control = *open(servers.front());
  } else {
    control = std::make_unique<minions::FailoverControlPlaneClient>(servers, open, &clock);
  }
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
  minions::ExecutorAgent agent(std::move(options), std::move(control),
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
      int now = SignalsReceived();
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

}  // namespace

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
  // The accelerator as the runner's llama.cpp sees it (a Vulkan, CUDA or Metal device), asked of
  // the runner started as every runner is (confined, with its environment); a runner that cannot
  // say leaves it to the probes in capabilities.cc.
  auto devices = minions::QueryRunnerDevices(runner_options.command, runner_options.environment);
  if (devices.ok()) {
    agent_options.accelerator = minions::AcceleratorFromDevices(*devices);
    if (!agent_options.accelerator) agent_options.accelerator = minions::Accelerator{};  // the CPU alone
    MINIONS_LOG(Info) << "accelerator: " << agent_options.accelerator->kind
                      << (agent_options.accelerator->name.empty() ? "" : " (" + agent_options.accelerator->name + ")");
  } else {
    MINIONS_LOG(Info) << "the runner lists no devices (" << devices.status().message()
                      << "); the accelerator is probed directly";
  }
  return RunExecutor(*connection, agent_options, runner_options, e->exit_with_parent, *availability,
                     *std::move(url_policy), e->join_token_file);
}

}  // namespace minions::apps
