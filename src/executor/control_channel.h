#pragma once
// ControlChannel: the owner's hand controls on the machine itself. A Unix socket in the
// executor's state directory (mode 0600: only the account running the executor, or root, may
// use it) takes one command line per connection and answers with text: pause, resume,
// activity, status. `minions executor pause|resume|activity|status` are its client.
//
// Ownership: owns the listening socket, its file and its thread.
// Threads: the handler runs on the channel's thread; Stop() from any thread.

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace minions {

class ControlChannel {
 public:
  using Handler = std::function<std::string(const std::string& command)>;
  // Listens on `path` (a stale socket file is replaced; a live one is an error: another
  // executor owns this state directory).
  static absl::StatusOr<std::unique_ptr<ControlChannel>> Listen(const std::string& path, Handler handler);
  ~ControlChannel();
  void Stop();

 private:
  ControlChannel(std::string path, int fd, int wake[2], Handler handler);
  void Serve();
  std::string path_;
  int fd_;
  int wake_read_;   // Stop() writes a byte to wake_write_: Serve waits for nothing else
  int wake_write_;
  Handler handler_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Sends one command to the executor listening on `path` and returns its answer.
absl::StatusOr<std::string> SendControlCommand(const std::string& path, const std::string& command,
                                               absl::Duration timeout = absl::Seconds(10));

// The control socket of an executor whose state directory is `state_dir`.
std::string ControlSocketPath(const std::string& state_dir);

}  // namespace minions
