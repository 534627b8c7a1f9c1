#pragma once
// The client verbs: submit, jobs, status, watch, results, cancel, executors (revoke, release), teams, models,
// whoami and drain. They talk to a server with a token (src/cli/client_verbs.h does the talking).

#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "cli/client_verbs.h"
#include "cli/model_verbs.h"
#include "verbs/shared.h"

namespace minions::apps {

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
  CLI::App* release_executor_cmd = nullptr;
  CLI::App* approve_executor_cmd = nullptr;
  CLI::App* whoami_cmd = nullptr;
  CLI::App* drain_cmd = nullptr;  // AddDrainVerb
  minions::cli::ModelOptions model;
  CLI::App* models_cmd = nullptr;
  CLI::App* models_push_cmd = nullptr;
  CLI::App* models_list_cmd = nullptr;
  CLI::App* models_show_cmd = nullptr;
  CLI::App* models_rm_cmd = nullptr;
};

// submit, jobs, status, watch, results, cancel, executors (revoke, release) and whoami.
void AddClientVerbs(CLI::App& app, SharedFlags* shared, ClientVerbs* c);
// `drain`, registered after `pki` (the order of --help).
void AddDrainVerb(CLI::App& app, SharedFlags* shared, ClientVerbs* c);
// Runs the client verb parsed among submit ... whoami (not drain); nullopt: none of them.
std::optional<int> RunClientVerb(ClientVerbs* c, const minions::cli::Connection& connection, bool json);

}  // namespace minions::apps
