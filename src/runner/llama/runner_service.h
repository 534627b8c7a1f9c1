#pragma once
// RunnerService: the llama.cpp runner's main loop. Reads runner-protocol commands from an input
// stream, serves them with a LlamaEngine, writes events to an output stream.
//
// Threads: Run() is called on the main thread, which does all inference. A reader thread parses
// commands as they arrive, so `cancel`, `ping` and `shutdown` are seen while a batch is running.
// Writes to the output are serialised by a mutex.

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "runner/llama/llama_engine.h"
#include "runner/protocol.h"

namespace minions::llama_runner {

class RunnerService {
 public:
  RunnerService(int input_fd, FILE* output);
  // Serves until `shutdown` or end of input (the executor is gone: work in progress is dropped).
  // Returns the process exit code.
  int Run();

 private:
  void ReadCommands();  // reader thread
  void Emit(const std::string& line);
  void HandleLoad(const runner_protocol::LoadRequest& load);
  void HandleRun(const runner_protocol::RunRequest& run);

  int input_fd_;
  FILE* output_;
  std::mutex output_mu_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<runner_protocol::Command> queue_;  // guarded by mu_
  bool input_closed_ = false;                   // guarded by mu_
  bool shutdown_ = false;                       // guarded by mu_
  std::string running_batch_;                   // guarded by mu_
  bool cancel_running_ = false;                 // guarded by mu_

  std::unique_ptr<LlamaEngine> engine_;  // main thread only
  std::string engine_model_;             // main thread only
  runner_protocol::LoadOptions engine_options_;
};

}  // namespace minions::llama_runner
