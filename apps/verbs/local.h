#pragma once
// The verbs that run everything on this machine: `minions up` (a pool), `minions demo` and
// `minions local-run` (no server).

#include "CLI/CLI.hpp"
#include "cli/demo.h"
#include "cli/local_run.h"
#include "cli/pool.h"
#include "verbs/shared.h"

namespace minions::apps {

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

void AddUpVerb(CLI::App& app, const SharedFlags& shared, LocalVerbs* l);
// `demo` and `local-run`: the main job and the server-less path.
void AddDemoAndLocalRun(CLI::App& app, const SharedFlags& shared, LocalVerbs* l);

// Runs `up` until SIGTERM/SIGINT.
int RunUp(const minions::cli::PoolOptions& options);
int RunLocalRun(minions::cli::LocalRunOptions local);

}  // namespace minions::apps
