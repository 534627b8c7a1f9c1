#pragma once
// GangMember: what an executor runs while it lends its memory and compute to a gang's leader
// (docs/architecture.md, "Gangs"): llama.cpp's rpc-server, reachable only by that leader, for the
// lifetime of one gang lease.
//
// llama.cpp's RPC protocol has no authentication: whoever reaches an rpc-server may store tensors
// in it and run graphs on it. So the rpc-server itself listens only on loopback, on a port of its
// own, in a network namespace of its own when it is started through the sandbox (`wrap`; Linux):
// no local process can reach that port, and the gate reaches it through a bridge whose Unix
// socket sits in a folder only this user enters (sandbox/own_network.h). The member's gate listens on the gang network's address (the operator's
// `gang_network`), on a port chosen per lease. The gate closes every connection whose peer is not
// the leader's address, then every one that does not prove this attempt's secret (the server
// mints one per gang attempt; executor/gang_handshake.h), before a single byte reaches the
// rpc-server; only then does it forward the leader's bytes to the rpc-server and back. Stop (or the
// destructor) closes the gate and SIGKILLs the rpc-server: nothing of the gang outlives its lease.
// When the rpc-server exits on its own (it crashed, or was killed) while the executor lives, the
// gate closes too: the leader then finds this member gone (its attempt preempted and run on a new
// gang), not a runner that crashed on its own (which would blame the records it was running).
// Where the kernel gives no network namespace (macOS; a Linux that refuses this user one), the
// rpc-server listens on the machine's loopback, as a warning says; what this cannot stop is said
// in docs/security.md.
//
// Ownership: owns the rpc-server process, the gate's listening socket, its accept thread and two
// forwarding threads per admitted connection.
// Threads: Start, Stop and the destructor from one thread (the agent's); endpoint(), running(),
// refused() and admitted() from any thread.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace minions {

struct GangMemberOptions {
  std::string rpc_server;   // path of ggml-rpc-server (default: next to this program)
  std::string bind_host;    // the gang network address this machine has (never 0.0.0.0 or ::)
  int port = 0;             // the gate's port; 0: one the system picks (per lease)
  std::string leader_host;  // the only peer address admitted
  std::string secret;       // this attempt's gang secret (the duty's); empty: Start refuses
  absl::Duration handshake_timeout = absl::Seconds(10);  // for a peer to prove the secret
  int threads = 0;          // rpc-server's compute threads; 0: its default
  absl::Duration start_timeout = absl::Seconds(30);  // for rpc-server to listen
  std::string stderr_path;  // rpc-server's stderr; empty: inherited
  // How the rpc-server's command (argv) listening on loopback `port` is started: the executor's
  // sandbox (RunnerSandbox::WrapRpcServer: empty environment, no files, TCP only to listen on
  // that port, in a network of its own behind the bridge at `bridge` when that is not empty).
  // Null: as it is, on the machine's loopback (tests of the gate alone).
  std::function<std::vector<std::string>(const std::vector<std::string>& argv, int port, const std::string& bridge)>
      wrap;
};

class GangMember {
 public:
  static absl::StatusOr<std::unique_ptr<GangMember>> Start(GangMemberOptions options);
  ~GangMember();
  GangMember(const GangMember&) = delete;
  GangMember& operator=(const GangMember&) = delete;

  // host:port the leader connects to (the gang network address and the gate's port).
  const std::string& endpoint() const { return endpoint_; }
  // False once the rpc-server has exited (the gang's attempt cannot go on).
  bool running();
  // The rpc-server's process id (tests).
  int rpc_server_pid() const { return server_ ? server_->pid() : 0; }
  // The rpc-server's loopback port, and whether that loopback is its own (a network namespace
  // reached through the bridge) rather than the machine's (tests).
  int rpc_server_port() const { return server_port_; }
  bool own_network() const { return !bridge_path_.empty(); }
  const std::string& bridge_path() const { return bridge_path_; }
  // Connections closed because their peer was not the leader's address or did not prove the
  // secret, and those forwarded.
  int64_t refused() const { return refused_.load(); }
  int64_t admitted() const { return admitted_.load(); }
  // Bytes forwarded from the leader to the rpc-server, and back (benchmarks: bytes per token).
  int64_t bytes_in() const { return bytes_in_.load(); }
  int64_t bytes_out() const { return bytes_out_.load(); }
  // Closes the gate and every forwarded connection, kills the rpc-server. Idempotent.
  void Stop();

 private:
  GangMember() = default;
  void AcceptLoop();
  // On a thread of its own: the handshake, then (when the peer proved the secret) the forwarding.
  void Admit(int client_fd);
  void Forward(int client_fd);
  // The rpc-server's output ended: it exited. Unless stopping, the gate closes (the accept loop
  // ends and closes the listening socket).
  void ServerExited();
  // A connection to the rpc-server: through the bridge, or on the machine's loopback; -1 if none.
  int ConnectServer(int port) const;

  GangMemberOptions options_;
  std::string endpoint_;
  std::unique_ptr<Subprocess> server_;
  int server_port_ = 0;  // rpc-server's loopback port
  std::string bridge_dir_;   // private folder (0700) of the bridge's socket; "" without one
  std::string bridge_path_;  // the bridge's socket; "": the rpc-server is on the machine's loopback
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};  // a byte on it ends the accept loop
  std::thread accept_thread_;
  std::thread drain_thread_;  // reads rpc-server's stdout so that it never blocks on it
  std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> admitted_{0};
  std::atomic<int64_t> bytes_in_{0};
  std::atomic<int64_t> bytes_out_{0};
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool server_gone_ ABSL_GUARDED_BY(mu_) = false;  // exited on its own: the gate closes
  std::vector<int> open_fds_ ABSL_GUARDED_BY(mu_);  // forwarded sockets, shut down by Stop
  std::vector<std::thread> forwarders_ ABSL_GUARDED_BY(mu_);
};

// Copies bytes from `from` to `to` until either side ends, then shuts both down; counts them
// into `bytes`. The gang link's forwarding (member gates and leader tunnels).
void PumpUntilClosed(int from, int to, std::atomic<int64_t>* bytes);

// The same address, written either way ("::ffff:10.0.0.1" is "10.0.0.1"); false for names.
bool SameIpAddress(const std::string& a, const std::string& b);

}  // namespace minions
