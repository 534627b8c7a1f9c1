#pragma once
// ProcessPool: a pool of real processes on loopback — one `minions server` and N
// `minions executor`s, each its own process — for integration tests, the chaos suite and
// benchmarks. Any of them can be killed and started again (same address, same state directory).
// Every process is SIGKILLed when the pool is destroyed.
//
// Credentials as in production: connection() carries the admin token the first server minted
// into its data folder; executors enrol with a join token the pool issues through the Admin
// service (and keep their credential in their state folder across restarts). EnableTls() makes a
// private CA (`minions pki init`) and runs every process over TLS.
// Threads: one thread at a time.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/admin_verbs.h"
#include "cli/client_verbs.h"
#include "cli/credentials.h"
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

// The start time of process `pid` (field 22 of /proc/PID/stat), or "" when no process has that
// pid or it has died (a zombie nobody has reaped yet counts as dead). With the start time, a pid
// the system has given to another process since does not pass for the one a test watches.
inline std::string LiveProcessStart(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(in, stat)) return "";
  size_t paren = stat.rfind(')');  // the command name before it may hold spaces and parentheses
  if (paren == std::string::npos || paren + 2 > stat.size()) return "";
  std::vector<std::string> fields = absl::StrSplit(stat.substr(paren + 2), ' ');
  // fields[0] is field 3 (the state), so field 22 is fields[19].
  if (fields.size() < 20 || fields[0] == "Z" || fields[0] == "X") return "";
  return fields[19];
}

