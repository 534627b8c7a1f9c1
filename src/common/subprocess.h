#pragma once
// Subprocess: one child process with pipes to its stdin and stdout (stderr is inherited or sent to a
// file). The executor uses it to supervise its runner; tests use it to drive real processes.
//
// Ownership: owns the child and the parent's pipe ends; the destructor SIGKILLs and reaps a child
// still running, so a Subprocess never leaks a process.
// Dying with this process: every child gets its death signal (SIGKILL unless Options say
// otherwise) when this process dies, however it dies (SIGKILL included), and so does the process
// group of a child started with own_process_group (what the child started in turn). Two
// mechanisms, because macOS has only the first:
//   - the lifeline (subprocess.cc): a helper process forked before the first child, which reads a
//     pipe only this process can write; when this process dies the pipe ends and the helper
//     signals every child (and group) not yet reaped. Both platforms; it covers what a child
//     started. Its limits (a helper killed is replaced only at the next start or reap; at most
//     4096 children at once) are said in subprocess.cc.
//   - on Linux, PR_SET_PDEATHSIG, set by the child before it executes its program. Children are
//     forked by one thread that lives as long as the process (the kernel sends the signal when
//     the forking thread exits, so a caller's short-lived thread must not be the parent).
// An executor's runners and a gang member's rpc-server therefore do not outlive it.
// Threads: one thread at a time may write (Write, CloseStdin), one at a time may read (ReadLine);
// Signal(), Wait(), running() and pid() may be called from any thread (a signal never reaches a
// process that has been reaped, whose pid may belong to another by then).

#include <signal.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace minions {

struct ExitInfo {
  bool exited = false;  // exited normally; `code` is valid
  int code = 0;
  int signal = 0;       // killed by this signal when !exited
  std::string ToString() const;
};

class Subprocess {
 public:
  static constexpr const char* kLifelineName = "lifeline";
  struct Options {
    std::vector<std::string> argv;        // argv[0] is a path or a name looked up in PATH
    std::vector<std::string> extra_env;   // "NAME=value" entries added to this process's environment
    std::string stderr_path;              // empty: inherit this process's stderr
    // Start the child in a process group of its own, and signal the whole group: whatever it
    // starts in turn stops, continues and dies with it (and keeps no pipe of ours open).
    bool own_process_group = false;
    // What the child (and its group) gets when this process dies (the lifeline; on Linux also the
    // parent-death signal). SIGTERM for a child that cleans up after itself (a pool's executors).
    int death_signal = SIGKILL;
  };

  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const Options& options);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // Writes all of `data` to the child's stdin. Fails (never raises SIGPIPE) if the child is gone.
  absl::Status Write(std::string_view data);
  // One line of the child's stdout without its '\n'. DeadlineExceeded after `timeout`; OutOfRange
  // at end of stream (the child closed stdout or exited).
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout = absl::InfiniteDuration());
  void CloseStdin();
  void Signal(int sig);
  // Waits for the child to exit; DeadlineExceeded if it is still running after `timeout`.
  absl::StatusOr<ExitInfo> Wait(absl::Duration timeout = absl::InfiniteDuration());
  pid_t pid() const { return pid_; }
  bool running();

  // The lifeline helper's pid (-1 before the first Start): for tests and diagnostics. On Linux its
  // name (comm) is kLifelineName once it runs.
  static pid_t LifelinePid();

 private:
  Subprocess() = default;

  pid_t pid_ = -1;
  bool group_ = false;             // pid_ leads a process group of its own
  int stdin_fd_ = -1;              // the writing thread's
  int stdout_fd_ = -1;             // the reading thread's
  std::string read_buffer_;        // the reading thread's: output read, lines not yet taken from read_pos_ on
  size_t read_pos_ = 0;            // the reading thread's: where the next line starts in read_buffer_
  size_t read_scanned_ = 0;        // the reading thread's: read_buffer_ holds no '\n' from read_pos_ to here
  absl::Mutex reap_mu_;
  bool reaped_ ABSL_GUARDED_BY(reap_mu_) = false;
  ExitInfo exit_info_ ABSL_GUARDED_BY(reap_mu_);
};

// Absolute path of the running executable ("" if unknown); used to find sibling programs such as
// minions-llama-runner installed next to minions.
std::string CurrentExecutablePath();
// `name` next to the current executable if it exists there, else `name` itself (PATH lookup).
std::string SiblingProgram(const std::string& name);

}  // namespace minions
