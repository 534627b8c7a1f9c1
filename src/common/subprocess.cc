#include "common/subprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <unistd.h>
#ifdef __APPLE__
#include <mach-o/dyld.h>
#endif

#include <chrono>
#include <climits>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

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

namespace {

// Every child is forked by one thread that lives as long as the process: the spawner. Linux sends
// a child its parent-death signal (PR_SET_PDEATHSIG, set in the child below) when the THREAD that
// forked it exits, not when the process does: a child forked by a caller's thread (a task's
// worker, a gang duty's thread, a short-lived thread of a test) would be SIGKILLed the moment that
// thread ended, while its executor lives on. The spawner is started on first use, detached and
// never stopped (it is leaked on purpose: no destructor runs at exit while it may fork), so a
// child's parent thread ends only when the whole process does.
// Threads: Run from any thread; calls run one at a time, in the order the lock admits them.
class Spawner {
 public:
  static Spawner& Get() {
    static Spawner* spawner = new Spawner();
    return *spawner;
  }

  // Runs `work` on the spawner thread and returns when it has returned.
  void Run(absl::FunctionRef<void()> work) {
    absl::MutexLock one_at_a_time(&call_mu_);
    absl::MutexLock lock(&mu_);
    work_ = &work;
    mu_.Await(absl::Condition(
        +[](const absl::FunctionRef<void()>** pending) { return *pending == nullptr; }, &work_));
  }

 private:
  Spawner() {
    std::thread([this] { Loop(); }).detach();
  }

  void Loop() {
    // Every signal blocked for good: no handler of this process ever runs on this thread, so none
    // runs in a child between fork and exec either (the child sets its own mask before exec).
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, nullptr);
    absl::MutexLock lock(&mu_);
    while (true) {
      mu_.Await(absl::Condition(
          +[](const absl::FunctionRef<void()>** pending) { return *pending != nullptr; }, &work_));
      (*work_)();
      work_ = nullptr;
    }
  }