// Waits until process `pid`, started at `started` (LiveProcessStart), has died. It polls, so the
// wait ends on progress, not after a fixed time; false if it still runs after `patience`.
inline bool WaitUntilDead(pid_t pid, const std::string& started, absl::Duration patience) {
  const absl::Time deadline = absl::Now() + patience;
  while (LiveProcessStart(pid) == started) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
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
    // An executor's children (runners, a gang member's rpc-server) die with it (Subprocess).
    for (auto& [name, e] : executors_) e->Signal(SIGKILL);
    for (auto& server : servers_) server->Signal(SIGKILL);
  }

  // Backend flags for every server of the pool (--database, --objects) and the environment they
  // need (S3 credentials). Default: SQLite and a directory in the pool's folder.
  void SetBackend(std::vector<std::string> server_args, std::vector<std::string> server_env) {
    backend_args_ = std::move(server_args);
    backend_env_ = std::move(server_env);
  }

  // Folders every executor started from now on may load models from (`--models`); an executor
  // loads from nowhere else (executor/model_access.h).
  void AllowModels(std::vector<std::string> folders) { model_folders_ = std::move(folders); }

  // More flags for every server started from now on.
  void AddServerArgs(const std::vector<std::string>& args) {
    server_args_.insert(server_args_.end(), args.begin(), args.end());
  }

  // TLS for every process started from now on: a private CA and server certificate in dir/tls.
  absl::Status EnableTls() {
    Subprocess::Options sp;
    sp.argv = {minions_, "pki", "init", "--dir", dir_ + "/tls"};
    sp.stderr_path = dir_ + "/logs/pki.log";
    auto p = Subprocess::Start(sp);
    if (!p.ok()) return p.status();
    (*p)->CloseStdin();
    while ((*p)->ReadLine().ok()) {
    }
    auto exit = (*p)->Wait(absl::Seconds(60));
    if (!exit.ok() || !exit->exited || exit->code != 0) {
      return absl::InternalError(absl::StrCat("minions pki init failed; see ", dir_, "/logs/pki.log"));
    }
    server_args_.insert(server_args_.end(),
                        {"--tls-cert", dir_ + "/tls/server.pem", "--tls-key", dir_ + "/tls/server-key.pem"});
    connection_.tls.ca_file = dir_ + "/tls/ca.pem";
    return absl::OkStatus();
  }

  // A fresh token (shown once) issued with the admin token; "" (and a test failure) if refused.
  absl::StatusOr<std::string> IssueToken(const std::string& role, const std::string& team, const std::string& name,
                                         int64_t uses = 0, const std::string& scopes = "") {
    auto admin = cli::RemoteAdmin(connection_);
    v1::IssueTokenRequest request;
    request.set_role(role);
    request.set_team(team);
    request.set_principal(name);
    request.set_uses(uses);
    request.set_scopes(scopes);
    auto issued = admin->IssueToken(request);
    if (!issued.ok()) return issued.status();
    return issued->token();
  }
  // Creates a team (through the Admin service).
  absl::Status CreateTeam(const std::string& name) {
    v1::Team team;
    team.set_name(name);
    team.set_max_priority(10);
    return cli::RemoteAdmin(connection_)->CreateTeam(team).status();
  }

  // Starts the server and waits until it answers. After StopServer(), starts it again on the same
  // address and backends (its log goes on in the same file).
  absl::Status StartServer() { return StartServerOn(connection_.server, "server"); }

  // Sends `sig` to the server StartServer() started and waits until it has exited (SIGTERM: a
  // graceful shutdown; SIGKILL: a crash).
  absl::Status StopServer(int sig = SIGKILL) {
    if (!main_server_) return absl::FailedPreconditionError("the server is not running");
    main_server_->Signal(sig);
    auto exit = main_server_->Wait(absl::Seconds(30));
    main_server_ = nullptr;
    if (!exit.ok()) return exit.status();
    return absl::OkStatus();
  }

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
    AppendMarker(sp.stderr_path);
    auto p = Subprocess::Start(sp);
    if (!p.ok()) return p.status();
    if (address == connection_.server) main_server_ = p->get();
    servers_.push_back(std::move(*p));
    // The first server mints the pool's admin token into its data folder before it listens.
    for (int i = 0; i < 150; ++i) {
      if (connection_.token.empty()) {
        auto token = cli::ReadTokenFile(dir_ + "/server/admin-token");
        if (token.ok()) connection_.token = *token;
      }
      cli::Connection connection = connection_;
      connection.server = address;
      if (!connection.token.empty() && cli::JobsClient(connection).List("", 1).ok()) return absl::OkStatus();
      absl::SleepFor(absl::Milliseconds(100));
    }
    return absl::DeadlineExceededError(absl::StrCat(name, " did not come up; see ", dir_, "/logs/", name, ".log"));
  }

  // Starts an executor process. `runner` empty: the built-in llama.cpp runner. Availability is
  // off (the test machine's owner signals are not the test's) unless `extra_args` sets it.
  // `extra_args` go to `minions executor`; `env` ("NAME=value") to it and, as --runner-env, to
  // its runner (which otherwise gets an empty environment), MINIONS_* settings only when they
  // are a test runner's (kRunnerSettings). The executor follows object URLs into
  // the pool's backend only (--objects, unless `extra_args` says) and loads models from the
  // folders AllowModels named.
  absl::Status StartExecutor(const std::string& name, int runner_threads = 1, const std::string& runner = "",
                             const std::string& server = "", const std::vector<std::string>& extra_args = {},
                             const std::vector<std::string>& env = {}) {
    // One join token for the pool's executors, in a file only they read; they may form gangs
    // with each other (an admin's `minions admin join-token --gang`).
    const std::string join_file = dir_ + "/join-token";
    if (!std::filesystem::exists(join_file)) {
      auto join = IssueToken("join", "", "process-pool", 100000, "enrol gang");
      if (!join.ok()) return join.status();
      if (auto s = cli::WriteTokenFile(join_file, *join); !s.ok()) return s;
    }
    Subprocess::Options sp;
    sp.argv = {minions_, "executor", "--server", server.empty() ? connection_.server : server, "--name", name,
               "--state-dir",
               dir_ + "/" + name, "--runner-log", dir_ + "/logs/runner-" + name + ".log", "--runner-threads",
               std::to_string(runner_threads), "--join-token-file", join_file};
    if (connection_.tls.enabled()) sp.argv.insert(sp.argv.end(), {"--ca", connection_.tls.ca_file});
    if (!runner.empty()) {
      sp.argv.push_back("--runner");
      sp.argv.push_back(runner);
    }
    auto has = [&](const char* flag) { return std::find(extra_args.begin(), extra_args.end(), flag) != extra_args.end(); };
    if (!has("--availability")) sp.argv.insert(sp.argv.end(), {"--availability", "off"});
    if (!has("--objects")) sp.argv.insert(sp.argv.end(), {"--objects", ObjectsOrigin()});
    if (!has("--models")) {
      for (const std::string& folder : model_folders_) sp.argv.insert(sp.argv.end(), {"--models", folder});
    }
    // `env` is the runner's (through --runner-env: the runner starts with an empty environment),
    // except the executor's own MINIONS_* settings, which only the executor gets: a runner never
    // sees a credential. The test runners' own settings (kRunnerSettings) are the runner's.
    for (const std::string& pair : env) {
      const bool runners = std::any_of(std::begin(kRunnerSettings), std::end(kRunnerSettings),
                                       [&](const char* prefix) { return absl::StartsWith(pair, prefix); });
      if (absl::StartsWith(pair, "MINIONS_") && !runners) continue;
      sp.argv.insert(sp.argv.end(), {"--runner-env", pair});
    }
    sp.argv.insert(sp.argv.end(), extra_args.begin(), extra_args.end());
    sp.extra_env = env;
    sp.stderr_path = dir_ + "/logs/executor-" + name + ".log";
    // A name used before starts that executor again: same state directory (so same executor id)
    // and log files.
    AppendMarker(sp.stderr_path);
    auto p = Subprocess::Start(sp);
    if (!p.ok()) return p.status();
    executors_[name] = std::move(*p);
    return absl::OkStatus();
  }

  // Waits up to `timeout` for executor `name` to exit on its own (no signal); how it exited.
  absl::StatusOr<ExitInfo> WaitForExecutorExit(const std::string& name, absl::Duration timeout) {
    auto it = executors_.find(name);
    if (it == executors_.end()) return absl::NotFoundError(absl::StrCat("no executor ", name));
    auto exit = it->second->Wait(timeout);
    if (exit.ok()) executors_.erase(it);
    return exit;
  }

  // Sends `sig` to executor `name` and waits until it has exited; its runner dies with it.
  absl::Status StopExecutor(const std::string& name, int sig = SIGKILL) {
    auto it = executors_.find(name);
    if (it == executors_.end()) return absl::NotFoundError(absl::StrCat("no executor ", name));
    it->second->Signal(sig);
    auto exit = it->second->Wait(absl::Seconds(30));
    if (!exit.ok()) return exit.status();
    executors_.erase(it);
    return absl::OkStatus();
  }

  // The process ids of an executor's children (its runner), read from /proc; empty elsewhere.
  // The children executor `name` started (its runners, a gang member's rpc-server), not its
  // lifeline (Subprocess). A child forked and not yet executing its program cannot be told from
  // the lifeline before it names itself, so this waits (for at most 10 s) until none is left in
  // that state.
  std::vector<pid_t> ExecutorChildren(const std::string& name) { return ExecutorChildrenAndLifeline(name).first; }

  // ...and executor `name`'s lifeline (it outlives the executor only to kill its children), or 0.
  std::pair<std::vector<pid_t>, pid_t> ExecutorChildrenAndLifeline(const std::string& name) {
    std::vector<pid_t> children;
    pid_t lifeline = 0;
    auto it = executors_.find(name);
    if (it == executors_.end()) return {children, lifeline};
    const std::string executor = absl::StrCat("/proc/", it->second->pid());
    std::error_code ec;
    const auto program = std::filesystem::read_symlink(executor + "/exe", ec);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (true) {
      children.clear();
      lifeline = 0;
      bool unsettled = false;
      // Each thread lists the children it started.
      for (const auto& thread : std::filesystem::directory_iterator(executor + "/task", ec)) {
        std::ifstream in(thread.path() / "children");
        for (pid_t child; in >> child;) {
          std::string comm;
          std::getline(std::ifstream(absl::StrCat("/proc/", child, "/comm")), comm);
          std::error_code exe_error;
          const auto exe = std::filesystem::read_symlink(absl::StrCat("/proc/", child, "/exe"), exe_error);
          if (comm == Subprocess::kLifelineName) {
            lifeline = child;
          } else {
            unsettled |= !exe_error && exe == program;  // forked, not yet executing its program
            children.push_back(child);
          }
        }
      }
      if (!unsettled || absl::Now() > deadline) return {children, lifeline};
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  // Names of the executors started and not stopped.
  std::vector<std::string> executor_names() const {
    std::vector<std::string> names;
    for (const auto& [name, e] : executors_) names.push_back(name);
    return names;
  }

  Subprocess& executor(const std::string& name) { return *executors_.at(name); }
  // The i-th server started (StartServer again after killing one starts a replacement).
  Subprocess& server(size_t i = 0) { return *servers_.at(i); }
  // The first server's address, the admin token, and the CA when TLS is on.
  const cli::Connection& connection() const { return connection_; }
  // "127.0.0.1:PORT" of a server's HTTP port (metrics, health, dashboard).
  std::string http_address(const std::string& server = "server") const { return http_.at(server); }
  const std::string& dir() const { return dir_; }

 private:
  // The MINIONS_* settings that belong to a runner, not to the executor: the no-op runner's
  // (apps/minions_noop_runner_main.cc) and the paced runner's (bench/paced_runner.cc).
  static constexpr const char* kRunnerSettings[] = {"MINIONS_NOOP_", "MINIONS_PACED_"};

  // Where the pool's objects are, as an executor's --objects: the S3 endpoint of a postgres-s3
  // backend, else the embedded objects folder of the servers' data directory.
  std::string ObjectsOrigin() const {
    for (size_t i = 0; i + 1 < backend_args_.size(); ++i) {
      if (backend_args_[i] != "--objects" || backend_args_[i + 1].rfind("s3://", 0) != 0) continue;
      for (const std::string& e : backend_env_) {
        if (e.rfind("AWS_ENDPOINT_URL=", 0) == 0) return e.substr(17);
      }
    }
    return "file://" + std::filesystem::absolute(dir_ + "/server/objects").lexically_normal().string();
  }

  // A process started again logs into the same file: mark where each run starts.
  static void AppendMarker(const std::string& log) {
    std::ofstream(log, std::ios::app) << "---- started " << absl::FormatTime(absl::Now()) << "\n";
  }

  std::string minions_;
  std::string dir_;
  int ttl_ms_;
  cli::Connection connection_;
  std::vector<std::string> backend_args_;
  std::vector<std::string> backend_env_;
  std::vector<std::string> server_args_;
  std::vector<std::string> model_folders_;
  std::vector<std::unique_ptr<Subprocess>> servers_;  // every one started, dead ones too
  Subprocess* main_server_ = nullptr;                 // the running one at connection().server
  std::map<std::string, std::string> http_;  // server name -> its HTTP address
  std::map<std::string, std::unique_ptr<Subprocess>> executors_;
};

}  // namespace minions::testing
