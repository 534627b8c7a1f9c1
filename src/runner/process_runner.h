#pragma once
// ProcessRunner: the real Runner — a runner program in a child process, driven over its stdin and
// stdout by the runner protocol (docs/runner-protocol.md).
//
// Two threads of its own keep the pipes moving whatever the caller does: a writer feeds queued
// commands to the runner's stdin, a reader takes its stdout line by line into events. So the
// caller is never blocked writing a batch while the runner is blocked writing results nobody
// reads (the deadlock of a runner that answers one line at a time, like examples/echo_runner.py,
// fed batches larger than a pipe's buffer).
//
// The first line must be `ready` with this executor's protocol version; otherwise the runner is
// ended and Poll() says FailedPrecondition.
//
// Ownership: owns the child process and both threads; the destructor SIGKILLs the child, joins
// the threads and reaps it.
// Threads: as Runner.

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/subprocess.h"
#include "runner/runner.h"

namespace minions {

class ProcessRunner final : public Runner {
 public:
  struct Options {
    std::vector<std::string> command;      // the runner program and its arguments
    // "NAME=value" entries for the runner's environment. The one place the runner's environment
    // is built: what it inherits and what it is given are decided here.
    std::vector<std::string> environment;
    std::string stderr_path;               // the runner's log; empty: inherit
    // The command of a runner that may connect to these TCP ports (a gang's leader); unset: such
    // a runner cannot be started (RunnerFactory::StartConnecting).
    std::function<std::vector<std::string>(const std::vector<int>& tcp_ports)> connecting_command;
  };

  // Starts the program and returns at once; its `ready` line comes as the first event.
  static absl::StatusOr<std::unique_ptr<ProcessRunner>> Start(const Options& options,
                                                              std::function<void()> on_event);
  ~ProcessRunner() override;

  void Load(const runner_protocol::LoadRequest& request) override;
  void StartBatch(const std::string& batch, const std::vector<std::string>& records) override;
  // Sends a `rescore` command; its verdicts and batch_done come as events under request.batch.
  void StartRescore(const rescore::Request& request) override;
  void Cancel(const std::string& batch) override;
  void RequestShutdown() override;
  absl::StatusOr<std::optional<runner_protocol::Event>> Poll() override;
  void Kill() override;
  void Signal(int signal) override;
  pid_t pid() const override { return process_->pid(); }

  // How the process ended, once Poll() has reported its end.
  std::optional<ExitInfo> exit_info() const;

 private:
  ProcessRunner(std::unique_ptr<Subprocess> process, std::string program, std::function<void()> on_event);
  void Send(std::string line);
  void WriterLoop();
  void ReaderLoop();
  // The reader saw the end of the runner's output (or a runner not speaking the protocol).
  void End(absl::Status why);
  void Push(runner_protocol::Event event);

  const std::unique_ptr<Subprocess> process_;
  const std::string program_;
  const std::function<void()> on_event_;

  mutable absl::Mutex mu_;
  std::deque<std::string> outbox_ ABSL_GUARDED_BY(mu_);       // lines for stdin, in order
  bool close_stdin_ ABSL_GUARDED_BY(mu_) = false;             // after the outbox is written
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;                // the destructor runs
  std::deque<runner_protocol::Event> inbox_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> ended_ ABSL_GUARDED_BY(mu_);    // how it ended, once it has
  std::optional<ExitInfo> exit_info_ ABSL_GUARDED_BY(mu_);

  std::thread writer_;
  std::thread reader_;
};

// Starts ProcessRunners, all with the same program, environment and log.
class ProcessRunnerFactory final : public RunnerFactory {
 public:
  explicit ProcessRunnerFactory(ProcessRunner::Options options) : options_(std::move(options)) {}
  absl::StatusOr<std::unique_ptr<Runner>> Start(std::function<void()> on_event) override {
    auto runner = ProcessRunner::Start(options_, std::move(on_event));
    if (!runner.ok()) return runner.status();
    return std::unique_ptr<Runner>(std::move(*runner));
  }
  absl::StatusOr<std::unique_ptr<Runner>> StartConnecting(std::function<void()> on_event,
                                                          const std::vector<int>& tcp_ports) override {
    if (tcp_ports.empty()) return Start(std::move(on_event));
    if (!options_.connecting_command) return RunnerFactory::StartConnecting(std::move(on_event), tcp_ports);
    ProcessRunner::Options options = options_;
    options.command = options_.connecting_command(tcp_ports);
    auto runner = ProcessRunner::Start(options, std::move(on_event));
    if (!runner.ok()) return runner.status();
    return std::unique_ptr<Runner>(std::move(*runner));
  }

 private:
  const ProcessRunner::Options options_;
};

}  // namespace minions
