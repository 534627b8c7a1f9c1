#pragma once
// RunnerService: the llama.cpp runner's main loop. Reads runner-protocol commands from an input
// stream, serves them with a LlamaEngine, writes events to an output stream.
//
// Batches are streamed into the engine: the records of every queued `run` form one stream, so a
// decode slot freed by one batch's last records is filled by the next batch's first ones, and
// the engine never idles at a batch boundary. A `load` waits until the records before it are done.
//
// Threads: Run() is called on the main thread, which does all inference. A reader thread parses
// commands as they arrive, so `cancel`, `ping` and `shutdown` are seen while a batch is running.
// Writes to the output are serialised by a mutex.

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "runner/llama/llama_engine.h"
#include "runner/protocol.h"

namespace minions::llama_runner {

class RunnerService : private WorkSource {
 public:
  RunnerService(int input_fd, FILE* output);
  // Serves until `shutdown` or end of input (the executor is gone: work in progress is dropped).
  // Returns the process exit code.
  int Run();

 private:
  // Bookkeeping of one `run` whose records are in the stream. Main thread only.
  struct BatchState {
    size_t total = 0;
    size_t answered = 0;
    runner_protocol::BatchStats stats;
    double started = 0;  // steady-clock seconds
  };

  void ReadCommands();  // reader thread
  // Writes a protocol line; results are buffered and flushed once per decode step (every line
  // wakes the executor, whose CPU time the decode threads would otherwise lose to it).
  void Emit(const std::string& line, bool flush = true);
  void HandleLoad(const runner_protocol::LoadRequest& load);
  // Checks claimed answers with the loaded model: one `verdict` per item, then `batch_done`
  // (rescore_service.cc).
  void HandleRescore(const rescore::Request& request);
  // Moves the records of a `run` into the stream; malformed ones are answered at once.
  void Expand(runner_protocol::RunRequest run);
  void Answer(const std::string& batch, size_t index, const Json& output, bool is_error, const Usage& usage,
              int cached_tokens = 0);
  bool IsCancelled(const std::string& batch);

  // WorkSource, called by the engine on the main thread.
  std::optional<WorkItem> Next() override;
  void OnResult(WorkResult result) override;
  bool Cancelled(const WorkItem& item) override;
  void OnDropped(const WorkItem& item) override;
  bool Stopping() override;
  void StepDone() override;

  int input_fd_;
  FILE* output_;
  std::mutex output_mu_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<runner_protocol::Command> queue_;  // guarded by mu_
  std::set<std::string> cancelled_;             // batches cancelled while streaming; guarded by mu_
  bool input_closed_ = false;                   // guarded by mu_
  bool shutdown_ = false;                       // guarded by mu_

  // Main thread only.
  std::deque<WorkItem> stream_;                 // records ready for the engine
  std::map<std::string, BatchState> batches_;   // runs with records not yet answered
  std::unique_ptr<LlamaEngine> engine_;
  std::string engine_model_;
  runner_protocol::LoadOptions engine_options_;
  runner_protocol::Gang engine_gang_;
};

}  // namespace minions::llama_runner