  absl::Mutex call_mu_;  // admits one caller at a time
  absl::Mutex mu_;
  const absl::FunctionRef<void()>* work_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// `fd` moved to a descriptor >= 3 (close-on-exec), so that the child's dup2 onto stdin, stdout and
// stderr never overwrites another of the pipes (a process started with 0, 1 or 2 closed gets
// them back from pipe()).
int AboveStdio(int fd) {
  if (fd > STDERR_FILENO) return fd;
  int moved = fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
  close(fd);
  return moved;
}

// A pipe whose two ends are close-on-exec and above stdio; false (errno set, both ends -1) on
// failure. Made on the spawner thread: where pipe() cannot set close-on-exec at once (macOS), no
// child may be forked between the two.
bool MakePipe(int fds[2]) {
#ifdef __linux__
  if (pipe2(fds, O_CLOEXEC) != 0) {  // never open without close-on-exec
    fds[0] = fds[1] = -1;
    return false;
  }
#else
  if (pipe(fds) != 0) {
    fds[0] = fds[1] = -1;
    return false;
  }
#endif
  for (int i = 0; i < 2; ++i) {
    fds[i] = AboveStdio(fds[i]);
    if (fds[i] >= 0) fcntl(fds[i], F_SETFD, FD_CLOEXEC);
  }
  if (fds[0] >= 0 && fds[1] >= 0) return true;
  int saved = errno;
  if (fds[0] >= 0) close(fds[0]);
  if (fds[1] >= 0) close(fds[1]);
  fds[0] = fds[1] = -1;
  errno = saved;
  return false;
}

// The lifeline: a small helper process, forked from this one before it starts its first child,
// that outlives it only to signal its children. It holds the read end of a pipe whose write end
// only this process holds (close-on-exec, so no child keeps it), and a table of the children this
// process has started and not yet reaped, which this process keeps up to date through the pipe.
// When this process dies, however it dies, the kernel closes the write end; the helper reads the
// end of the pipe and sends every child in its table its death signal (SIGKILL unless the child's
// Options say otherwise), and the process group of each that was started in one (so what a
// runner started in turn goes too), then exits.
// Why: macOS has no parent-death signal, so without it a runner stalled on a record or a gang
// member's rpc-server (which reads no stdin) would keep its memory after its executor was
// SIGKILLed; on Linux the parent-death signal reaches the child but not what the child started.
// The helper runs on both, so the tests here exercise what macOS relies on.
// A helper that is gone (killed) or stopped (its pipe full for a second) is SIGKILLed, reaped and
// replaced at the next child started or reaped, and the new one is told of every child alive.
// Limits: an entry leaves the table just after its child is reaped, so a process killed in
// between has the helper signal a pid that has just been freed (reused only after the system's
// pids wrap around); a helper killed is replaced only at the next start or reap, and children
// are uncovered meanwhile; more than kLifelineSlots children alive at once are not covered. The
// helper is a fork, not a new program: its memory is a copy-on-write snapshot of this process at
// its first child (pages this process rewrites later are then the helper's own).
// Threads: EnsureStarted, Add and Remove from any thread.
constexpr int kLifelineSlots = 4096;

struct LifelineRecord {
  int32_t op;  // one of the ops below
  int32_t pid;
  int32_t signal;  // for the adds: what the child (and its group) gets when this process dies
};
constexpr int32_t kLifelineAddProcess = 1;
constexpr int32_t kLifelineAddGroup = 2;   // the child leads a process group of its own
constexpr int32_t kLifelineRemove = 3;

// The helper, in the child between fork and (no) exec. It was forked from a threaded process, so
// it makes raw system calls only: no allocation, no lock, nothing another thread may have held at
// the fork. Every signal stays blocked (the spawner's mask), so only SIGKILL and SIGSTOP reach it;
// its own process group keeps it out of a terminal's ^C to this process's group.
[[noreturn]] void LifelineHelper(int read_fd) {
  setpgid(0, 0);
#ifdef __linux__
  prctl(PR_SET_NAME, Subprocess::kLifelineName);  // its name in top, pgrep and ps -o comm (the command line stays)
#endif
  // No descriptor of this process may live on in the helper: a listening socket, a child's pipe
  // or this process's stdout would stay open after this process has died.
  struct rlimit limit;
  int last = getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                 ? static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 1 << 20))
                 : 1 << 16;
#ifdef SYS_close_range
  if (read_fd > 0) syscall(SYS_close_range, 0u, static_cast<unsigned>(read_fd - 1), 0u);
  if (syscall(SYS_close_range, static_cast<unsigned>(read_fd + 1), ~0u, 0u) == 0) last = read_fd;
#endif
  for (int fd = 0; fd < last; ++fd) {
    if (fd != read_fd) close(fd);
  }
  static pid_t pids[kLifelineSlots];
  static int signals[kLifelineSlots];
  static bool groups[kLifelineSlots];
  int used = 0;
  char buffer[sizeof(LifelineRecord) * 64];
  size_t held = 0;
  while (true) {
    ssize_t n = read(read_fd, buffer + held, sizeof(buffer) - held);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // this process has died (or closed the pipe on its way out)
    held += static_cast<size_t>(n);
    size_t whole = held - held % sizeof(LifelineRecord);
    for (size_t at = 0; at < whole; at += sizeof(LifelineRecord)) {
      LifelineRecord record;
      memcpy(&record, buffer + at, sizeof(record));
      if (record.op == kLifelineRemove) {
        for (int i = 0; i < used; ++i) {
          if (pids[i] == record.pid) {
            pids[i] = pids[used - 1];
            signals[i] = signals[used - 1];
            groups[i] = groups[used - 1];
            --used;
            break;
          }
        }
      } else if (used < kLifelineSlots && record.pid > 0) {
        pids[used] = record.pid;
        signals[used] = record.signal;
        groups[used] = record.op == kLifelineAddGroup;
        ++used;
      }
    }
    memmove(buffer, buffer + whole, held - whole);
    held -= whole;
  }
  for (int i = 0; i < used; ++i) {
    if (groups[i]) kill(-pids[i], signals[i]);
    kill(pids[i], signals[i]);
  }
  _exit(0);
}

