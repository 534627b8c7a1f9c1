#pragma once
// `minions executor`: the agent that leases and runs tasks on this machine, and its owner verbs
// (apps/executor_commands.h).

#include <cstdint>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "config.h"
#include "executor/agent.h"
#include "executor_commands.h"
#include "runner/process_runner.h"
#include "verbs/shared.h"

namespace minions::apps {

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

void AddExecutorVerb(CLI::App& app, SharedFlags* shared, ExecutorVerb* e);

// Runs `executor` (an owner verb, or the agent). `client_config`: the config file read for it
// (LoadClientConfig).
int RunExecutorVerb(ExecutorVerb* e, minions::cli::Connection* connection,
                    const std::optional<minions::apps::MinionsConfig>& client_config);

}  // namespace minions::apps
