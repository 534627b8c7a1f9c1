#pragma once
// The runner's sandbox: what a runner process may touch. A runner parses records anyone could
// have submitted and loads a model file; if either subverts it, it must still find nothing of the
// machine's owner to read, nowhere to send anything, and nothing to harm. The executor starts each
// runner through `minions-sandbox` (apps/minions_sandbox_main.cc), which:
//   - replaces the environment with the few variables it is given (the executor's own, with its
//     credentials, never reaches the runner);
//   - Linux: sets no_new_privs, then a Landlock ruleset (as much as the kernel's ABI offers):
//     read (and execute) the system's libraries and the runner, read the model folders, read and
//     write only the scratch folder, use the GPU devices, no TCP; and a seccomp filter that refuses
//     sockets, ptrace, io_uring, mounts, namespaces, BPF, keyrings and kernel modules;
//   - macOS: runs the runner under sandbox-exec with a profile to the same effect (MacProfile).
// Then it executes the runner. Sandboxes survive execve: the runner cannot lift them.
//
// Pure functions and one that changes the calling process (ApplyToSelf); any thread, but
// ApplyToSelf is meant for a process about to execve.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace minions::sandbox {

struct Policy {
  std::vector<std::string> read_only;   // folders or files: read, list, execute
  std::vector<std::string> read_write;  // folders: everything inside (the scratch folder)
  std::vector<std::string> devices;     // device files or folders: read, write, ioctl (GPUs)
  // TCP ports it may connect to (a gang's leader reaching its members' rpc gates,
  // docs/architecture.md "Gangs"); none: no network at all. Linux: IPv4/IPv6 sockets are then
  // allowed, and Landlock (ABI 4+) limits TCP connections to these ports (any host: the ports are
  // Landlock's unit); macOS: outbound TCP to these ports.
  std::vector<int> connect_tcp_ports;
  // TCP ports it may listen on (a gang member's rpc-server, on loopback behind its gate:
  // docs/security.md 40.1d); IPv4/IPv6 sockets are then allowed, and Landlock (ABI 4+) limits
  // binding to these ports.
  std::vector<int> bind_tcp_ports;
};

// The system paths any dynamically linked program needs to start and run (libraries, the loader's
// cache, CPU and memory information, /dev/null...), that exist on this machine.
Policy SystemPolicy();

// The Landlock ABI this kernel offers (Linux; 0: none, or another system).
int LandlockAbi();

// How a runner started through minions-sandbox is confined here: "full" (Linux: Landlock and
// seccomp; macOS: sandbox-exec), "partial" (Linux without Landlock: seccomp only), "none" when
// `confine` is false (the owner turned the sandbox off).
std::string Confinement(bool confine);

// Linux: applies `policy` to this process and its future children (no_new_privs, Landlock,
// seccomp). Returns a line saying what was applied ("landlock ABI 6 (files, tcp, scopes), seccomp").
// FailedPrecondition when `require_landlock` and the kernel has none.
absl::StatusOr<std::string> ApplyToSelf(const Policy& policy, bool require_landlock);

// macOS: the sandbox-exec profile (SBPL) for `program` under `policy`: deny by default; read the
// system, the program and the read-only paths; read and write the scratch folders; no network.
std::string MacProfile(const Policy& policy, const std::string& program);

}  // namespace minions::sandbox
