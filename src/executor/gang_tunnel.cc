#include "executor/gang_tunnel.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#ifdef __APPLE__
#include <libproc.h>
#include <sys/proc_info.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/logging.h"
#include "executor/gang_handshake.h"
#include "executor/gang_member.h"

namespace minions {

int ConnectGangPeer(const std::string& endpoint, absl::Duration timeout) {
  std::string host;
  int port = 0;
  if (!SplitHostPort(endpoint, &host, &port).ok()) return -1;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return -1;
  int connected = -1;
  for (addrinfo* a = found; a != nullptr && connected < 0; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    bool ok = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!ok && errno == EINPROGRESS) {
      pollfd wait{fd, POLLOUT, 0};
      int error = 0;
      socklen_t len = sizeof(error);
      ok = poll(&wait, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) == 1 &&
           getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0;
    }
    if (!ok) {
      close(fd);
      continue;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    connected = fd;
  }
  freeaddrinfo(found);
  return connected;
}


#ifdef __APPLE__
// macOS: the runner's descriptors, through libproc: one of its TCP sockets has the connection's
// client port as its local port and the tunnel's port as its remote one.
bool LoopbackPeerIsProcess(int client_port, int server_port, int pid) {
  if (pid <= 0) return false;
  int size = proc_pidinfo(pid, PROC_PIDLISTFDS, 0, nullptr, 0);
  if (size <= 0) return false;
  std::vector<proc_fdinfo> fds(static_cast<size_t>(size) / sizeof(proc_fdinfo) + 16);
  size = proc_pidinfo(pid, PROC_PIDLISTFDS, 0, fds.data(), static_cast<int>(fds.size() * sizeof(proc_fdinfo)));
  if (size <= 0) return false;
  fds.resize(static_cast<size_t>(size) / sizeof(proc_fdinfo));
  for (const proc_fdinfo& fd : fds) {
    if (fd.proc_fdtype != PROX_FDTYPE_SOCKET) continue;
    socket_fdinfo info{};
    if (proc_pidfdinfo(pid, fd.proc_fd, PROC_PIDFDSOCKETINFO, &info, sizeof(info)) != sizeof(info)) continue;
    if (info.psi.soi_kind != SOCKINFO_TCP) continue;
    const in_sockinfo& in = info.psi.soi_proto.pri_tcp.tcpsi_ini;
    if (ntohs(static_cast<uint16_t>(in.insi_lport)) == client_port &&
        ntohs(static_cast<uint16_t>(in.insi_fport)) == server_port) {
      return true;
    }
  }
  return false;
}
#else
bool LoopbackPeerIsProcess(int client_port, int server_port, int pid) {
  if (pid <= 0) return false;
  // The socket's inode: the row whose local end is the client's and remote end the server's.
  std::ifstream table("/proc/net/tcp");
  std::string line;
  unsigned long inode = 0;
  std::getline(table, line);  // the header
  while (std::getline(table, line)) {
    unsigned local_ip = 0, local_port = 0, remote_ip = 0, remote_port = 0;
    unsigned long row_inode = 0;
    if (std::sscanf(line.c_str(), " %*d: %8X:%X %8X:%X %*X %*X:%*X %*X:%*X %*X %*u %*d %lu", &local_ip, &local_port,
                    &remote_ip, &remote_port, &row_inode) != 5) {
      continue;
    }
    // /proc/net/tcp writes addresses in the kernel's (network) byte order, read as a native word.
    if (static_cast<int>(local_port) == client_port && static_cast<int>(remote_port) == server_port &&
        local_ip == htonl(INADDR_LOOPBACK) && remote_ip == htonl(INADDR_LOOPBACK) && row_inode != 0) {
      inode = row_inode;
      break;
    }
  }
  if (inode == 0) return false;
  const std::string wanted = absl::StrCat("socket:[", inode, "]");
  const std::string folder = absl::StrCat("/proc/", pid, "/fd");
  DIR* dir = opendir(folder.c_str());
  if (dir == nullptr) return false;
  bool found = false;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    char target[64] = {};
    ssize_t n = readlinkat(dirfd(dir), entry->d_name, target, sizeof(target) - 1);
    if (n > 0 && wanted == std::string(target, static_cast<size_t>(n))) {
      found = true;
      break;
    }
  }
  closedir(dir);
  return found;
}
#endif

