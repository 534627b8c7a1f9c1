#pragma once
// Runner: the executor's handle on one runner — the seam between the executor and whatever does
// the inference. The real one is a process speaking the runner protocol (ProcessRunner,
// docs/runner-protocol.md); tests use an in-process FakeRunner that can crash on a record,
// stall or die.
//
// Everything is asynchronous, so the caller never waits on the runner: commands are queued and
// return at once (a runner busy writing results is never blocked by one still to be read), and
// what the runner says comes back through Poll(), in order. A runner that ends (crash, kill,
// exit) reports it once every event it sent before has been taken.
//
// Ownership: destroying a Runner ends it at once (a process is SIGKILLed and reaped: its memory
// goes back to the machine's owner).
// Threads: commands and Poll() from one thread at a time (the agent's main thread); Kill(),
// Signal() and pid() from any thread.

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runner/protocol.h"
#include "runner/rescore.h"

namespace minions {

class Runner {
 public:
  virtual ~Runner() = default;

  // Queue one command each; never blocks on the runner.
  virtual void Load(const runner_protocol::LoadRequest& request) = 0;
  virtual void StartBatch(const std::string& batch, const std::vector<std::string>& records) = 0;
  // A `rescore` command (docs/runner-protocol.md): one verdict per item, then batch_done, under
  // request.batch.
  virtual void StartRescore(const rescore::Request& request) = 0;
  virtual void Cancel(const std::string& batch) = 0;
  // Asks the runner to exit once it has read what was queued before.
  virtual void RequestShutdown() = 0;

  // The next event the runner sent, if one has arrived (ready, loaded, result, verdict,
  // batch_done, error, pong). Once the runner has ended and every event before that is taken: an
  // error saying how it ended (Unavailable: it died or exited; FailedPrecondition: it does not speak the protocol),
  // on every call from then on.
  virtual absl::StatusOr<std::optional<runner_protocol::Event>> Poll() = 0;

  // Any thread.
  virtual void Kill() = 0;               // SIGKILL: ends it now
  virtual void Signal(int signal) = 0;   // SIGSTOP / SIGCONT while the owner needs the machine
  virtual pid_t pid() const = 0;         // 0 when it is not a process
};

// Starts runners: the executor starts a new one after a crash, a release or a hang.
// Threads: Start from one thread at a time.
class RunnerFactory {
 public:
  virtual ~RunnerFactory() = default;
  // `on_event` is called (on any thread, possibly the runner's own) whenever Poll() has something
  // new: an event, or the runner's end.
  virtual absl::StatusOr<std::unique_ptr<Runner>> Start(std::function<void()> on_event) = 0;
  // A runner that may connect to these TCP ports (a gang's leader reaching its members' rpc
  // gates, docs/architecture.md "Gangs"); Unimplemented where the factory cannot start one so.
  virtual absl::StatusOr<std::unique_ptr<Runner>> StartConnecting(std::function<void()> on_event,
                                                                  const std::vector<int>& tcp_ports) {
    if (tcp_ports.empty()) return Start(std::move(on_event));
    return absl::UnimplementedError("this runner cannot reach a gang's members");
  }
};

}  // namespace minions
