#pragma once
// `minions executor` and its owner verbs: wiring of the agent, the availability controller and
// the control channel, and the verbs pause, resume, status, activity, dry-run and install.

#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "config.h"
#include "executor/agent.h"
#include "executor/availability_controller.h"
#include "executor/control_channel.h"
#include "executor/owner_controls.h"
#include "executor/url_policy.h"
#include "executor/runner_sandbox.h"
#include "runner/process_runner.h"

namespace minions::apps {

struct ExecutorFlags {
  std::string config_path;
  // Trust nothing sent (see ApplyExecutorTrust).
  std::vector<std::string> objects;           // --objects
  std::vector<std::string> models;            // --models
  std::vector<std::string> runner_env;        // --runner-env NAME=VALUE
  std::string runner_sandbox = "auto";        // --runner-sandbox auto|on|required|off
  std::string availability_mode;              // --availability
  std::vector<std::string> availability_set;  // --availability-set key=value
  std::string control_dir;                    // state dir for the owner verbs
  InstallOptions install;
  std::string install_output;                 // "": print
  CLI::App* pause = nullptr;
  CLI::App* resume = nullptr;
  CLI::App* status = nullptr;
  CLI::App* activity = nullptr;
  CLI::App* dry_run = nullptr;
  CLI::App* install_cmd = nullptr;
};

// Where the executor keeps registry models (executor/model_cache.h): STATE_DIR/model-cache.
std::string ModelCacheDir(const std::string& state_dir);

// Adds the availability flags and the owner verbs to the `executor` command.
void AddExecutorCommands(CLI::App* executor, ExecutorFlags* flags, std::string* state_dir);
// Runs an owner verb if one was given; nullopt: none (run the agent).
std::optional<int> RunOwnerVerb(const ExecutorFlags& flags, const std::string& state_dir);
// The availability settings from the config file, the environment and the flags.
absl::StatusOr<AvailabilityOptions> LoadAvailability(const ExecutorFlags& flags);

// The owner's side of a running agent: the controller and its control channel.
class OwnerSide {
 public:
  // Null when availability is off.
  static absl::StatusOr<std::unique_ptr<OwnerSide>> Start(const AvailabilityOptions& options, ExecutorAgent* agent,
                                                          Clock* clock, const std::string& state_dir);
  ~OwnerSide();

 private:
  std::unique_ptr<AvailabilityController> controller_;
  std::unique_ptr<ControlChannel> channel_;
};

// The state directory an executor uses when none is given (its control socket lives there).
std::string DefaultExecutorStateDir();

// What an executor trusts, from its flags and config file: the object URLs it follows (default,
// for a server on this machine: the default server's objects folder; a server elsewhere needs
// --objects), the model folders it loads from (default: its state folder's models folder, or
// ~/.minions/models without one), and how its runner is
// confined (sandbox on by default; "required" refuses to run a runner without Landlock). Sets
// agent->models and wraps runner->command in the sandbox; returns the URL policy for the blob client.
absl::StatusOr<UrlPolicy> ApplyExecutorTrust(const ExecutorFlags& flags, const std::string& server,
                                            AgentOptions* agent, ProcessRunner::Options* runner);

}  // namespace minions::apps