class Lifeline {
 public:
  static Lifeline& Get() {
    static Lifeline* lifeline = new Lifeline();  // leaked: children may be started until exit
    return *lifeline;
  }

  // Starts the helper if none runs, so that a child is on the lifeline as soon as it is forked.
  void EnsureStarted() {
    absl::MutexLock lock(&mu_);
    if (fd_ < 0) StartHelper();
  }

  void Add(pid_t pid, bool group, int signal) {
    absl::MutexLock lock(&mu_);
    live_[pid] = {group, signal};
    Send({group ? kLifelineAddGroup : kLifelineAddProcess, static_cast<int32_t>(pid), signal});
  }

  void Remove(pid_t pid) {
    absl::MutexLock lock(&mu_);
    if (live_.erase(pid) == 0) return;
    Send({kLifelineRemove, static_cast<int32_t>(pid), 0});
  }

  pid_t helper() {
    absl::MutexLock lock(&mu_);
    return helper_;
  }

 private:
  struct Child {
    bool group;
    int signal;
  };

  // Sends `record` to the helper. A helper that cannot take it (gone, or stopped with its pipe
  // full) is replaced by a new one, told of every child still alive (the record included).
  void Send(const LifelineRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (fd_ >= 0 && WriteAll(&record, sizeof(record))) return;
    if (fd_ >= 0) {
      // Killed before its pipe closes: a helper that is only stopped must not wake to the end of
      // the pipe and signal the children of a process that lives.
      kill(helper_, SIGKILL);
      close(fd_);
      fd_ = -1;
      int status;
      while (waitpid(helper_, &status, 0) < 0 && errno == EINTR) {
      }
      helper_ = -1;
    }
    if (!StartHelper()) return;
    std::vector<LifelineRecord> replay;
    for (const auto& [pid, child] : live_) {
      replay.push_back({child.group ? kLifelineAddGroup : kLifelineAddProcess, static_cast<int32_t>(pid), child.signal});
    }
    if (!replay.empty() && !WriteAll(replay.data(), replay.size() * sizeof(LifelineRecord))) {
      MINIONS_LOG(Warning) << "the lifeline helper " << helper_ << " does not read its pipe";
    }
  }

  // The pipe is non-blocking: a helper that reads nothing for a second (stopped) fails the write
  // rather than hanging this process's starts and reaps behind it.
  bool WriteAll(const void* data, size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const char* at = static_cast<const char*>(data);
    while (size > 0) {
      ssize_t n = ::write(fd_, at, size);  // SIGPIPE is ignored (Start): a dead helper is EPIPE
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) {
        struct pollfd writable = {fd_, POLLOUT, 0};
        if (poll(&writable, 1, 1000) > 0 && (writable.revents & POLLOUT) != 0) continue;
        return false;
      }
      if (n <= 0) return false;
      at += n;
      size -= static_cast<size_t>(n);
    }
    return true;
  }

  bool StartHelper() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int fds[2] = {-1, -1};
    pid_t pid = -1;
    int failed_errno = 0;
    Spawner::Get().Run([&] {
      // Made on the thread that does every fork, so that no child forked in between keeps an end
      // (macOS sets close-on-exec only after pipe()).
      if (!MakePipe(fds)) {
        failed_errno = errno;
        return;
      }
      pid = fork();
      if (pid == 0) LifelineHelper(fds[0]);
      if (pid < 0) failed_errno = errno;
    });
    if (fds[0] >= 0) close(fds[0]);
    if (pid < 0) {
      if (fds[1] >= 0) close(fds[1]);
      MINIONS_LOG(Warning) << "cannot start the lifeline helper (children of this process may outlive it): "
                           << std::strerror(failed_errno);
      return false;
    }
    fcntl(fds[1], F_SETFL, fcntl(fds[1], F_GETFL) | O_NONBLOCK);
    fd_ = fds[1];
    helper_ = pid;
    return true;
  }

  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;       // the pipe's write end
  pid_t helper_ ABSL_GUARDED_BY(mu_) = -1;
  std::map<pid_t, Child> live_ ABSL_GUARDED_BY(mu_);  // children started and not reaped
};

