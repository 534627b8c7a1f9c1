#include "executor_commands.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/subprocess.h"
#include "absl/strings/str_split.h"
#include "cli/demo.h"
#include "common/host_port.h"
#include "common/logging.h"
#include "model/model_ref.h"
#include "model/types.h"
#include "sandbox/sandbox.h"

namespace minions::apps {

std::string DefaultExecutorStateDir() { return cli::MinionsHome() + "/executor"; }

std::string ModelCacheDir(const std::string& state_dir) {
  std::error_code ec;
  return std::filesystem::absolute((state_dir.empty() ? DefaultExecutorStateDir() : state_dir) + "/model-cache", ec)
      .lexically_normal()
      .string();
}

namespace {

// host:port on this machine; for a list (--server A,B), every address of it.
bool IsLoopbackServer(const std::string& server) {
  for (absl::string_view address : absl::StrSplit(server, ',', absl::SkipWhitespace())) {
    address = absl::StripAsciiWhitespace(address);
    if (!absl::StartsWith(address, "unix:") && !IsLoopbackAddress(std::string(address))) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<UrlPolicy> ApplyExecutorTrust(const ExecutorFlags& flags, const std::string& server,
                                            AgentOptions* agent, ProcessRunner::Options* runner) {
  auto config = LoadConfig(flags.config_path);
  if (!config.ok()) return config.status();
  const bool loopback = IsLoopbackServer(server);
  UrlPolicyOptions urls;
  urls.loopback_server = loopback;
  urls.allowed = !flags.objects.empty() ? flags.objects : config->executor_objects;
  if (urls.allowed.empty()) {
    if (!loopback) {
      return absl::InvalidArgumentError(absl::StrCat(
          "this executor's server (", server, ") is on another machine: say where its objects are with "
          "--objects https://<the object store's host[:port]> (or [executor] objects in the config file); "
          "it follows no other URL"));
    }
    urls.allowed = {cli::MinionsHome() + "/server/objects"};  // `minions server`'s default
  }
  auto policy = UrlPolicy::Create(urls);
  if (!policy.ok()) return policy.status();
  ModelAccessOptions models;
  models.folders = !flags.models.empty() ? flags.models : config->executor_models;
  if (models.folders.empty()) {
    // The models folder of its state folder (a service's), or the user's own.
    models.folders = {agent->state_dir.empty() ? cli::MinionsHome() + "/models" : agent->state_dir + "/models"};
  }
  for (std::string& folder : models.folders) {
    std::error_code ec;
    if (!folder.empty() && folder[0] != '/') folder = std::filesystem::absolute(folder, ec).string();
  }
  auto access = ModelAccess::Create(models);
  if (!access.ok()) return access.status();
  agent->models = std::make_shared<const ModelAccess>(*std::move(access));
  absl::StatusOr<std::string> sandbox_mode = ResolveRunnerSandboxMode(flags.runner_sandbox, sandbox::LandlockAbi());
  if (!sandbox_mode.ok()) return sandbox_mode.status();
  RunnerSandboxOptions sandbox;
  sandbox.model_folders = agent->models->ReadableFolders();
  // The runner reads registry models from the cache too. The cache is not one of the folders a
  // job may name a path in (ModelAccess): a job would otherwise run another team's cached model
  // by naming its digest; a lease reaches a cached model only by its digest and the team's URL.
  // (Made now: the sandbox opens only folders that exist.)
  const std::string cache_dir = ModelCacheDir(agent->state_dir);
  std::error_code made_cache;
  std::filesystem::create_directories(cache_dir + "/sha256", made_cache);
  if (made_cache) {
    return absl::UnavailableError(absl::StrCat("cannot make the model cache ", cache_dir, ": ", made_cache.message()));
  }
  sandbox.model_folders.push_back(cache_dir);
  std::string state_dir = agent->state_dir.empty() ? DefaultExecutorStateDir() : agent->state_dir;
  std::error_code ec;
  sandbox.scratch_dir = std::filesystem::absolute(state_dir + "/runner-scratch", ec).lexically_normal().string();
  sandbox.env = flags.runner_env;
  sandbox.require_landlock = *sandbox_mode == "required";
  // Off (an owner's choice, for a platform where the sandbox gets in the way): the runner is not
  // confined, but still starts with an empty environment.
  sandbox.confine = *sandbox_mode != "off";
  auto made = RunnerSandbox::Create(sandbox);
  if (!made.ok()) return made.status();
  // Runners the owner declared ([runners] NAME = command), confined as the built-in one is.
  for (const auto& [name, command] : config->runners) {
    if (absl::Status valid = ValidateRunnerName(name); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("[runners] ", valid.message()));
    }
    if (name == "llama" || command.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "[runners] ", name, ": give a program (llama is the built-in runner; [executor] runner changes its program)"));
    }
    ProcessRunner::Options declared = *runner;
    declared.command = (*made)->Wrap(command);
    agent->declared_runners[name] = std::make_shared<ProcessRunnerFactory>(std::move(declared));
    agent->runners.push_back(name);
  }
  runner->connecting_command = [sandbox = *made, command = runner->command](const std::vector<int>& ports) {
    return sandbox->Wrap(command, ports);
  };
  runner->command = (*made)->Wrap(runner->command);
  // Said to the server (Capabilities.confinement), which shows it and may refuse this executor
  // work; and said here, so that the owner knows too.
  agent->confinement = sandbox::Confinement(sandbox.confine);
  if (agent->confinement == kConfinementPartial) {
    MINIONS_LOG(Warning) << "the runner is confined by seccomp only: this kernel has no Landlock (Linux 5.13 or "
                            "later, with landlock in lsm=); the server shows this executor as partially confined, "
                            "and a pool that requires confinement gives it no work";
  }
  if (agent->gang) {
    // A gang member's rpc-server is confined as a runner is, with no files and no environment:
    // it only listens on its loopback port behind the gate (docs/security.md 40.1d), in a network
    // of its own reached through a bridge (40.1e).
    agent->gang->rpc_wrap = [sandbox = *made](const std::vector<std::string>& argv, int port,
                                              const std::string& bridge) {
      return sandbox->WrapRpcServer(argv, port, bridge);
    };
  }
  if (sandbox.confine) {
    MINIONS_LOG(Info) << (*made)->Describe();
  } else {
    MINIONS_LOG(Warning) << "the runner runs unconfined (--runner-sandbox off), with an empty environment";
  }
  MINIONS_LOG(Info) << "objects from " << policy->Describe() << "; models from " << agent->models->Describe();
  return policy;
}

void AddExecutorCommands(CLI::App* executor, ExecutorFlags* flags, std::string* state_dir) {
  executor->add_option("--config", flags->config_path, "TOML config file (or MINIONS_CONFIG): [availability]");
  executor->add_option("--objects", flags->objects,
                       "where object URLs may point: the object store's origin (https://host[:port]) or, for a "
                       "server on this machine, its objects folder (repeat; default for a local server: "
                       "~/.minions/server/objects)");
  executor->add_option("--models", flags->models,
                       "a folder models may be loaded from (repeat; default: STATE_DIR/models, or "
                       "~/.minions/models without --state-dir)");
  executor->add_option("--runner-env", flags->runner_env,
                       "NAME=VALUE for the runner's otherwise empty environment (repeat)");
  executor->add_option("--runner-sandbox", flags->runner_sandbox,
                       "auto (default: required where the kernel's Landlock covers files and TCP, ABI 4 or "
                       "later; else on), on (confined as this kernel can: seccomp only without Landlock), required "
                       "(refuse to run a runner without Landlock), off")
      ->capture_default_str();
  executor->add_option("--availability", flags->availability_mode,
                       "owner (default: work only while the owner is away), dedicated (signals this machine "
                       "cannot give do not block), off");
  executor->add_option("--availability-set", flags->availability_set,
                       "availability setting, e.g. start_idle=2m (repeat; see docs/availability.md)");
  // Owner verbs: they talk to the executor running with the same --state-dir.
  auto verb = [&](const char* name, const char* help) {
    CLI::App* cmd = executor->add_subcommand(name, help);
    cmd->add_option("--state-dir", *state_dir, "the running executor's state directory (default ~/.minions/executor)");
    return cmd;
  };
  flags->pause = verb("pause", "take the machine back now: the executor yields until `resume`");
  flags->resume = verb("resume", "let the executor work again when the policy allows");
  flags->status = verb("status", "what the executor does, why, and the signals it reads");
  flags->activity = verb("activity", "report owner activity (as if a key were pressed): headless machines, tests");
  flags->dry_run = executor->add_subcommand("dry-run", "print what the policy would decide from live signals");
  flags->dry_run->add_option("--config", flags->config_path, "TOML config file (or MINIONS_CONFIG): [availability]");
  flags->dry_run->add_option("--availability", flags->availability_mode, "owner, dedicated or off");
  flags->dry_run->add_option("--availability-set", flags->availability_set, "availability setting key=value (repeat)");
  flags->install_cmd = executor->add_subcommand("install", "print (or write) a systemd unit or a LaunchDaemon plist");
  auto* i = flags->install_cmd;
  i->add_option("--platform", flags->install.platform, "linux or macos (default: this machine's)");
  i->add_option("--binary", flags->install.binary, "the path of the `minions` program to install")->capture_default_str();
  i->add_option("--server", flags->install.server, "server address")->capture_default_str();
  i->add_option("--state-dir", flags->install.state_dir, "executor state directory (default: the platform's)");
  i->add_option("--user", flags->install.user,
                "the executor's own account, made when missing (default: minions-executor; macOS: _minions)");
  i->add_option("--output", flags->install_output,
                "write the file here (e.g. " + ServiceFilePath(DefaultPlatform()) + ") instead of printing it");
  executor->require_subcommand(0, 1);
}

absl::StatusOr<AvailabilityOptions> LoadAvailability(const ExecutorFlags& flags) {
  AvailabilityOptions options;
  auto config = LoadConfig(flags.config_path);
  if (!config.ok()) return config.status();
  std::vector<std::pair<std::string, std::string>> settings = config->availability;
  if (!flags.availability_mode.empty()) settings.emplace_back("mode", flags.availability_mode);
  for (const std::string& kv : flags.availability_set) {
    std::vector<std::string> parts = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("--availability-set ", kv, ": expected key=value"));
    }
    settings.emplace_back(parts[0], parts[1]);
  }
  for (const auto& [key, value] : settings) {
    if (auto s = ApplyAvailabilitySetting(key, value, &options); !s.ok()) return s;
  }
  return options;
}

