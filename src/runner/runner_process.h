#pragma once
// RunnerProcess: the executor's side of the runner protocol (docs/runner-protocol.md). Starts a
// runner program, loads a model into it, streams batches through it.
//
// Ownership: owns the runner's process; destroying a RunnerProcess kills the runner, which is
// how its memory goes back to the machine's owner at once.
// Threads: Load/RunBatch/Shutdown from one thread at a time; Cancel() and pid() from any thread.

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/json_util.h"
#include "common/subprocess.h"
#include "runner/protocol.h"

namespace minions {

class RunnerProcess {
 public:
  struct Options {
    std::vector<std::string> command;  // the runner program and its arguments
    std::string stderr_path;           // runner logs; empty: inherit
    absl::Duration start_timeout = absl::Seconds(30);
    absl::Duration load_timeout = absl::Minutes(10);
  };
  using ResultCallback = std::function<void(size_t index, const Json& output_line)>;

  // Starts the runner and waits for its `ready` line.
  static absl::StatusOr<std::unique_ptr<RunnerProcess>> Start(const Options& options);
  ~RunnerProcess();

  // Loads a model (a no-op in the runner when the same model is loaded); returns its info.
  absl::StatusOr<Json> Load(const runner_protocol::LoadRequest& request);
  // Runs one batch, calling `on_result` for each record's output line as it arrives (any order).
  // Returns the batch_done message. If the runner dies, returns Unavailable; the results already
  // delivered stand.
  absl::StatusOr<Json> RunBatch(const std::string& batch, const std::vector<std::string>& records,
                                const ResultCallback& on_result);
  // The asynchronous form: several batches may be in the runner at once (it serves them in order,
  // and the llama.cpp runner keeps its decode slots full across them). Send with StartBatch, then
  // take events from NextEvent: results and batch_done messages of any batch. NextEvent returns
  // DeadlineExceeded when nothing came within `timeout`, Unavailable when the runner died.
  absl::Status StartBatch(const std::string& batch, const std::vector<std::string>& records);
  absl::StatusOr<runner_protocol::Event> NextEvent(absl::Duration timeout);

  // Asks the runner to stop the batch; RunBatch then returns with the rest marked cancelled.
  absl::Status Cancel(const std::string& batch);
  // Asks the runner to exit; kills it if it has not after `grace`.
  ExitInfo Shutdown(absl::Duration grace = absl::Seconds(5));

  const Json& ready_info() const { return ready_; }
  pid_t pid() const { return process_->pid(); }

 private:
  explicit RunnerProcess(std::unique_ptr<Subprocess> process) : process_(std::move(process)) {}
  absl::Status Send(const std::string& line);
  absl::Status Died(std::string_view during);

  std::unique_ptr<Subprocess> process_;
  std::mutex write_mu_;
  Json ready_;
};

}  // namespace minions
