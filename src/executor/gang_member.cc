#include "executor/gang_member.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/logging.h"
#include "executor/gang_handshake.h"
#include "sandbox/own_network.h"

namespace minions {
namespace {

absl::Status ErrnoError(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Parses a numeric address (no name lookups: the gang network is named by address).
bool ParseIp(const std::string& host, sockaddr_storage* out, socklen_t* len) {
  std::memset(out, 0, sizeof(*out));
  auto* v4 = reinterpret_cast<sockaddr_in*>(out);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(out);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    *len = sizeof(sockaddr_in);
    return true;
  }
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    *len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

std::string AddressText(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&address)->sin_addr, text, sizeof(text));
  } else if (address.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&address)->sin6_addr, text, sizeof(text));
  }
  return text;
}

// A loopback port nobody listens on right now (the rpc-server's; it may be taken before the
// rpc-server binds it, and then Start tries another).
absl::StatusOr<int> PickLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoError("socket");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), len) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &len) != 0) {
    auto status = ErrnoError("binding a loopback port");
    close(fd);
    return status;
  }
  close(fd);
  return ntohs(address.sin_port);
}

int ConnectLoopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

// (gang_member.h) Copies bytes from `from` to `to` until either side ends, then ends both directions.
void PumpUntilClosed(int from, int to, std::atomic<int64_t>* bytes) {
  std::vector<char> buffer(1 << 20);
  while (true) {
    ssize_t n = read(from, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    ssize_t off = 0;
    while (off < n) {
      ssize_t w = send(to, buffer.data() + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        off = -1;
        break;
      }
      off += w;
    }
    if (off > 0) bytes->fetch_add(off, std::memory_order_relaxed);
    if (off < 0) break;
  }
  shutdown(from, SHUT_RDWR);
  shutdown(to, SHUT_RDWR);
}

bool SameIpAddress(const std::string& a, const std::string& b) {
  auto normal = [](const std::string& host) -> std::string {
    sockaddr_storage address;
    socklen_t len = 0;
    if (!ParseIp(host, &address, &len)) return "";
    if (address.ss_family == AF_INET6) {
      const auto& v6 = reinterpret_cast<const sockaddr_in6*>(&address)->sin6_addr;
      if (IN6_IS_ADDR_V4MAPPED(&v6)) {
        char text[INET_ADDRSTRLEN] = {};
        inet_ntop(AF_INET, &v6.s6_addr[12], text, sizeof(text));
        return text;
      }
    }
    return AddressText(address);
  };
  std::string na = normal(a);
  return !na.empty() && na == normal(b);
}

absl::StatusOr<std::unique_ptr<GangMember>> GangMember::Start(GangMemberOptions options) {
  sockaddr_storage bind_address;
  socklen_t bind_len = 0;
  if (!ParseIp(options.bind_host, &bind_address, &bind_len)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gang_network '", options.bind_host, "' must be this machine's address on the gang network (an IP address)"));
  }
  if (options.bind_host == "0.0.0.0" || options.bind_host == "::" || AddressText(bind_address) == "::" ||
      AddressText(bind_address) == "0.0.0.0") {
    return absl::InvalidArgumentError(
        "gang_network must name one address, not every interface: an rpc-server has no authentication");
  }
  sockaddr_storage leader_address;
  socklen_t leader_len = 0;
  if (!ParseIp(options.leader_host, &leader_address, &leader_len)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the gang leader's address '", options.leader_host, "' is not an IP address"));
  }
  if (options.port < 0 || options.port > 65535) return absl::InvalidArgumentError("gang port outside [0, 65535]");
  if (options.secret.empty()) {
    return absl::InvalidArgumentError("a gang duty without its attempt's secret: the gate would admit anyone");
  }
  if (options.rpc_server.empty()) options.rpc_server = SiblingProgram("ggml-rpc-server");

  auto member = std::unique_ptr<GangMember>(new GangMember());
  member->options_ = options;

  // The gate: the only socket on the gang network.
  member->listen_fd_ = socket(bind_address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (member->listen_fd_ < 0) return ErrnoError("socket");
  int one = 1;
  setsockopt(member->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind_address.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&bind_address)->sin_port = htons(static_cast<uint16_t>(options.port));
  } else {
    reinterpret_cast<sockaddr_in6*>(&bind_address)->sin6_port = htons(static_cast<uint16_t>(options.port));
  }
  if (bind(member->listen_fd_, reinterpret_cast<sockaddr*>(&bind_address), bind_len) != 0) {
    return ErrnoError(absl::StrCat("binding the gang gate to ", options.bind_host, ":", options.port));
  }
  if (listen(member->listen_fd_, 4) != 0) return ErrnoError("listen");
  sockaddr_storage bound;
  socklen_t bound_len = sizeof(bound);
  getsockname(member->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  int port = ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                               : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  member->endpoint_ = bound.ss_family == AF_INET6 ? absl::StrCat("[", options.bind_host, "]:", port)
                                                  : absl::StrCat(options.bind_host, ":", port);

  // Started through the sandbox (Linux), the rpc-server gets a network of its own, reached
  // through a bridge whose socket is in a folder only this user enters.
#ifdef __linux__
  if (options.wrap) {
    std::string folder = (std::filesystem::temp_directory_path() / "minions-gang-XXXXXX").string();
    if (mkdtemp(folder.data()) == nullptr) return ErrnoError("a folder for the rpc-server's bridge");
    member->bridge_dir_ = folder;
    member->bridge_path_ = folder + "/rpc.sock";
  }
#endif

  // rpc-server on a loopback port of its own; another port when the one picked was taken.
  absl::Status last = absl::UnavailableError("rpc-server did not start");
  for (int attempt = 0; attempt < 5 && !member->server_; ++attempt) {
    auto picked = PickLoopbackPort();
    if (!picked.ok()) return picked.status();
    Subprocess::Options process;
    process.argv = {options.rpc_server, "--host", "127.0.0.1", "--port", std::to_string(*picked)};
    if (options.threads > 0) {
      process.argv.push_back("--threads");
      process.argv.push_back(std::to_string(options.threads));
    }
    if (!member->bridge_path_.empty()) unlink(member->bridge_path_.c_str());  // an earlier attempt's
    if (options.wrap) process.argv = options.wrap(process.argv, *picked, member->bridge_path_);
    process.stderr_path = options.stderr_path;
    process.own_process_group = true;
    auto server = Subprocess::Start(process);
    if (!server.ok()) return server.status();
    // Wait until it listens (loading its backends takes a moment) or exits (port taken).
    auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(options.start_timeout);
    bool listening = false;
    while (!listening && (*server)->running() && std::chrono::steady_clock::now() < deadline) {
      int fd = member->ConnectServer(*picked);
      if (fd >= 0) {
        close(fd);  // the rpc-server reads no hello, closes, and accepts the next client
        listening = true;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    if (listening) {
      member->server_ = std::move(*server);
      member->server_port_ = *picked;
    } else if (!member->bridge_path_.empty() && !(*server)->running()) {
      auto exit = (*server)->Wait(absl::Seconds(5));
      if (exit.ok() && exit->exited && exit->code == 126) {
        // The launcher could not give it a network of its own (this kernel refuses this user a
        // namespace): on the machine's loopback, said aloud (docs/security.md 40.1e).
        MINIONS_LOG(Warning) << "gang member: no network namespace for the rpc-server (see "
                             << (options.stderr_path.empty() ? "its stderr" : options.stderr_path)
                             << "): it listens on this machine's loopback, where any local process can reach it";
        std::filesystem::remove_all(member->bridge_dir_);
        member->bridge_dir_.clear();
        member->bridge_path_.clear();
        --attempt;  // the same try, without the namespace
        continue;
      }
      last = absl::UnavailableError(absl::StrCat("rpc-server (", options.rpc_server, ") did not start"));
    } else {
      last = absl::UnavailableError(absl::StrCat("rpc-server (", options.rpc_server, ") did not listen on 127.0.0.1:",
                                                 *picked));
    }
  }
  if (!member->server_) return last;
  if (pipe(member->wake_fd_) != 0) return ErrnoError("pipe");
  fcntl(member->wake_fd_[0], F_SETFD, FD_CLOEXEC);
  fcntl(member->wake_fd_[1], F_SETFD, FD_CLOEXEC);
  member->drain_thread_ = std::thread([m = member.get()] {
    while (m->server_->ReadLine().ok()) {
    }
    m->ServerExited();
  });
  member->accept_thread_ = std::thread([m = member.get()] { m->AcceptLoop(); });
  MINIONS_LOG(Info) << "gang member: rpc-server pid " << member->server_->pid() << " behind " << member->endpoint_
                    << (member->bridge_path_.empty() ? " (on this machine's loopback)" : " (in a network of its own)")
                    << ", admitting only " << options.leader_host;
  return member;
}

GangMember::~GangMember() { Stop(); }

bool GangMember::running() { return server_ && server_->running(); }

void GangMember::ServerExited() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    server_gone_ = true;
  }
  MINIONS_LOG(Warning) << "gang member: rpc-server exited; closing the gate at " << endpoint_
                       << " (the leader finds this member gone)";
  char byte = 0;
  (void)!write(wake_fd_[1], &byte, 1);
}

void GangMember::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) {
      absl::MutexLock lock(&mu_);
      if (server_gone_ && !stopping_) {
        close(listen_fd_);  // connections to the gate are refused from now on
        listen_fd_ = -1;
      }
      return;
    }
    sockaddr_storage peer;
    socklen_t peer_len = sizeof(peer);
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &peer_len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    const std::string peer_host = AddressText(peer);
    if (!SameIpAddress(peer_host, options_.leader_host)) {
      // Not the leader: closed before a byte is read or forwarded.
      refused_.fetch_add(1);
      MINIONS_LOG(Warning) << "gang member: refused a connection from " << peer_host << " (the leader is "
                           << options_.leader_host << ")";
      close(fd);
      continue;
    }
    // The handshake runs on a thread of its own: a peer that says nothing holds up no one else.
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      close(fd);
      continue;
    }
    open_fds_.push_back(fd);
    forwarders_.emplace_back([this, fd] { Admit(fd); });
  }
}

