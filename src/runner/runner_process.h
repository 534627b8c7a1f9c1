#pragma once
// RunnerProcess: a runner program driven one call at a time — the form tools want (`minions
// local-run`, the runner benchmark, the runner's own tests): start and wait for `ready`, load and
// wait for `loaded`, run a batch and collect its results. A ProcessRunner does the talking, so
// several batches may be queued without the pipes ever jamming. The executor drives its
// ProcessRunner directly, asynchronously, through the Runner seam.
//
// Waits are in real time: this is the tools' client, not the executor's (whose waits go through
// its Clock).
// Ownership: owns the runner; destroying a RunnerProcess kills it, which is how its memory goes
// back to the machine's owner at once.
// Threads: Load/RunBatch/StartBatch/NextEvent/Shutdown from one thread at a time; Cancel() and
// pid() from any thread.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/json_util.h"
#include "common/subprocess.h"
#include "runner/process_runner.h"
#include "runner/protocol.h"

namespace minions {

class RunnerProcess {
 public:
  struct Options {
    std::vector<std::string> command;      // the runner program and its arguments
    std::vector<std::string> environment;  // "NAME=value" added to the runner's (ProcessRunner)
    std::string stderr_path;               // runner logs; empty: inherit
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
  // Asks the runner to check claimed answers (`rescore`), calling `on_verdict` with each item's
  // `verdict` message (a verdict object, or an error when the runner could not check it).
  // Returns the batch_done message.
  using VerdictCallback = std::function<void(size_t index, const Json& message)>;
  absl::StatusOr<Json> Rescore(const rescore::Request& request, const VerdictCallback& on_verdict);
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
  pid_t pid() const { return runner_->pid(); }
  // The asynchronous runner underneath (Kill, exit_info).
  ProcessRunner& runner() { return *runner_; }

 private:
  RunnerProcess() = default;
  // The next event within `timeout`: DeadlineExceeded when none came, the runner's end (an error)
  // when it ended.
  absl::StatusOr<runner_protocol::Event> Next(absl::Duration timeout);
  void Notify();

  // Before runner_: the runner's threads call Notify() until it is destroyed.
  absl::Mutex mu_;
  uint64_t arrivals_ ABSL_GUARDED_BY(mu_) = 0;  // on_event calls so far
  std::unique_ptr<ProcessRunner> runner_;
  std::string program_;
  Json ready_;
};

}  // namespace minions
