#pragma once
// GangTunnel: the leader's end of the gang link (docs/architecture.md, "Gangs"). llama.cpp's RPC
// client in the leader's runner connects to a host:port and speaks raw RPC; it cannot prove the
// gang attempt's secret. So the leader's executor gives its runner, for each member, a tunnel on
// a loopback port of its own: the tunnel forwards only connections made by the runner's own
// process (the peer socket must be one of that process's descriptors: a local process racing for
// the port is closed unread), and for each it connects to the member's gate, proves the secret
// (executor/gang_handshake.h) and checks the member's proof, and only then carries the bytes.
// The runner's sandbox lets it reach these loopback ports and no other.
//
// Ownership: the listening socket, its accept thread, and the threads and sockets of each
// forwarded connection. Threads: Start, Stop and the destructor from one thread (the agent's);
// AdmitProcess and the counters from any thread.

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace minions {

struct GangTunnelOptions {
  std::string member;      // the member's gate, host:port on the gang network
  std::string secret;      // this attempt's gang secret (the lease's); empty: Start refuses
  absl::Duration connect_timeout = absl::Seconds(10);  // to reach the gate and finish the handshake
};

class GangTunnel {
 public:
  static absl::StatusOr<std::unique_ptr<GangTunnel>> Start(GangTunnelOptions options);
  ~GangTunnel();
  GangTunnel(const GangTunnel&) = delete;
  GangTunnel& operator=(const GangTunnel&) = delete;

  // 127.0.0.1:port, what the runner is told to connect to; the port alone (its sandbox's).
  const std::string& endpoint() const { return endpoint_; }
  int port() const { return port_; }
  // Only connections from process `pid` (the runner) are forwarded; 0: none (until set).
  void AdmitProcess(int pid) { pid_.store(pid); }
  // Connections closed unforwarded (another process's, or the member did not prove the secret),
  // and those forwarded.
  int64_t refused() const { return refused_.load(); }
  // Connections not the runner's that hung up having sent nothing (the runner's reachability
  // probe closes before its socket can be looked up): closed, neither refused nor forwarded.
  int64_t hung_up() const { return hung_up_.load(); }
  // How long a connection that is not the runner's may stay silent before it is refused.
  static constexpr absl::Duration kSuspectWait = absl::Seconds(1);
  int64_t admitted() const { return admitted_.load(); }
  // Closes the listening socket and every forwarded connection. Idempotent.
  void Stop();

 private:
  GangTunnel() = default;
  void AcceptLoop();
  void Carry(int local_fd);

  GangTunnelOptions options_;
  std::string endpoint_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};
  std::thread accept_thread_;
  std::atomic<int> pid_{0};
  std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> hung_up_{0};
  std::atomic<int64_t> admitted_{0};
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> open_fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

// Connects to "host:port" (numeric or a name) within `timeout`: a blocking socket with
// TCP_NODELAY, or -1. The gang link's outgoing connections (tunnels, the leader's checks).
int ConnectGangPeer(const std::string& endpoint, absl::Duration timeout);

// Whether the loopback TCP connection whose client end is `client` ("127.0.0.1", port) and whose
// server end is port `server_port` was made by process `pid` (its socket is one of that process's
// descriptors). Linux: /proc/net/tcp and /proc/<pid>/fd; macOS: libproc. False whenever it
// cannot tell.
bool LoopbackPeerIsProcess(int client_port, int server_port, int pid);

}  // namespace minions
