#pragma once
// `minions demo`: the README's main job. Makes a test model and sample prompts when absent, runs
// the batch, prints a few results and where the rest are.

#include <string>

#include "runner/protocol.h"

namespace minions::cli {

struct DemoOptions {
  std::string workdir;  // models/, input and output files live here
  size_t records = 200;
  runner_protocol::LoadOptions load;
};

// Returns the process exit code: 0 when every well-formed record was served.
int RunDemo(const DemoOptions& options);

// ${MINIONS_HOME:-$HOME/.minions}
std::string MinionsHome();

}  // namespace minions::cli
