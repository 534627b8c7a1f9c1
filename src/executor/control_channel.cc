#include "executor/control_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace minions {
namespace {

absl::StatusOr<sockaddr_un> Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("control socket path too long (", path.size(), " > ",
                                                   sizeof(addr.sun_path) - 1, " bytes): ", path));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

// Reads until '\n' or EOF, at most 64 KiB, within the deadline.
std::string ReadLine(int fd, absl::Time deadline, bool whole) {
  std::string out;
  char buffer[4096];
  while (out.size() < 65536) {
    int ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, ms) <= 0) break;
    ssize_t n = read(fd, buffer, sizeof buffer);
    if (n <= 0) break;
    out.append(buffer, n);
    if (!whole && out.find('\n') != std::string::npos) break;
  }
  return out;
}

// A Unix stream socket that is not inherited by the runner and never raises SIGPIPE (portable
// to macOS, which has neither SOCK_CLOEXEC nor MSG_NOSIGNAL).
int Socket() {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd >= 0) fcntl(fd, F_SETFD, FD_CLOEXEC);
#ifdef SO_NOSIGPIPE
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
  return fd;
}

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0
#endif

void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;
    done += n;
  }
}

}  // namespace

std::string ControlSocketPath(const std::string& state_dir) { return state_dir + "/control.sock"; }

absl::StatusOr<std::unique_ptr<ControlChannel>> ControlChannel::Listen(const std::string& path, Handler handler) {
  auto addr = Address(path);
  if (!addr.ok()) return addr.status();
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (SendControlCommand(path, "status", absl::Milliseconds(500)).ok()) {
    return absl::AlreadyExistsError(absl::StrCat("another executor answers on ", path));
  }
  unlink(path.c_str());
  int fd = Socket();
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  mode_t old = umask(0177);
  int r = bind(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr));
  umask(old);
  if (r != 0 || listen(fd, 8) != 0) {
    std::string why = strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot listen on ", path, ": ", why));
  }
  int wake[2];
  if (pipe(wake) != 0) {
    std::string why = strerror(errno);
    close(fd);
    return absl::InternalError(absl::StrCat("pipe: ", why));
  }
  fcntl(wake[0], F_SETFD, FD_CLOEXEC);
  fcntl(wake[1], F_SETFD, FD_CLOEXEC);
  return std::unique_ptr<ControlChannel>(new ControlChannel(path, fd, wake, std::move(handler)));
}

ControlChannel::ControlChannel(std::string path, int fd, int wake[2], Handler handler)
    : path_(std::move(path)), fd_(fd), wake_read_(wake[0]), wake_write_(wake[1]), handler_(std::move(handler)) {
  thread_ = std::thread([this] { Serve(); });
}

ControlChannel::~ControlChannel() { Stop(); }

void ControlChannel::Stop() {
  if (stop_.exchange(true)) return;
  char byte = 0;
  (void)!write(wake_write_, &byte, 1);
  if (thread_.joinable()) thread_.join();
  close(fd_);
  close(wake_read_);
  close(wake_write_);
  unlink(path_.c_str());
}

void ControlChannel::Serve() {
  while (!stop_) {
    pollfd p[2] = {{fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    if (poll(p, 2, -1) <= 0 || (p[1].revents & POLLIN)) continue;  // the wake byte: Stop()
    int client = accept(fd_, nullptr, nullptr);
    if (client < 0) continue;
    fcntl(client, F_SETFD, FD_CLOEXEC);
    std::string command = ReadLine(client, absl::Now() + absl::Seconds(2), false);
    WriteAll(client, handler_(command));
    close(client);
  }
}

absl::StatusOr<std::string> SendControlCommand(const std::string& path, const std::string& command,
                                               absl::Duration timeout) {
  auto addr = Address(path);
  if (!addr.ok()) return addr.status();
  int fd = Socket();
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  if (connect(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    std::string why = strerror(errno);
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("no executor answers on ", path, " (", why, "); is `minions executor` running with this --state-dir?"));
  }
  WriteAll(fd, command + "\n");
  shutdown(fd, SHUT_WR);
  std::string answer = ReadLine(fd, absl::Now() + timeout, true);
  close(fd);
  if (answer.empty()) return absl::DeadlineExceededError(absl::StrCat("the executor on ", path, " did not answer"));
  return answer;
}

}  // namespace minions