// The program posix_spawnp/execvp would run: `name` itself when it has a slash, else the first
// executable file of that name in this process's PATH. Empty when there is none.
std::string ResolveProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = getenv("PATH");
  std::string_view dirs = path != nullptr && *path != '\0' ? path : "/bin:/usr/bin";
  while (true) {
    size_t colon = dirs.find(':');
    std::string_view dir = dirs.substr(0, colon);
    std::string candidate = (dir.empty() ? std::string(".") : std::string(dir)) + "/" + name;
    struct stat st;
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    if (colon == std::string_view::npos) return "";
    dirs.remove_prefix(colon + 1);
  }
}

// In the child: errno to the parent on `report`, then exit 127.
[[noreturn]] void ReportErrno(int report) {
  int err = errno;
  ssize_t ignored = ::write(report, &err, sizeof(err));
  (void)ignored;
  _exit(127);
}

// In the child between fork and exec: closes every descriptor from 3 on but `keep`
// (close_range where the kernel has it; else each one below the descriptor limit, at most 2^16).
void CloseDescriptorsFrom3Except(int keep) {
#ifdef SYS_close_range
  bool closed = true;
  if (keep > 3) closed = syscall(SYS_close_range, 3u, static_cast<unsigned>(keep - 1), 0u) == 0;
  if (closed && syscall(SYS_close_range, static_cast<unsigned>(std::max(keep + 1, 3)), ~0u, 0u) == 0) return;
#endif
  struct rlimit limit;
  const int last = getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                       ? static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 1 << 16))
                       : 1 << 16;
  for (int fd = 3; fd < last; ++fd) {
    if (fd != keep) close(fd);
  }
}

