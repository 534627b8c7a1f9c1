#pragma once
// A network of its own for a gang member's rpc-server (docs/security.md 40.1e). llama.cpp's
// rpc-server listens on a TCP port and has no authentication; on the machine's loopback any local
// process could reach it without passing the member's gate. So minions-sandbox (--own-network)
// moves it into a network namespace of its own, where its loopback is nobody else's, and leaves
// a bridge behind in that namespace: a small process listening on a Unix socket in a folder only
// the executor's user can enter. The gate asks the bridge for a connection (ConnectThroughBridge);
// the bridge checks the asker's user (SO_PEERCRED), connects to the rpc-server inside the
// namespace and hands the connected socket over (SCM_RIGHTS): the gate then talks to the
// rpc-server directly, with no copy in between.
//
// Linux only (elsewhere every call fails with Unimplemented). Root enters a new network
// namespace directly; other users through a user namespace of their own (where the kernel allows
// unprivileged ones). Functions; EnterOwnNetwork and StartBridge change the calling process (the
// launcher, before it executes the rpc-server); ConnectThroughBridge from any thread.

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace minions::sandbox {

// Moves this process into a new network namespace with its loopback up (127.0.0.1 only).
absl::Status EnterOwnNetwork();

// Binds the Unix socket `path` (which must not exist), then forks the bridge: until this process
// (after it executes the rpc-server) dies, each connection of this user to `path` gets a socket
// connected to 127.0.0.1:`port` in this namespace, or a refusal when nothing listens there yet.
// The bridge keeps no descriptor of this process's but its socket. Returns the bridge's pid.
absl::StatusOr<int> StartBridge(const std::string& path, int port);

// Asks the bridge at `path` for a connection to its rpc-server: a connected TCP socket (blocking,
// close-on-exec, TCP_NODELAY), or Unavailable (no bridge yet, nothing listening yet, timeout).
absl::StatusOr<int> ConnectThroughBridge(const std::string& path, absl::Duration timeout);

}  // namespace minions::sandbox
