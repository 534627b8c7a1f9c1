#pragma once
// A pool of real processes on loopback for integration tests: one `minions server` and N
// `minions executor`s, each its own process, started from the build tree. Every process is
// SIGKILLed when the pool is destroyed.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/client_verbs.h"
#include "common/subprocess.h"

namespace minions::testing {

inline int PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

class ProcessPool {
 public:
  ProcessPool(std::string minions, std::string dir, int lease_ttl_ms)
      : minions_(std::move(minions)), dir_(std::move(dir)), ttl_ms_(lease_ttl_ms) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ + "/logs");
    connection_.server = absl::StrCat("127.0.0.1:", PickFreePort());
  }
  ~ProcessPool() {
    for (auto& [name, e] : executors_) e->Signal(SIGKILL);
    if (server_) server_->Signal(SIGKILL);
  }

  void StartServer() {
    Subprocess::Options sp;
    sp.argv = {minions_, "server", "--listen", connection_.server, "--data-dir", dir_ + "/server",
               "--lease-ttl-ms", std::to_string(ttl_ms_)};
    sp.stderr_path = dir_ + "/logs/server.log";
    auto p = Subprocess::Start(sp);
    ASSERT_TRUE(p.ok()) << p.status();
    server_ = std::move(*p);
    cli::JobsClient client(connection_);
    for (int i = 0; i < 100; ++i) {
      if (client.List("", 1).ok()) return;
      absl::SleepFor(absl::Milliseconds(100));
    }
    FAIL() << "server did not come up; see " << dir_ << "/logs/server.log";
  }

  void StartExecutor(const std::string& name, int runner_threads = 1) {
    Subprocess::Options sp;
    sp.argv = {minions_, "executor", "--server", connection_.server, "--name", name, "--state-dir",
               dir_ + "/" + name, "--runner-log", dir_ + "/logs/runner-" + name + ".log", "--runner-threads",
               std::to_string(runner_threads)};
    sp.stderr_path = dir_ + "/logs/executor-" + name + ".log";
    auto p = Subprocess::Start(sp);
    ASSERT_TRUE(p.ok()) << p.status();
    executors_[name] = std::move(*p);
  }

  Subprocess& executor(const std::string& name) { return *executors_.at(name); }
  const cli::Connection& connection() const { return connection_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string minions_;
  std::string dir_;
  int ttl_ms_;
  cli::Connection connection_;
  std::unique_ptr<Subprocess> server_;
  std::map<std::string, std::unique_ptr<Subprocess>> executors_;
};

}  // namespace minions::testing