// In the child between fork and exec: only async-signal-safe calls. Reports errno on `report`
// and exits 127 when it cannot execute the program.
[[noreturn]] void ExecChild(const char* program, char* const* argv, char* const* envp, int stdin_fd,
                            int stdout_fd, const char* stderr_path, bool own_group, int death_signal,
                            const sigset_t& mask,
                            pid_t parent, int report) {
#ifdef __linux__
  // Die with the process that started us, however it dies (SIGKILL included): the kernel sends
  // SIGKILL when our parent thread (the spawner, which lives as long as its process) exits. It
  // survives execve (except into a set-user-ID program) and minions-sandbox's execve of the
  // runner. If the parent died before prctl took effect we were already reparented: give up now.
  if (prctl(PR_SET_PDEATHSIG, death_signal) != 0) ReportErrno(report);
  if (getppid() != parent) _exit(127);
#endif
  // macOS has no parent-death signal: what happens there is said in subprocess.h.
  if (own_group && setpgid(0, 0) != 0) ReportErrno(report);
  if (dup2(stdin_fd, STDIN_FILENO) < 0 || dup2(stdout_fd, STDOUT_FILENO) < 0) ReportErrno(report);
  if (stderr_path != nullptr) {
    int fd = open(stderr_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 || dup2(fd, STDERR_FILENO) < 0) ReportErrno(report);
  }
  // Only descriptors 0-2 reach the program: one this process inherited without close-on-exec (a
  // pipe of the shell that started it) or opened so by a library must not live on in a runner.
  // `report` (close-on-exec) stays open until the exec.
  CloseDescriptorsFrom3Except(report);
  // Every signal is blocked (the spawner's mask): none may run a handler of the parent's in here.
  // The handlers go back to the default before the signals are unblocked, SIGPIPE too (ignored
  // in the parent: a runner that dies must not kill us); the mask is that of Start's caller.
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction current;
    if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, nullptr, &current) != 0) continue;
    if (sig == SIGPIPE || (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN)) {
      sigaction(sig, &dfl, nullptr);
    }
  }
  sigprocmask(SIG_SETMASK, &mask, nullptr);
  execve(program, argv, envp);
  ReportErrno(report);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const Options& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("Subprocess: empty argv");
  // A runner that dies must not kill us with SIGPIPE when we write to it.
  signal(SIGPIPE, SIG_IGN);

  const std::string program = ResolveProgram(options.argv[0]);
  if (program.empty()) {
    return absl::NotFoundError(
        absl::StrCat("cannot start '", options.argv[0], "': ", std::strerror(ENOENT)));
  }
  std::vector<char*> argv;
  for (const auto& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_storage;
  for (char** e = environ; *e; ++e) env_storage.emplace_back(*e);
  for (const auto& e : options.extra_env) env_storage.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);
  sigset_t mask;  // the caller's, for the child (the spawner thread's may differ)
  pthread_sigmask(SIG_SETMASK, nullptr, &mask);

  // in: the child's stdin; out: its stdout; report: errno when it cannot execute (EOF on exec).
  int in_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1}, report[2] = {-1, -1};
  const pid_t parent = getpid();
  const char* stderr_path = options.stderr_path.empty() ? nullptr : options.stderr_path.c_str();
  pid_t pid = -1;
  int failed_errno = 0;
  const char* failed = nullptr;
  Lifeline::Get().EnsureStarted();  // before the fork: the child is on the lifeline as it is born
  Spawner::Get().Run([&] {
    if (!MakePipe(in_pipe) || !MakePipe(out_pipe) || !MakePipe(report)) {
      failed_errno = errno;
      failed = "pipe";
      return;
    }
    pid = fork();
    if (pid == 0) {
      ExecChild(program.c_str(), argv.data(), envp.data(), in_pipe[0], out_pipe[1], stderr_path,
                options.own_process_group, options.death_signal, mask, parent, report[1]);
    }
    if (pid < 0) {
      failed_errno = errno;
      failed = "fork";
    }
  });
  for (int fd : {in_pipe[0], out_pipe[1], report[1]}) {
    if (fd >= 0) close(fd);
  }
  if (failed != nullptr) {
    for (int fd : {in_pipe[1], out_pipe[0], report[0]}) {
      if (fd >= 0) close(fd);
    }
    errno = failed_errno;
    return ErrnoError(failed);
  }
  Lifeline::Get().Add(pid, options.own_process_group, options.death_signal);
  // Also from here, so that Signal() reaches the group even before the child has run setpgid
  // (fails harmlessly once the child has executed its program).
  if (options.own_process_group) setpgid(pid, pid);
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(report[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n > 0) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    Lifeline::Get().Remove(pid);
    close(in_pipe[1]);
    close(out_pipe[0]);
    return absl::NotFoundError(
        absl::StrCat("cannot start '", options.argv[0], "': ", std::strerror(child_errno)));
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
    // Lines are taken from read_pos_ on and the buffer is compacted only once its taken part is
    // at least half of it, so that a read of many short lines costs linear time (not a move of the
    // rest of the buffer per line); the search for '\n' resumes where the last one stopped, so a
    // line longer than a read costs linear time too.
    size_t nl = read_buffer_.find('\n', read_scanned_);
    if (nl != std::string::npos) {
      std::string line = read_buffer_.substr(read_pos_, nl - read_pos_);
      read_pos_ = read_scanned_ = nl + 1;
      if (read_pos_ == read_buffer_.size()) {
        read_buffer_.clear();
        read_pos_ = read_scanned_ = 0;
      } else if (read_pos_ * 2 >= read_buffer_.size()) {
        read_buffer_.erase(0, read_pos_);
        read_pos_ = read_scanned_ = 0;
      }
      return line;
    }
    read_scanned_ = read_buffer_.size();
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
      if (read_pos_ < read_buffer_.size()) {
        std::string rest = read_buffer_.substr(read_pos_);
        read_buffer_.clear();
        read_pos_ = read_scanned_ = 0;
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
        Lifeline::Get().Remove(pid_);
        return exit_info_;
      }
      if (rc < 0 && errno == ECHILD) Lifeline::Get().Remove(pid_);  // reaped by someone else: not ours to signal
      if (rc < 0 && errno != EINTR) return ErrnoError("waitpid");
    }
    if (MillisLeft(deadline) == 0) return absl::DeadlineExceededError("child still running");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(20));
  }
}

pid_t Subprocess::LifelinePid() { return Lifeline::Get().helper(); }

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
