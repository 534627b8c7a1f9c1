#include "sandbox/own_network.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#ifdef __linux__
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#endif

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace minions::sandbox {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

bool UnixAddress(const std::string& path, sockaddr_un* address) {
  std::memset(address, 0, sizeof(*address));
  address->sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address->sun_path)) return false;
  std::memcpy(address->sun_path, path.data(), path.size());
  return true;
}

#ifdef __linux__
bool WriteFile(const char* path, const std::string& text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  return ok;
}

// The bridge's life: answers each connection of this user with a socket connected to the
// rpc-server (status byte '1' and the descriptor), or '0' when nothing listens yet.
[[noreturn]] void Bridge(int listen_fd, int port, pid_t parent) {
  const uid_t uid = getuid();
  while (true) {
    // The parent-death signal ends the bridge with the rpc-server; this check too, for an
    // rpc-server that exits in a way that signal misses (seen after SIGTERM).
    pollfd wait{listen_fd, POLLIN, 0};
    if (poll(&wait, 1, 1000) == 0) {
      if (getppid() != parent) _exit(0);
      continue;
    }
    int client = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (client < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      _exit(1);
    }
    fcntl(client, F_SETFL, fcntl(client, F_GETFL) & ~O_NONBLOCK);
    ucred peer{};
    socklen_t len = sizeof(peer);
    if (getsockopt(client, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.uid != uid) {
      close(client);  // another user's process: nothing, not even a refusal
      continue;
    }
    int tcp = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    const bool connected =
        tcp >= 0 && connect(tcp, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    char status = connected ? '1' : '0';
    iovec io{&status, 1};
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (connected) {
      message.msg_control = control;
      message.msg_controllen = sizeof(control);
      cmsghdr* header = CMSG_FIRSTHDR(&message);
      header->cmsg_level = SOL_SOCKET;
      header->cmsg_type = SCM_RIGHTS;
      header->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(header), &tcp, sizeof(int));
    }
    (void)!sendmsg(client, &message, MSG_NOSIGNAL);
    if (tcp >= 0) close(tcp);
    close(client);
  }
}
#endif

}  // namespace

#ifdef __linux__
absl::Status EnterOwnNetwork() {
  if (unshare(CLONE_NEWNET) != 0) {
    if (errno != EPERM) return Errno("a network namespace for the rpc-server");
    // Not root: through a user namespace of its own, where this user is itself (never root
    // outside it); its capabilities there end when the rpc-server is executed.
    const uid_t uid = getuid();
    const gid_t gid = getgid();
    if (unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0) {
      return Errno("a network namespace for the rpc-server (this kernel refuses this user namespaces)");
    }
    if (!WriteFile("/proc/self/setgroups", "deny") || !WriteFile("/proc/self/uid_map", absl::StrCat(uid, " ", uid, " 1")) ||
        !WriteFile("/proc/self/gid_map", absl::StrCat(gid, " ", gid, " 1"))) {
      return Errno("mapping this user into the rpc-server's user namespace");
    }
  }
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  ifreq request{};
  std::strncpy(request.ifr_name, "lo", IFNAMSIZ - 1);
  bool up = ioctl(fd, SIOCGIFFLAGS, &request) == 0;
  request.ifr_flags |= IFF_UP;
  up = up && ioctl(fd, SIOCSIFFLAGS, &request) == 0;
  absl::Status status = up ? absl::OkStatus() : Errno("bringing up the rpc-server's loopback");
  close(fd);
  return status;
}

absl::StatusOr<int> StartBridge(const std::string& path, int port) {
  sockaddr_un address;
  if (!UnixAddress(path, &address)) return absl::InvalidArgumentError(absl::StrCat("bridge path too long: ", path));
  int listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd < 0) return Errno("socket");
  if (bind(listen_fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 || listen(listen_fd, 16) != 0) {
    absl::Status status = Errno(absl::StrCat("the bridge's socket ", path));
    close(listen_fd);
    return status;
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(listen_fd);
    return Errno("fork");
  }
  if (pid == 0) {
    // Dies with the rpc-server (this process, once it executes it); holds none of its
    // descriptors (its output pipe tells the executor when the rpc-server exits).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    int null = open("/dev/null", O_RDWR);
    if (null < 0) _exit(1);
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);
    if (dup2(listen_fd, 3) < 0) _exit(1);
    for (int fd = 4; fd < 1024; ++fd) close(fd);  // the launcher's: none are the bridge's
    Bridge(3, port, parent);
  }
  close(listen_fd);
  return static_cast<int>(pid);
}
#else
absl::Status EnterOwnNetwork() { return absl::UnimplementedError("network namespaces are Linux's"); }
absl::StatusOr<int> StartBridge(const std::string&, int) {
  return absl::UnimplementedError("network namespaces are Linux's");
}
#endif

absl::StatusOr<int> ConnectThroughBridge(const std::string& path, absl::Duration timeout) {
  sockaddr_un address;
  if (!UnixAddress(path, &address)) return absl::InvalidArgumentError(absl::StrCat("bridge path too long: ", path));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  timeval wait{};
  wait.tv_sec = absl::ToInt64Seconds(timeout);
  wait.tv_usec = absl::ToInt64Microseconds(timeout - absl::Seconds(wait.tv_sec));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    absl::Status status = Errno(absl::StrCat("the rpc-server's bridge ", path));
    close(fd);
    return status;
  }
  char status = 0;
  iovec io{&status, 1};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
#ifdef MSG_CMSG_CLOEXEC
  const int flags = MSG_CMSG_CLOEXEC;
#else
  const int flags = 0;
#endif
  ssize_t n;
  do {
    n = recvmsg(fd, &message, flags);
  } while (n < 0 && errno == EINTR);
  close(fd);
  int tcp = -1;
  for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr; header = CMSG_NXTHDR(&message, header)) {
    if (header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_RIGHTS) {
      std::memcpy(&tcp, CMSG_DATA(header), sizeof(int));
    }
  }
  if (n != 1 || status != '1' || tcp < 0) {
    if (tcp >= 0) close(tcp);
    return absl::UnavailableError("the rpc-server does not listen yet");
  }
  fcntl(tcp, F_SETFD, FD_CLOEXEC);
  int one = 1;
  setsockopt(tcp, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return tcp;
}

}  // namespace minions::sandbox
