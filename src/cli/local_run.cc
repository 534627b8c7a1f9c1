#include "cli/local_run.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/client_verbs.h"
#include "cli/output.h"
#include "common/subprocess.h"
#include "runner/batch_record.h"
#include "runner/runner_process.h"

namespace minions::cli {

std::string DefaultRunnerProgram() { return SiblingProgram("minions-llama-runner"); }

absl::StatusOr<LocalRunSummary> RunLocally(const LocalRunOptions& options) {
  errno = 0;
  std::ifstream input(options.input_path);
  if (!input || std::filesystem::is_directory(options.input_path)) return CannotRead(options.input_path, errno);
  std::ofstream output(options.output_path, std::ios::trunc);
  if (!output) return absl::PermissionDeniedError(absl::StrCat("cannot write '", options.output_path, "'"));
  std::ofstream errors(options.errors_path, std::ios::trunc);
  if (!errors) return absl::PermissionDeniedError(absl::StrCat("cannot write '", options.errors_path, "'"));

  RunnerProcess::Options runner_options;
  runner_options.command = {options.runner.empty() ? DefaultRunnerProgram() : options.runner};
  runner_options.stderr_path = options.runner_log;
  auto runner = RunnerProcess::Start(runner_options);
  if (!runner.ok()) return runner.status();
  LocalRunSummary summary;
  auto load_start = std::chrono::steady_clock::now();
  auto info = (*runner)->Load({options.model_path, options.load});
  if (!info.ok()) return info.status();
  summary.load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();

  // The records to come, counted first (a pass over the file) so the progress has a percentage
  // and an ETA, as `minions watch` shows.
  size_t total = 0;
  if (options.progress) {
    std::string counted;
    while (std::getline(input, counted)) total += !IsBlankLine(counted);
    input.clear();
    input.seekg(0);
  }
  const bool tty = isatty(STDERR_FILENO) != 0;
  auto start = std::chrono::steady_clock::now();
  std::vector<std::string> batch;
  size_t batch_number = 0;
  auto flush = [&]() -> absl::Status {
    if (batch.empty()) return absl::OkStatus();
    std::vector<std::optional<Json>> outputs(batch.size());
    auto done = (*runner)->RunBatch(absl::StrCat("b", batch_number++), batch,
                                    [&](size_t index, const Json& line) { outputs[index] = line; });
    if (!done.ok()) return done.status();
    for (size_t i = 0; i < batch.size(); ++i) {
      const Json& line = outputs[i] ? *outputs[i]
                                    : MakeErrorLine("", kErrorRunnerFailed, "the runner gave no result");
      bool is_error = IsErrorOutputLine(line);
      (is_error ? errors : output) << DumpJson(line) << '\n';
      summary.errors += is_error;
      ++summary.records;
    }
    const Json& usage = JsonField(*done, "usage");
    summary.prompt_tokens += JsonInt(usage, "prompt_tokens");
    summary.completion_tokens += JsonInt(usage, "completion_tokens");
    batch.clear();
    if (options.progress) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double rate = summary.records / std::max(secs, 1e-9);
      const double eta = rate > 0 ? static_cast<double>(total - std::min(total, summary.records)) / rate : -1;
      const std::string line =
          ProgressText(static_cast<int64_t>(summary.records), static_cast<int64_t>(total), rate, eta,
                       absl::StrCat(summary.errors, " error", summary.errors == 1 ? "" : "s"),
                       tty ? TerminalColumns(STDERR_FILENO) : 0);
      fprintf(stderr, tty ? "\r%s\033[K" : "%s\n", line.c_str());
      fflush(stderr);
    }
    return absl::OkStatus();
  };

  std::string line;
  while (std::getline(input, line)) {
    if (IsBlankLine(line)) continue;
    batch.push_back(std::move(line));
    if (batch.size() >= options.batch_size) {
      if (auto s = flush(); !s.ok()) return s;
    }
  }
  if (auto s = flush(); !s.ok()) return s;
  if (options.progress && tty) fprintf(stderr, "\n");
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  (*runner)->Shutdown();
  return summary;
}

}  // namespace minions::cli
