#include "local_pool.h"

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/demo.h"
#include "common/logging.h"
#include "common/subprocess.h"

namespace minions::apps {
namespace fs = std::filesystem;

namespace {

class LocalPool : public cli::Pool {
 public:
  ~LocalPool() override {
    // Drain first (idle executors leave at once), then make sure.
    for (auto& e : executors_) e->Signal(SIGTERM);
    for (auto& e : executors_) e->Signal(SIGTERM);
    for (auto& e : executors_) {
      if (!e->Wait(absl::Seconds(10)).ok()) {
        e->Signal(SIGKILL);
        (void)e->Wait(absl::Seconds(5));
      }
    }
    executors_.clear();
    if (server_) server_->Shutdown();
  }
  std::string address() const override { return server_->address(); }
  int executor_count() const override { return static_cast<int>(executors_.size()); }
  std::string dashboard_url() const override { return server_->dashboard_url(); }

  absl::Status Start(const cli::PoolOptions& options) {
    // The embedded defaults: SQLite and a directory, both in the pool's data directory.
    MinionsConfig config;
    config.data_dir = options.data_dir;
    auto backends = OpenBackends(config, &clock_);
    if (!backends.ok()) return backends.status();
    backends_ = std::move(*backends);
    fs::create_directories(options.data_dir + "/logs");
    auto lock = TryAcquireWatchdog(config);
    if (!lock.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "another pool or server is using ", options.data_dir, " (its watchdog lock is held)"));
    }
    ServerOptions server_options;
    server_options.listen = options.listen;
    server_options.http_listen = options.http_listen == "off" ? "" : options.http_listen;
    server_options.token = options.token;
    server_options.lease_ttl = options.lease_ttl;
    WatchdogOptions watchdog_options;
    watchdog_options.executor_timeout = options.lease_ttl * 3;
    server_ = std::make_unique<MinionsServer>(backends_.store.get(), backends_.blobs.get(), &clock_, server_options,
                                              std::make_unique<Watchdog>(backends_.store.get(), watchdog_options,
                                                                         std::move(*lock)));
    if (auto s = server_->Start(); !s.ok()) return s;
    // Executors on one machine share its cores, and leave one for the server and the agents:
    // decode threads wait for each other by spinning, so a core taken away mid-step stalls them.
    unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    int threads = std::max(1, (static_cast<int>(cores) - 1) / std::max(1, options.executors));
    for (int i = 1; i <= options.executors; ++i) {
      Subprocess::Options sp;
      std::string dir = absl::StrCat(options.data_dir, "/executors/", i);
      sp.argv = {CurrentExecutablePath(), "executor", "--server", server_->address(), "--name",
                 absl::StrCat("executor-", i), "--state-dir", dir, "--runner-log",
                 absl::StrCat(options.data_dir, "/logs/runner-", i, ".log"), "--exit-with-parent",
                 "--runner-threads", std::to_string(threads),
                 // A pool started by hand is the owner's deliberate use of the machine.
                 "--availability", "off",
                 // The executors follow URLs into this pool's objects folder only.
                 "--objects", absl::StrCat("file://", fs::absolute(options.data_dir).lexically_normal().string(), "/objects")};
      // Models: the folders `up --models` named, else the user's own ~/.minions/models.
      std::vector<std::string> model_folders = options.model_folders;
      if (model_folders.empty()) model_folders = {cli::MinionsHome() + "/models"};
      for (const std::string& folder : model_folders) {
        sp.argv.insert(sp.argv.end(), {"--models", fs::absolute(folder).lexically_normal().string()});
      }
      if (!options.token.empty()) sp.extra_env.push_back("MINIONS_TOKEN=" + options.token);
      sp.stderr_path = absl::StrCat(options.data_dir, "/logs/executor-", i, ".log");
      auto process = Subprocess::Start(sp);
      if (!process.ok()) return process.status();
      (*process)->CloseStdin();
      executors_.push_back(std::move(*process));
    }
    return absl::OkStatus();
  }

 private:
  RealClock clock_;
  Backends backends_;
  std::unique_ptr<MinionsServer> server_;
  std::vector<std::unique_ptr<Subprocess>> executors_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<cli::Pool>> StartLocalPool(const cli::PoolOptions& options) {
  auto pool = std::make_unique<LocalPool>();
  if (auto s = pool->Start(options); !s.ok()) return s;
  return std::unique_ptr<cli::Pool>(std::move(pool));
}

}  // namespace minions::apps