void GangMember::Admit(int client_fd) {
  if (!server_->running()) {
    // Nothing to forward to: closed at once, so the leader's probe finds this member gone.
    shutdown(client_fd, SHUT_RDWR);
    return;
  }
  absl::Status proved = AdmitLeader(client_fd, options_.secret, options_.handshake_timeout);
  if (!proved.ok()) {
    // Not this attempt's leader (or a probe that hung up): closed before a byte reached the rpc-server.
    if (absl::IsPermissionDenied(proved) || absl::IsDeadlineExceeded(proved)) {
      refused_.fetch_add(1);
      MINIONS_LOG(Warning) << "gang member: refused a connection from the leader's address: " << proved.message();
    }
    shutdown(client_fd, SHUT_RDWR);  // closed by Stop (it is in open_fds_)
    return;
  }
  Forward(client_fd);
}

int GangMember::ConnectServer(int port) const {
  if (bridge_path_.empty()) return ConnectLoopback(port);
  absl::StatusOr<int> fd = sandbox::ConnectThroughBridge(bridge_path_, options_.handshake_timeout);
  return fd.ok() ? *fd : -1;
}

void GangMember::Forward(int client_fd) {
  int server_fd = ConnectServer(server_port_);
  if (server_fd < 0) {
    shutdown(client_fd, SHUT_RDWR);
    return;
  }
  int one = 1;
  setsockopt(client_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      close(server_fd);
      return;
    }
    admitted_.fetch_add(1);
    open_fds_.push_back(server_fd);
    forwarders_.emplace_back([this, client_fd, server_fd] { PumpUntilClosed(server_fd, client_fd, &bytes_out_); });
  }
  PumpUntilClosed(client_fd, server_fd, &bytes_in_);  // this (the handshake's) thread carries the leader's side
}

void GangMember::Stop() {
  std::vector<std::thread> forwarders;
  std::vector<int> fds;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    forwarders.swap(forwarders_);
    fds.swap(open_fds_);
  }
  if (wake_fd_[1] >= 0) {
    char byte = 0;
    (void)!write(wake_fd_[1], &byte, 1);
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
  for (int fd : fds) shutdown(fd, SHUT_RDWR);
  for (auto& thread : forwarders) thread.join();
  for (int fd : fds) close(fd);
  if (server_) {
    server_->Signal(SIGKILL);
    (void)server_->Wait();
  }
  if (drain_thread_.joinable()) drain_thread_.join();
  for (int& fd : wake_fd_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  if (!bridge_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(bridge_dir_, ec);
  }
}

}  // namespace minions
