#pragma once
// ProcessPool: a pool of real processes on loopback — one `minions server` and N
// `minions executor`s, each its own process — for integration tests and benchmarks. Every process
// is SIGKILLed when the pool is destroyed.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/client_verbs.h"
#include "common/subprocess.h"

namespace minions::testing {

// A loopback port that was free a moment ago.
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
  // `minions` is the path of the minions binary; `dir` is wiped and holds data and logs.
  ProcessPool(std::string minions, std::string dir, int lease_ttl_ms)
      : minions_(std::move(minions)), dir_(std::move(dir)), ttl_ms_(lease_ttl_ms) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ + "/logs");
    connection_.server = absl::StrCat("127.0.0.1:", PickFreePort());
  }
  ~ProcessPool() {
    for (auto& [name, e] : executors_) e->Signal(SIGKILL);
    for (auto& server : servers_) server->Signal(SIGKILL);
  }

  // Backend flags for every server of the pool (--database, --objects) and the environment they
  // need (S3 credentials). Default: SQLite and a directory in the pool's folder.
  void SetBackend(std::vector<std::string> server_args, std::vector<std::string> server_env) {
    backend_args_ = std::move(server_args);
    backend_env_ = std::move(server_env);
  }

  // More flags for every server started from now on.
  void AddServerArgs(const std::vector<std::string>& args) {
    server_args_.insert(server_args_.end(), args.begin(), args.end());
  }

  // Starts the server and waits until it answers.
  absl::Status StartServer() { return StartServerOn(connection_.server, "server"); }

  // Starts another server on the same backends (several servers serve one fleet).
  absl::StatusOr<std::string> StartAnotherServer(const std::string& name) {
    std::string address = absl::StrCat("127.0.0.1:", PickFreePort());
    if (auto s = StartServerOn(address, name); !s.ok()) return s;
    return address;
  }

  absl::Status StartServerOn(const std::string& address, const std::string& name) {
    Subprocess::Options sp;
    std::string http = absl::StrCat("127.0.0.1:", PickFreePort());
    http_[name] = http;
    sp.argv = {minions_, "server", "--listen", address, "--http-listen", http, "--data-dir", dir_ + "/server",
               "--lease-ttl-ms", std::to_string(ttl_ms_)};
    sp.argv.insert(sp.argv.end(), backend_args_.begin(), backend_args_.end());
    sp.argv.insert(sp.argv.end(), server_args_.begin(), server_args_.end());
    sp.extra_env = backend_env_;
    sp.stderr_path = dir_ + "/logs/" + name + ".log";
    auto p = Subprocess::Start(sp);
    if (!p.ok()) return p.status();
    servers_.push_back(std::move(*p));
    cli::Connection connection = connection_;
    connection.server = address;
    cli::JobsClient client(connection);
    for (int i = 0; i < 150; ++i) {
      if (client.List("", 1).ok()) return absl::OkStatus();
      absl::SleepFor(absl::Milliseconds(100));
    }
    return absl::DeadlineExceededError(absl::StrCat(name, " did not come up; see ", dir_, "/logs/", name, ".log"));
  }

  // Starts an executor process. `runner` empty: the built-in llama.cpp runner. Availability is
  // off (the test machine's owner signals are not the test's) unless `extra_args` sets it.
  // `extra_args` go to `minions executor`; `env` ("NAME=value") to it and so to its runner.
  absl::Status StartExecutor(const std::string& name, int runner_threads = 1, const std::string& runner = "",
                             const std::string& server = "", const std::vector<std::string>& extra_args = {},
                             const std::vector<std::string>& env = {}) {
    Subprocess::Options sp;
    sp.argv = {minions_, "executor", "--server", server.empty() ? connection_.server : server, "--name", name,
               "--state-dir",
               dir_ + "/" + name, "--runner-log", dir_ + "/logs/runner-" + name + ".log", "--runner-threads",
               std::to_string(runner_threads)};
    if (!runner.empty()) {
      sp.argv.push_back("--runner");
      sp.argv.push_back(runner);
    }
    if (std::find(extra_args.begin(), extra_args.end(), "--availability") == extra_args.end()) {
      sp.argv.insert(sp.argv.end(), {"--availability", "off"});
    }
    sp.argv.insert(sp.argv.end(), extra_args.begin(), extra_args.end());
    sp.extra_env = env;
    sp.stderr_path = dir_ + "/logs/executor-" + name + ".log";
    auto p = Subprocess::Start(sp);
    if (!p.ok()) return p.status();
    executors_[name] = std::move(*p);
    return absl::OkStatus();
  }

  Subprocess& executor(const std::string& name) { return *executors_.at(name); }
  // The i-th server started (StartServer again after killing one starts a replacement).
  Subprocess& server(size_t i = 0) { return *servers_.at(i); }
  const cli::Connection& connection() const { return connection_; }
  // "127.0.0.1:PORT" of a server's HTTP port (metrics, health, dashboard).
  std::string http_address(const std::string& server = "server") const { return http_.at(server); }
  const std::string& dir() const { return dir_; }

 private:
  std::string minions_;
  std::string dir_;
  int ttl_ms_;
  cli::Connection connection_;
  std::vector<std::string> backend_args_;
  std::vector<std::string> backend_env_;
  std::vector<std::string> server_args_;
  std::vector<std::unique_ptr<Subprocess>> servers_;
  std::map<std::string, std::string> http_;  // server name -> its HTTP address
  std::map<std::string, std::unique_ptr<Subprocess>> executors_;
};

}  // namespace minions::testing
