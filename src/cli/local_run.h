#pragma once
// Running a JSONL file through a runner on this machine, with no server: the reference path that
// the distributed system is measured against, and (until the control plane lands) the main job.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "runner/protocol.h"

namespace minions::cli {

struct LocalRunOptions {
  std::string input_path;   // OpenAI Batch request lines
  std::string model_path;   // GGUF
  std::string output_path;  // output lines of served records, in input order
  std::string errors_path;  // error lines, in input order
  std::string runner;       // runner program; empty: minions-llama-runner next to this binary
  std::string runner_log;   // runner's stderr; empty: inherit
  size_t batch_size = 256;  // records per runner batch
  runner_protocol::LoadOptions load;
  bool progress = true;     // print a progress line to stderr
};

struct LocalRunSummary {
  size_t records = 0;
  size_t errors = 0;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double seconds = 0;       // from the first batch sent to the last result (model load excluded)
  double load_seconds = 0;
};

absl::StatusOr<LocalRunSummary> RunLocally(const LocalRunOptions& options);

// The program that serves records: `runner` if set, else minions-llama-runner beside this binary.
std::string DefaultRunnerProgram();

}  // namespace minions::cli
