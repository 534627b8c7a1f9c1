#include "common/subprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __APPLE__
#include <mach-o/dyld.h>
#endif

#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace minions {
namespace {

absl::Status ErrnoError(std::string_view what) {
  return absl::InternalError(absl::StrCat(std::string(what), ": ", std::strerror(errno)));
}

int64_t MillisLeft(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() < 0 ? 0 : left.count();
}

std::chrono::steady_clock::time_point DeadlineAfter(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return std::chrono::steady_clock::time_point::max();
  return std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(timeout);
}

}  // namespace

std::string ExitInfo::ToString() const {
  if (exited) return absl::StrCat("exited with code ", code);
  return absl::StrCat("killed by signal ", signal, " (", strsignal(signal), ")");
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const Options& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("Subprocess: empty argv");
  // A runner that dies must not kill us with SIGPIPE when we write to it.
  signal(SIGPIPE, SIG_IGN);

  int in_pipe[2], out_pipe[2];
  if (pipe(in_pipe) != 0) return ErrnoError("pipe");
  if (pipe(out_pipe) != 0) {
    close(in_pipe[0]);
    close(in_pipe[1]);
    return ErrnoError("pipe");
  }
  // The parent's ends must not leak into this or any other child.
  fcntl(in_pipe[1], F_SETFD, FD_CLOEXEC);
  fcntl(out_pipe[0], F_SETFD, FD_CLOEXEC);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_pipe[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, in_pipe[0]);
  posix_spawn_file_actions_addclose(&actions, out_pipe[1]);
  if (!options.stderr_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, options.stderr_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Restore default SIGPIPE handling in the child.
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  short flags = POSIX_SPAWN_SETSIGDEF;
  if (options.own_process_group) {
    posix_spawnattr_setpgroup(&attr, 0);
    flags |= POSIX_SPAWN_SETPGROUP;
  }
  posix_spawnattr_setflags(&attr, flags);

  std::vector<char*> argv;
  for (const auto& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_storage;
  for (char** e = environ; *e; ++e) env_storage.emplace_back(*e);
  for (const auto& e : options.extra_env) env_storage.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);

  pid_t pid = -1;
  int rc = posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(in_pipe[0]);
  close(out_pipe[1]);
  if (rc != 0) {
    close(in_pipe[1]);
    close(out_pipe[0]);
    return absl::NotFoundError(
        absl::StrCat("cannot start '", options.argv[0], "': ", std::strerror(rc)));
  }
  auto process = std::unique_ptr<Subprocess>(new Subprocess());
  process->pid_ = pid;
  process->group_ = options.own_process_group;
  process->stdin_fd_ = in_pipe[1];
  process->stdout_fd_ = out_pipe[0];
  return process;
}

Subprocess::~Subprocess() {
  CloseStdin();
  Signal(SIGKILL);
  if (pid_ > 0) (void)Wait();
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

absl::Status Subprocess::Write(std::string_view data) {
  if (stdin_fd_ < 0) return absl::FailedPreconditionError("runner stdin is closed");
  while (!data.empty()) {
    ssize_t n = ::write(stdin_fd_, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrCat("writing to child ", pid_, " failed: ", std::strerror(errno)));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Subprocess::ReadLine(absl::Duration timeout) {
  auto deadline = DeadlineAfter(timeout);
  while (true) {
    size_t nl = read_buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = read_buffer_.substr(0, nl);
      read_buffer_.erase(0, nl + 1);
      return line;
    }
    if (stdout_fd_ < 0) return absl::OutOfRangeError("child output closed");
    struct pollfd pfd = {stdout_fd_, POLLIN, 0};
    int wait_ms = deadline == std::chrono::steady_clock::time_point::max()
                      ? -1
                      : static_cast<int>(std::min<int64_t>(MillisLeft(deadline), INT_MAX));
    int rc = poll(&pfd, 1, wait_ms);
    if (rc < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("poll");
    }
    if (rc == 0) return absl::DeadlineExceededError("no line from child before the deadline");
    char buf[65536];
    ssize_t n = ::read(stdout_fd_, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read");
    }
    if (n == 0) {
      close(stdout_fd_);
      stdout_fd_ = -1;
      if (!read_buffer_.empty()) {
        std::string rest = std::move(read_buffer_);
        read_buffer_.clear();
        return rest;
      }
      return absl::OutOfRangeError("child output closed");
    }
    read_buffer_.append(buf, static_cast<size_t>(n));
  }
}

void Subprocess::CloseStdin() {
  if (stdin_fd_ >= 0) {
    close(stdin_fd_);
    stdin_fd_ = -1;
  }
}

void Subprocess::Signal(int sig) {
  absl::MutexLock lock(&reap_mu_);
  if (pid_ <= 0 || reaped_) return;
  // The group lives on (a process the child started) while the leader is a zombie not yet reaped.
  if (group_) kill(-pid_, sig);
  kill(pid_, sig);
}

bool Subprocess::running() {
  auto info = Wait(absl::ZeroDuration());
  return !info.ok();
}

absl::StatusOr<ExitInfo> Subprocess::Wait(absl::Duration timeout) {
  auto deadline = DeadlineAfter(timeout);
  auto backoff = std::chrono::milliseconds(1);
  while (true) {
    {
      // Reaped under the lock, so that Signal() never reaches a pid the system may reuse.
      absl::MutexLock lock(&reap_mu_);
      if (reaped_) return exit_info_;
      int status = 0;
      pid_t rc = waitpid(pid_, &status, WNOHANG);
      if (rc == pid_) {
        reaped_ = true;
        exit_info_.exited = WIFEXITED(status);
        exit_info_.code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
        exit_info_.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        return exit_info_;
      }
      if (rc < 0 && errno != EINTR) return ErrnoError("waitpid");
    }
    if (MillisLeft(deadline) == 0) return absl::DeadlineExceededError("child still running");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(20));
  }
}

std::string CurrentExecutablePath() {
#ifdef __APPLE__
  char buf[PATH_MAX];
  uint32_t size = sizeof(buf);
  if (_NSGetExecutablePath(buf, &size) != 0) return "";
  char resolved[PATH_MAX];
  if (realpath(buf, resolved) == nullptr) return buf;
  return resolved;
#else
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  return buf;
#endif
}

std::string SiblingProgram(const std::string& name) {
  std::string self = CurrentExecutablePath();
  auto slash = self.rfind('/');
  if (slash != std::string::npos) {
    std::string candidate = self.substr(0, slash + 1) + name;
    struct stat st;
    if (stat(candidate.c_str(), &st) == 0 && (st.st_mode & S_IXUSR)) return candidate;
  }
  return name;
}

}  // namespace minions