absl::StatusOr<std::unique_ptr<GangTunnel>> GangTunnel::Start(GangTunnelOptions options) {
  if (options.secret.empty()) {
    return absl::InvalidArgumentError("a gang lease without its attempt's secret: no member would admit this leader");
  }
  std::string host;
  int member_port = 0;
  if (absl::Status s = SplitHostPort(options.member, &host, &member_port); !s.ok()) return s;
  auto tunnel = std::unique_ptr<GangTunnel>(new GangTunnel());
  tunnel->options_ = std::move(options);
  tunnel->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (tunnel->listen_fd_ < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(address);
  if (bind(tunnel->listen_fd_, reinterpret_cast<sockaddr*>(&address), len) != 0 || listen(tunnel->listen_fd_, 4) != 0 ||
      getsockname(tunnel->listen_fd_, reinterpret_cast<sockaddr*>(&address), &len) != 0) {
    return absl::UnavailableError(absl::StrCat("the gang tunnel's loopback port: ", std::strerror(errno)));
  }
  tunnel->port_ = ntohs(address.sin_port);
  tunnel->endpoint_ = absl::StrCat("127.0.0.1:", tunnel->port_);
  if (pipe2(tunnel->wake_fd_, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  tunnel->accept_thread_ = std::thread([t = tunnel.get()] { t->AcceptLoop(); });
  return tunnel;
}

GangTunnel::~GangTunnel() { Stop(); }

void GangTunnel::AcceptLoop() {
  // Connections that are not the runner's, each until it hangs up or its deadline: one that hung
  // up having sent nothing is closed without a word (the runner's own reachability probe, which
  // connects and hangs up before its socket can be looked up, was logged as refused once per
  // member before every load); one that sends or stays is refused. Either way nothing is read
  // or forwarded, and a silent one holds up no one (this loop polls them with the rest).
  struct Suspect {
    int fd;
    absl::Time deadline;
  };
  std::vector<Suspect> suspects;
  auto refuse = [this](int fd) {
    refused_.fetch_add(1);
    MINIONS_LOG(Warning) << "gang tunnel to " << options_.member
                         << ": refused a local connection that is not the runner's";
    close(fd);
  };
  while (true) {
    std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
    absl::Time next = absl::InfiniteFuture();
    for (const Suspect& suspect : suspects) {
      fds.push_back({suspect.fd, POLLIN, 0});  // readable: bytes, or the peer hung up
      next = std::min(next, suspect.deadline);
    }
    const int timeout =
        next == absl::InfiniteFuture()
            ? -1
            : static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(next - absl::Now()) + 1));
    if (poll(fds.data(), fds.size(), timeout) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents != 0) break;
    const absl::Time now = absl::Now();
    std::vector<Suspect> still;
    for (size_t i = 0; i < suspects.size(); ++i) {
      const Suspect& suspect = suspects[i];
      if (fds[2 + i].revents != 0) {
        char byte;
        ssize_t n = recv(suspect.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n > 0) {
          refuse(suspect.fd);  // it speaks: an attempt to reach the member
        } else {
          hung_up_.fetch_add(1);  // hung up with nothing sent
          close(suspect.fd);
        }
      } else if (now >= suspect.deadline) {
        refuse(suspect.fd);
      } else {
        still.push_back(suspect);
      }
    }
    suspects.swap(still);
    if ((fds[0].revents & POLLIN) == 0) continue;
    sockaddr_in peer{};
    socklen_t peer_len = sizeof(peer);
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &peer_len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    if (peer.sin_family != AF_INET || !LoopbackPeerIsProcess(ntohs(peer.sin_port), port_, pid_.load())) {
      // Another process on this machine (or the runner's probe, gone already): nothing is read
      // and no member reached; see above.
      suspects.push_back({fd, absl::Now() + kSuspectWait});
      continue;
    }
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      close(fd);
      break;
    }
    open_fds_.push_back(fd);
    threads_.emplace_back([this, fd] { Carry(fd); });
  }
  for (const Suspect& suspect : suspects) close(suspect.fd);
}

void GangTunnel::Carry(int local_fd) {
  int member_fd = ConnectGangPeer(options_.member, options_.connect_timeout);
  if (member_fd < 0) {
    MINIONS_LOG(Warning) << "gang tunnel: member " << options_.member << " does not answer";
    shutdown(local_fd, SHUT_RDWR);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      close(member_fd);
      return;
    }
    open_fds_.push_back(member_fd);
  }
  absl::Status proved = ProveLeader(member_fd, options_.secret, options_.connect_timeout);
  if (!proved.ok()) {
    refused_.fetch_add(1);
    MINIONS_LOG(Warning) << "gang tunnel: member " << options_.member << ": " << proved.message();
    shutdown(member_fd, SHUT_RDWR);
    shutdown(local_fd, SHUT_RDWR);
    return;
  }
  admitted_.fetch_add(1);
  std::atomic<int64_t> in{0}, out{0};
  std::thread back([&] { PumpUntilClosed(member_fd, local_fd, &out); });
  PumpUntilClosed(local_fd, member_fd, &in);
  back.join();
}

void GangTunnel::Stop() {
  std::vector<std::thread> threads;
  std::vector<int> fds;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (wake_fd_[1] >= 0) {
    char byte = 0;
    (void)!write(wake_fd_[1], &byte, 1);
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
    fds.swap(open_fds_);
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
  for (int fd : fds) shutdown(fd, SHUT_RDWR);
  for (auto& thread : threads) thread.join();
  for (int fd : fds) close(fd);
  for (int& fd : wake_fd_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

}  // namespace minions
