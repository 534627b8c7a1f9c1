#pragma once
// `minions demo`: the README's main job. Starts a pool on this machine (a server and two
// executors), makes a test model and sample prompts when absent, submits them as one job, shows
// its progress, prints a few results and where the rest are.

#include <string>

#include "cli/pool.h"

namespace minions::cli {

struct DemoOptions {
  std::string workdir;  // models/, input, output, and the pool's data
  size_t records = 200;
  int executors = 2;
  int64_t shard_size = 25;
  std::string runner_options_json = R"({"n_parallel": 8})";
};

// Returns the process exit code: 0 when the job completed with every well-formed record served.
int RunDemo(const DemoOptions& options, const PoolFactory& start_pool);

// ${MINIONS_HOME:-$HOME/.minions}
std::string MinionsHome();

// Makes the demo's test model at `path` (minions-make-test-model) unless it exists.
bool EnsureTestModel(const std::string& path);

}  // namespace minions::cli
