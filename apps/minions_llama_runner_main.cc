// minions-llama-runner: the built-in runner. Speaks the runner protocol (docs/runner-protocol.md)
// on stdin/stdout; logs go to stderr. The only program that links llama.cpp.

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "common/logging.h"
#include "minions/version.h"
#include "runner/llama/devices.h"
#include "runner/llama/llama_engine.h"
#include "runner/llama/runner_service.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) {
      printf("minions-llama-runner %s\n", minions::kVersion);
      return 0;
    }
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      printf("minions-llama-runner %s\n"
             "Serves OpenAI Batch records with llama.cpp. Speaks the runner protocol: one JSON\n"
             "command per line on stdin (load, run, cancel, ping, shutdown), one JSON event per\n"
             "line on stdout. See docs/runner-protocol.md. Logs go to stderr.\n"
             "  --verbose   log llama.cpp's messages and debug lines\n"
             "  --devices   print the devices llama.cpp can use (JSON) and exit\n",
             minions::kVersion);
      return 0;
    }
    if (std::strcmp(argv[i], "--devices") == 0) {
      // The devices llama.cpp can compute on, as JSON (the executor reports its accelerator from
      // them: src/executor/runner_devices.h).
      minions::SetLogComponent("runner");
      minions::llama_runner::InstallLlamaLogging();
      printf("%s\n", minions::DumpJson(minions::llama_runner::ListDevices()).c_str());
      return 0;
    }
    if (std::strcmp(argv[i], "--verbose") == 0) {
      minions::SetLogLevel(minions::LogLevel::kDebug);
      continue;
    }
    fprintf(stderr, "error: unknown argument '%s' (try --help)\n", argv[i]);
    return 2;
  }
  // Dying with the executor is the executor's business: on Linux Subprocess gives every child a
  // parent-death SIGKILL before it executes it; elsewhere the end of stdin stops us (below).
  minions::SetLogComponent("runner");
  minions::llama_runner::InstallLlamaLogging();
  // stdout carries the protocol alone: nothing else may print there.
  minions::llama_runner::RunnerService service(STDIN_FILENO, stdout);
  return service.Run();
}
