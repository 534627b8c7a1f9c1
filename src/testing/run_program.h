#pragma once
// RunProgram: a program a test runs to its end, its standard input closed: whether it started,
// its exit code, and what it wrote on standard output and standard error.

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace minions::testing {

struct ProgramRun {
  bool started = false;
  int code = -1;  // -1: it did not exit by itself
  std::string out, err;
};

// Runs `options` (its standard error goes to a temporary file, read back and removed), waiting up
// to `timeout` for each line of its output and for its exit.
inline ProgramRun RunProgram(Subprocess::Options options, absl::Duration timeout) {
  static std::atomic<int> runs{0};
  const std::string err_path = (std::filesystem::temp_directory_path() /
                                absl::StrCat("minions-run-", getpid(), "-", runs++, ".err"))
                                   .string();
  options.stderr_path = err_path;
  ProgramRun run;
  auto process = Subprocess::Start(options);
  if (!process.ok()) {
    run.err = process.status().ToString();
    return run;
  }
  run.started = true;
  (*process)->CloseStdin();
  while (true) {
    auto line = (*process)->ReadLine(timeout);
    if (!line.ok()) break;
    absl::StrAppend(&run.out, *line, "\n");
  }
  auto exit = (*process)->Wait(timeout);
  if (exit.ok() && exit->exited) run.code = exit->code;
  std::ifstream in(err_path);
  std::stringstream err;
  err << in.rdbuf();
  run.err = err.str();
  std::filesystem::remove(err_path);
  return run;
}

}  // namespace minions::testing