std::optional<int> RunOwnerVerb(const ExecutorFlags& flags, const std::string& state_dir_flag) {
  std::string state_dir = state_dir_flag.empty() ? DefaultExecutorStateDir() : state_dir_flag;
  for (auto [cmd, command] : {std::pair{flags.pause, "pause"}, {flags.resume, "resume"}, {flags.status, "status"},
                              {flags.activity, "activity"}}) {
    if (!cmd->parsed()) continue;
    auto answer = SendControlCommand(ControlSocketPath(state_dir), command);
    if (!answer.ok()) {
      fprintf(stderr, "error: %s\n", std::string(answer.status().message()).c_str());
      return 1;
    }
    fputs(answer->c_str(), stdout);
    return absl::StartsWith(*answer, "error:") ? 1 : 0;
  }
  if (flags.dry_run->parsed()) {
    auto options = LoadAvailability(flags);
    if (!options.ok()) {
      fprintf(stderr, "error: %s\n", std::string(options.status().message()).c_str());
      return 1;
    }
    RealClock clock;
    fputs(AvailabilityDryRun(*options, &clock).c_str(), stdout);
    return 0;
  }
  if (flags.install_cmd->parsed()) {
    auto text = ServiceFile(flags.install);
    if (!text.ok()) {
      fprintf(stderr, "error: %s\n", std::string(text.status().message()).c_str());
      return 1;
    }
    if (flags.install_output.empty()) {
      fputs(text->c_str(), stdout);
      return 0;
    }
    // The executor's own unprivileged account (and, on macOS, its folders): made when missing.
    auto commands = ServiceAccountCommands(flags.install, [](const std::string& user) { return getpwnam(user.c_str()) != nullptr; });
    if (!commands.empty() && geteuid() != 0) {
      fprintf(stderr, "error: the executor's account must be made first; as root, run this again, or:\n");
      for (const auto& argv : commands) fprintf(stderr, "  %s\n", absl::StrJoin(argv, " ").c_str());
      return 1;
    }
    for (const auto& argv : commands) {
      Subprocess::Options sp;
      sp.argv = argv;
      auto process = Subprocess::Start(sp);
      absl::StatusOr<ExitInfo> exit = process.ok() ? (*process)->Wait(absl::Minutes(1)) : process.status();
      if (!exit.ok() || !exit->exited || exit->code != 0) {
        fprintf(stderr, "error: %s failed%s\n", absl::StrJoin(argv, " ").c_str(),
                exit.ok() ? "" : (": " + std::string(exit.status().message())).c_str());
        return 1;
      }
      printf("ran: %s\n", absl::StrJoin(argv, " ").c_str());
    }
    std::ofstream out(flags.install_output, std::ios::trunc);
    out << *text;
    if (!out.good()) {
      fprintf(stderr, "error: cannot write %s\n", flags.install_output.c_str());
      return 1;
    }
    std::string platform = flags.install.platform.empty() ? DefaultPlatform() : flags.install.platform;
    printf("wrote %s; then: %s\n", flags.install_output.c_str(),
           platform == "macos" ? "sudo launchctl bootstrap system <the plist>"
                               : "sudo systemctl daemon-reload && sudo systemctl enable --now minions-executor");
    return 0;
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<OwnerSide>> OwnerSide::Start(const AvailabilityOptions& options, ExecutorAgent* agent,
                                                            Clock* clock, const std::string& state_dir_flag) {
  if (options.mode == AvailabilityOptions::Mode::kOff) return nullptr;
  auto side = std::unique_ptr<OwnerSide>(new OwnerSide());
  availability::ProbeOptions probes = options.probes;
  probes.own_pids = [agent] { return std::vector<int>{static_cast<int>(getpid()), agent->RunnerPid()}; };
  side->controller_ = std::make_unique<AvailabilityController>(options, availability::PlatformProbes(probes), clock);
  AvailabilityController* controller = side->controller_.get();
  controller->Attach(agent);
  controller->OnChange([agent] { agent->Wake(); });
  agent->SetWorkGate(controller);
  std::string state_dir = state_dir_flag.empty() ? DefaultExecutorStateDir() : state_dir_flag;
  auto channel = ControlChannel::Listen(ControlSocketPath(state_dir),
                                        [controller](const std::string& c) { return controller->HandleCommand(c); });
  if (!channel.ok()) {
    // The executor still yields to the owner's activity; only the hand controls are missing.
    MINIONS_LOG(Warning) << "no owner controls: " << channel.status().message();
  } else {
    side->channel_ = std::move(*channel);
  }
  controller->Start();
  MINIONS_LOG(Info) << "availability: " << controller->Reason() << " (mode " << WorkModeName(controller->mode())
                    << ")";
  return side;
}

OwnerSide::~OwnerSide() {
  if (channel_) channel_->Stop();
  if (controller_) controller_->Shutdown();
}

}  // namespace minions::apps
