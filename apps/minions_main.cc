// minions: one binary, subcommands. main() registers the verb groups (apps/verbs/: one file per
// group, each an Add* and a Run*) and runs the verb parsed; the verbs' work lives in src/cli, the
// server in src/server, the executor in src/executor.

#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "cli/demo.h"
#include "common/logging.h"
#include "common/private_files.h"
#include "config.h"
#include "local_pool.h"
#include "minions/version.h"
#include "verbs/admin.h"
#include "verbs/client.h"
#include "verbs/executor.h"
#include "verbs/local.h"
#include "verbs/process.h"
#include "verbs/shared.h"

namespace minions::apps {
namespace {

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

// Where the client verbs and the executor find the server: --server, else MINIONS_SERVER, else
// [executor] server in the config file, else the default; messages say which it was. The
// executor also takes its other [executor] settings from the file where no flag gives them.
// Sets `client_config` to the file read for the verb parsed (left unset when none of these was).
absl::Status LoadClientConfig(const ClientVerbs& c, const AdminVerbs& a, const ExecutorVerb& e,
                              SharedFlags* shared, std::optional<minions::apps::MinionsConfig>* client_config) {
  minions::cli::Connection& connection = shared->connection;
  for (CLI::App* cmd : {c.submit_cmd, c.jobs_cmd, c.status_cmd, c.watch_cmd, c.results_cmd, c.cancel_cmd,
                        c.executors_cmd, c.teams_cmd, c.drain_cmd, c.revoke_executor_cmd, c.release_executor_cmd,
                        c.approve_executor_cmd, c.whoami_cmd, c.models_cmd,
                        c.models_push_cmd, c.models_list_cmd, c.models_show_cmd, c.models_rm_cmd, a.admin_cmd,
                        e.executor_cmd}) {
    if (!cmd->parsed()) continue;
    // `models VERB` is parsed as both: the sub-verb's own --server is the one to honour.
    if (cmd == c.models_cmd && (c.models_push_cmd->parsed() || c.models_list_cmd->parsed() ||
                                c.models_show_cmd->parsed() || c.models_rm_cmd->parsed())) {
      continue;
    }
    // `executors revoke|release|approve` is parsed as both: the sub-verb's own --server is the one to honour.
    if (cmd == c.executors_cmd && (c.revoke_executor_cmd->parsed() || c.release_executor_cmd->parsed() ||
                                   c.approve_executor_cmd->parsed())) {
      continue;
    }
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

int Main(int argc, char** argv) {
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
  // One help screen: `minions --help` prints what a bare `minions` does (the verbs' own --help,
  // copied when they were added, stays CLI11's).
  bool help = false;
  app.set_help_flag();
  app.add_flag("-h,--help", help, "the verbs, grouped (minions VERB --help says more)");

  CLI11_PARSE(app, argc, argv);
  if (verbose) minions::SetLogLevel(minions::LogLevel::kDebug);
  if (help || app.get_subcommands().empty()) {
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

}  // namespace
}  // namespace minions::apps

int main(int argc, char** argv) { return minions::apps::Main(argc, argv); }
