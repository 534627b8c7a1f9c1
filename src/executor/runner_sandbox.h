#pragma once
// RunnerSandbox: how an executor starts its runner: through `minions-sandbox` (src/sandbox), with
// an empty environment (plus the variables the owner chose to pass), the model folders read-only,
// its own scratch folder read-write, no network. The executor's environment, which may hold its
// credentials, never reaches a runner.
// Threads: immutable after Create; thread-safe.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace minions {

struct RunnerSandboxOptions {
  std::string launcher;                  // minions-sandbox; default: next to this program
  std::vector<std::string> model_folders;  // read-only (real paths)
  std::string scratch_dir;               // created 0700; the runner's TMPDIR, HOME and working folder
  // NAME=VALUE pairs the runner's environment gets (nothing else). Names that look like
  // credentials (MINIONS_TOKEN, AWS_*, *TOKEN*, *SECRET*, *PASSWORD*, *CREDENTIAL*) are refused.
  std::vector<std::string> env;
  bool require_landlock = false;         // refuse to start a runner without it (Linux)
  bool confine = true;                   // false: only the empty environment and the scratch folder
};

// The `--runner-sandbox` mode an executor runs with: "on", "required" and "off" as asked; "auto"
// (the default) is "required" where this kernel's Landlock does all the sandbox asks of it (ABI 4
// or later: files and TCP, `landlock_abi`), so that no runner starts less confined than the
// executor reports, and "on" elsewhere (seccomp only where there is no Landlock: reported as
// "partial", with a warning). docs/security.md 40.6a. InvalidArgument for another word.
absl::StatusOr<std::string> ResolveRunnerSandboxMode(const std::string& mode, int landlock_abi);

class RunnerSandbox {
 public:
  static absl::StatusOr<std::shared_ptr<const RunnerSandbox>> Create(RunnerSandboxOptions options);

  // The command that runs `command` in the sandbox. command[0] is made absolute (found on PATH
  // when it is a bare name), as the launcher executes it directly.
  // `connect_tcp_ports`: the TCP ports it may connect to (a gang's leader: its members' gates).
  std::vector<std::string> Wrap(const std::vector<std::string>& command,
                                const std::vector<int>& connect_tcp_ports = {}) const;
  // The command that runs a gang member's rpc-server (`command`) in the sandbox
  // (docs/security.md 40.1d): an empty environment, no files but the system's and its program's
  // folder, no writes, and TCP only to listen on `port` (its loopback port behind the gate).
  // `bridge` not empty: in a network namespace of its own, reached only through the bridge's Unix
  // socket at that path (40.1e; sandbox/own_network.h).
  std::vector<std::string> WrapRpcServer(const std::vector<std::string>& command, int port,
                                         const std::string& bridge = "") const;
  std::string Describe() const;

 private:
  explicit RunnerSandbox(RunnerSandboxOptions options) : options_(std::move(options)) {}
  RunnerSandboxOptions options_;
};

}  // namespace minions
