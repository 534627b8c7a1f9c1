#include "local_pool.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/credentials.h"
#include "common/host_port.h"
#include "cli/demo.h"
#include "common/logging.h"
#include "common/subprocess.h"
#include "identity/identity_admin.h"
#include "identity/pki.h"
#include "identity_setup.h"
#include "openai/model_catalog.h"
#include "openai/openai_api.h"

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
  std::string admin_token() const override { return admin_token_; }
  std::string admin_token_file() const override { return admin_token_file_; }
  std::string ca_file() const override { return ca_file_; }

  absl::Status Start(const cli::PoolOptions& options) {
    // A pool other machines can reach speaks TLS: say how before anything is made.
    const bool tls = options.tls || !options.tls_cert.empty();
    const bool http = !options.http_listen.empty() && options.http_listen != "off";
    if (!tls && (!IsLoopbackAddress(options.listen) || (http && !IsLoopbackAddress(options.http_listen)))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a pool on ", options.listen, " can be reached from other machines, so it needs TLS: add --tls (a private "
          "CA in ", options.data_dir, "/tls) or --tls-cert, --tls-key and --ca; or listen on 127.0.0.1"));
    }
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
    ControlPlaneOptions cp_options;
    ServerOptions& server_options = cp_options.server;
    server_options.listen = options.listen;
    server_options.http_listen = options.http_listen == "off" ? "" : options.http_listen;
    server_options.lease_ttl = options.lease_ttl;
    if (auto s = SetUpTls(options, &server_options); !s.ok()) return s;
    // The pool's admin: a token in its data folder, which the CLI finds there.
    admin_token_file_ = options.data_dir + "/admin-token";
    absl::StatusOr<std::string> admin = EnsureAdminToken(backends_.store.get(), &clock_, admin_token_file_);
    if (!admin.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("cannot set up the pool's admin token: ", admin.status().message()));
    }
    admin_token_ = *admin;
    // The watchdog as a server's, but with no takeover grace: the pool's executors are its own
    // children and end with it, so after a restart no executor is left to re-attach its leases.
    // (The straggler policy is the default one: the pool has no config file to set it.)
    cp_options.watchdog = ServerWatchdogOptions(options.lease_ttl);
    cp_options.watchdog->takeover_grace = absl::ZeroDuration();
    server_ = std::make_unique<ControlPlane>(backends_.store.get(), backends_.blobs.get(), &clock_,
                                             std::move(cp_options), std::move(*lock));
    // Models: the folders `up --models` named, else the user's own ~/.minions/models. The OpenAI
    // API on the HTTP port serves their GGUF files by name; the executors load from them.
    std::vector<std::string> model_folders;
    for (const std::string& folder : options.model_folders.empty() ? std::vector<std::string>{cli::MinionsHome() + "/models"}
                                                                    : options.model_folders) {
      model_folders.push_back(fs::absolute(folder).lexically_normal().string());
    }
    openai_folder_models_ = std::make_unique<openai::FolderModelCatalog>(model_folders);
    openai_models_ = std::make_unique<openai::RegistryModelCatalog>(backends_.store.get(), openai_folder_models_.get());
    openai_api_ = std::make_unique<openai::OpenAiApi>(
        openai::OpenAiApi::Deps{backends_.store.get(), backends_.blobs.get(), &clock_, &server_->authenticator(),
                                &server_->jobs(), openai_models_.get(), {server_->options().max_chunk_bytes}},
        openai::OpenAiApiOptions{});
    server_->AddHttpRoutes([api = openai_api_.get()](HttpServer* http) { api->Install(http); });
    if (auto s = server_->Start(); !s.ok()) return s;
    // The CLI sends the admin token only to this server (docs/security.md, 40.7c).
    if (auto s = cli::WriteTokenServer(admin_token_file_, server_->address(), getpid()); !s.ok()) return s;
    // The executors enrol with a join token of one use each, in a file only they read.
    const std::string join_file = options.data_dir + "/join-token";
    IssueRequest join;
    join.role = Role::kJoin;
    join.principal = "local-pool";
    join.uses = std::max(1, options.executors);
    join.ttl = absl::Hours(1);
    // One machine, one owner: its executors may form gangs with each other.
    join.scopes = ScopeSet{Scope::kEnrol, Scope::kGang};
    absl::StatusOr<IssuedToken> issued = server_->identities().Issue(join, "local");
    if (!issued.ok()) return issued.status();
    if (auto s = cli::WriteTokenFile(join_file, issued->text); !s.ok()) return s;
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
                 "--availability", "off", "--join-token-file", join_file,
                 // The executors follow URLs into this pool's objects folder only.
                 "--objects", absl::StrCat("file://", fs::absolute(options.data_dir).lexically_normal().string(), "/objects")};
      if (!ca_file_.empty()) sp.argv.insert(sp.argv.end(), {"--ca", ca_file_});
      for (const std::string& folder : model_folders) sp.argv.insert(sp.argv.end(), {"--models", folder});
      sp.stderr_path = absl::StrCat(options.data_dir, "/logs/executor-", i, ".log");
      // A pool whose process dies asks its executors to stop (they stop their runners themselves).
      sp.death_signal = SIGTERM;
      auto process = Subprocess::Start(sp);
      if (!process.ok()) return process.status();
      (*process)->CloseStdin();
      executors_.push_back(std::move(*process));
    }
    return absl::OkStatus();
  }

 private:
  // TLS from the operator's files, or from a private CA made in DATA_DIR/tls. A pool reachable
  // from other machines must have it (the server refuses plain text there).
  absl::Status SetUpTls(const cli::PoolOptions& options, ServerOptions* server_options) {
    if (!options.tls_cert.empty() || !options.tls_key.empty()) {
      if (options.tls_ca.empty()) {
        return absl::InvalidArgumentError(
            "with --tls-cert and --tls-key, say also which CA signed them (--ca), or use --tls for a private CA of "
            "the pool's own");
      }
      server_options->tls = {options.tls_cert, options.tls_key};
      ca_file_ = options.tls_ca;
      return absl::OkStatus();
    }
    if (!options.tls) return absl::OkStatus();
    pki::InitOptions pki_options;
    pki_options.dir = options.data_dir + "/tls";
    std::string host;
    int port = 0;
    if (SplitHostPort(options.listen, &host, &port).ok() && host != "0.0.0.0" && host != "::") {
      pki_options.hosts.push_back(host);
    }
    absl::StatusOr<pki::Files> files = pki::Init(pki_options, clock_.Now());
    if (!files.ok()) return files.status();
    server_options->tls = {files->server_cert, files->server_key};
    ca_file_ = files->ca_cert;
    return absl::OkStatus();
  }

  RealClock clock_;
  Backends backends_;
  std::unique_ptr<openai::FolderModelCatalog> openai_folder_models_;
  std::unique_ptr<openai::RegistryModelCatalog> openai_models_;
  std::unique_ptr<openai::OpenAiApi> openai_api_;  // its routes live as long as the server serves
  std::unique_ptr<ControlPlane> server_;
  std::vector<std::unique_ptr<Subprocess>> executors_;
  std::string admin_token_;
  std::string admin_token_file_;
  std::string ca_file_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<cli::Pool>> StartLocalPool(const cli::PoolOptions& options) {
  auto pool = std::make_unique<LocalPool>();
  if (auto s = pool->Start(options); !s.ok()) return s;
  return std::unique_ptr<cli::Pool>(std::move(pool));
}

}  // namespace minions::apps
