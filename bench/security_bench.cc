// minions-bench-security: the cost of security on the hot path, side by side in one run
// (docs/benchmarks.md records the figures and the commands).
//
// Three pools of real processes on loopback, each a `minions server` (SQLite) and executors with
// the no-op runner, so the control plane is all there is to measure:
//   before   the `minions` of a build without identities (--baseline-bin: a build of the commit
//            before them), plain text, no credentials at all
//   tokens   this build on loopback: plain text, every call authorised (credential cache, scopes)
//   tls      this build with TLS on both ports (a private CA from `minions pki init`) and tokens
// Each round starts each pool afresh (in a rotating order, so no pool always runs first) and
// measures, after a warm-up job:
//   throughput    N one-record tasks leased, run and completed: tasks/s, submit to job completed;
//                 and tasks per CPU-second of the server and executor processes (/proc), which a
//                 machine shared with other work disturbs far less than wall time
//   first result  a one-record job on the warm pool, from a client with a warm connection (as a
//                 long-lived client; a fresh CLI process adds one TLS handshake): submit to its
//                 result (job completed)
// The report gives medians over the rounds and the ratios to `before`. First, in this process,
// what one token check costs: Authenticator::Authorize on a cached credential (SHA-256 of the
// token, the cache lookup, expiry, scope, the team's rate), against the hash alone.
//
//   minions-bench-security --baseline-bin /path/to/old/build/apps [--tasks 2000] [--executors 2]
//                          [--rounds 3] [--trials 15]

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench_util.h"
#include "cli/admin_verbs.h"
#include "cli/client_verbs.h"
#include "cli/credentials.h"
#include "common/subprocess.h"
#include "identity/authenticator.h"
#include "identity/identity_admin.h"
#include "identity/token.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/process_pool.h"

namespace {

namespace fs = std::filesystem;
using minions::Subprocess;
using minions::bench::BinDir;
using minions::bench::CpuSeconds;
using minions::testing::PickFreePort;

enum class Mode { kBefore, kTokens, kTls };
const char* Name(Mode m) { return m == Mode::kBefore ? "before" : m == Mode::kTokens ? "tokens" : "tls"; }

// One pool of processes; everything is SIGKILLed when it goes.
class BenchPool {
 public:
  BenchPool(Mode mode, std::string bin, std::string dir) : mode_(mode), bin_(std::move(bin)), dir_(std::move(dir)) {}
  ~BenchPool() {
    for (auto& e : executors_) e->Signal(SIGKILL);
    if (server_) server_->Signal(SIGKILL);
    for (auto& e : executors_) (void)e->Wait(absl::Seconds(10));
    if (server_) (void)server_->Wait(absl::Seconds(10));
  }

  bool Start(int executors) {
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/logs");
    connection_.server = absl::StrCat("127.0.0.1:", PickFreePort());
    std::vector<std::string> argv = {bin_ + "/minions", "server", "--listen", connection_.server, "--http-listen",
                                     "off", "--data-dir", dir_ + "/server", "--lease-ttl-ms", "9000"};
    if (mode_ == Mode::kTls) {
      if (!Run({bin_ + "/minions", "pki", "init", "--dir", dir_ + "/tls"})) return false;
      argv.insert(argv.end(), {"--tls-cert", dir_ + "/tls/server.pem", "--tls-key", dir_ + "/tls/server-key.pem"});
      connection_.tls.ca_file = dir_ + "/tls/ca.pem";
    }
    server_ = Spawn(argv, "server");
    if (!server_) return false;
    for (int i = 0; i < 300; ++i) {
      if (mode_ != Mode::kBefore && connection_.token.empty()) {
        auto token = minions::cli::ReadTokenFile(dir_ + "/server/admin-token");
        if (token.ok()) connection_.token = *token;
      }
      if ((mode_ == Mode::kBefore || !connection_.token.empty()) &&
          minions::cli::JobsClient(connection_).List("", 1).ok()) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    std::string join_file;
    if (mode_ != Mode::kBefore) {
      minions::v1::IssueTokenRequest join;
      join.set_role("join");
      join.set_principal("bench");
      join.set_uses(executors);
      auto issued = minions::cli::RemoteAdmin(connection_)->IssueToken(join);
      if (!issued.ok()) {
        fprintf(stderr, "join token: %s\n", std::string(issued.status().message()).c_str());
        return false;
      }
      join_file = dir_ + "/join-token";
      if (!minions::cli::WriteTokenFile(join_file, issued->token()).ok()) return false;
    }
    for (int i = 1; i <= executors; ++i) {
      std::vector<std::string> e = {bin_ + "/minions", "executor", "--server", connection_.server, "--name",
                                    absl::StrCat("e", i), "--state-dir", absl::StrCat(dir_, "/e", i),
                                    "--runner", BinDir() + "/minions-noop-runner", "--availability", "off",
                                    "--runner-threads", "1"};
      if (!join_file.empty()) e.insert(e.end(), {"--join-token-file", join_file});
      // This build's executors follow object URLs into their pool's objects folder only and load
      // models from named folders only (the "model" is the no-op runner's own file); the build
      // before identities has neither flag, nor the checks.
      if (mode_ != Mode::kBefore) {
        e.insert(e.end(), {"--objects", "file://" + fs::absolute(dir_ + "/server/objects").lexically_normal().string(),
                           "--models", BinDir()});
      }
      if (mode_ == Mode::kTls) e.insert(e.end(), {"--ca", connection_.tls.ca_file});
      auto process = Spawn(e, absl::StrCat("executor-", i));
      if (!process) return false;
      executors_.push_back(std::move(process));
    }
    return true;
  }

  // CPU seconds the server and the executors have used so far.
  double Cpu() const {
    double total = CpuSeconds(server_->pid());
    for (const auto& e : executors_) total += CpuSeconds(e->pid());
    return total;
  }

  // Submits `tasks` one-record tasks; seconds from submit to the job completed (-1: failed).
  double TimeJob(int tasks) {
    std::string input;
    for (int i = 0; i < tasks; ++i) absl::StrAppend(&input, R"({"custom_id":"t)", i, R"(","prompt":"x"})", "\n");
    if (!client_) client_ = std::make_unique<minions::cli::JobsClient>(connection_);
    minions::cli::JobsClient& client = *client_;
    minions::v1::SubmitJobRequest request;
    request.set_input(input);
    request.set_model(BinDir() + "/minions-noop-runner");  // any file: the no-op runner loads nothing
    request.set_shard_size(1);
    const absl::Time start = absl::Now();
    auto job = client.Submit(request);
    if (!job.ok()) {
      fprintf(stderr, "%s: submit failed: %s\n", Name(mode_), std::string(job.status().message()).c_str());
      return -1;
    }
    for (absl::Time deadline = start + absl::Minutes(10); absl::Now() < deadline;) {
      auto now = client.Get(job->id());
      if (now.ok() && now->state() == "completed") return absl::ToDoubleSeconds(absl::Now() - start);
      if (now.ok() && (now->state() == "failed" || now->state() == "cancelled")) return -1;
      // Finer polling for short jobs (the first-result measure); light for long ones.
      absl::SleepFor(tasks <= 1 ? absl::Milliseconds(2) : absl::Milliseconds(20));
    }
    return -1;
  }

 private:
  bool Run(const std::vector<std::string>& argv) {
    auto p = Spawn(argv, "pki");
    if (!p) return false;
    while (p->ReadLine().ok()) {
    }
    auto exit = p->Wait(absl::Minutes(1));
    return exit.ok() && exit->exited && exit->code == 0;
  }
  std::unique_ptr<Subprocess> Spawn(const std::vector<std::string>& argv, const std::string& log) {
    return minions::bench::SpawnLogged(argv, dir_ + "/logs/" + log + ".log");
  }

  Mode mode_;
  std::string bin_;
  std::string dir_;
  minions::cli::Connection connection_;
  std::unique_ptr<minions::cli::JobsClient> client_;  // one connection, kept warm
  std::unique_ptr<Subprocess> server_;
  std::vector<std::unique_ptr<Subprocess>> executors_;
};

// Nanoseconds per call of `call`, the fastest of five passes of `n` calls.
template <typename Call>
double NanosPerCall(int n, Call&& call) {
  double best = 1e30;
  for (int pass = 0; pass < 5; ++pass) {
    const absl::Time start = absl::Now();
    for (int i = 0; i < n; ++i) call();
    best = std::min(best, absl::ToDoubleNanoseconds(absl::Now() - start) / n);
  }
  return best;
}

void TokenChecks() {
  auto store = minions::SqliteMetadataStore::Open(":memory:", minions::StoreOptions{});
  minions::RealClock clock;
  minions::IdentityAdmin admin(store->get(), &clock);
  minions::Team team;
  team.name = "bench";
  // No rate limit (new teams get one by default): the bench measures the check, not the limiter.
  if (auto created = admin.CreateTeam(team); created.ok()) {
    created->requests_per_second = 0;
    (void)admin.UpdateTeam(*created);
  }
  minions::IssueRequest request;
  request.role = minions::Role::kSubmitter;
  request.team = "bench";
  request.principal = "bench";
  const std::string token = admin.Issue(request, "local")->text;
  minions::Authenticator auth(store->get(), &clock);
  volatile bool ok = true;
  const double hash = NanosPerCall(200000, [&] { ok = !minions::token::Hash(token).empty(); });
  const double check = NanosPerCall(200000, [&] { ok = auth.Authorize(token, minions::Scope::kJobsRead).ok(); });
  printf("one token check (cached credential): %.0f ns; of which the SHA-256 of the token: %.0f ns\n\n", check,
         hash);
}

double Median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"minions-bench-security: lease-and-complete throughput and time to first result, before identities, "
               "with tokens, with TLS and tokens"};
  std::string baseline, work = (fs::temp_directory_path() / absl::StrCat("minions-bench-security-", getpid())).string();
  int tasks = 2000, executors = 2, rounds = 3, trials = 15;
  app.add_option("--baseline-bin", baseline,
                 "apps/ folder of a build without identities (the 'before' pool; without it, that pool is left "
                 "out and the ratios are to 'tokens')");
  app.add_option("--tasks", tasks, "one-record tasks per throughput job")->capture_default_str();
  app.add_option("--executors", executors, "executor processes per pool")->capture_default_str();
  app.add_option("--rounds", rounds, "rounds; each starts every pool afresh")->capture_default_str();
  app.add_option("--trials", trials, "one-record jobs per round for the first result")->capture_default_str();
  app.add_option("--work", work, "scratch folder")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  TokenChecks();
  std::vector<Mode> modes = {Mode::kBefore, Mode::kTokens, Mode::kTls};
  if (baseline.empty()) {
    printf("before: left out (no --baseline-bin; docs/benchmarks.md says how to build it)\n\n");
    modes.erase(modes.begin());
  }
  const Mode base = modes.front();
  std::map<Mode, std::vector<double>> throughput, per_cpu, first_result;
  for (int round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < modes.size(); ++k) {
      const Mode mode = modes[(k + static_cast<size_t>(round)) % modes.size()];
      BenchPool pool(mode, mode == Mode::kBefore ? baseline : BinDir(), absl::StrCat(work, "/", Name(mode)));
      if (!pool.Start(executors)) {
        fprintf(stderr, "%s: the pool did not start; logs in %s/%s/logs\n", Name(mode), work.c_str(), Name(mode));
        return 1;
      }
      (void)pool.TimeJob(std::min(tasks, 100));  // warm-up: executors registered, runners up
      const double cpu_before = pool.Cpu();
      const double seconds = pool.TimeJob(tasks);
      const double cpu = pool.Cpu() - cpu_before;
      if (seconds < 0) {
        fprintf(stderr, "%s: the throughput job failed; logs in %s/%s/logs\n", Name(mode), work.c_str(), Name(mode));
        return 1;
      }
      throughput[mode].push_back(tasks / seconds);
      per_cpu[mode].push_back(tasks / std::max(cpu, 1e-3));
      std::vector<double> times;
      for (int t = 0; t < trials; ++t) times.push_back(pool.TimeJob(1) * 1000);
      first_result[mode].push_back(Median(times));
      printf("round %d %-6s  %7.1f tasks/s  %7.1f tasks/CPU-s  first result %6.1f ms (median of %d)\n", round + 1,
             Name(mode), tasks / seconds, tasks / std::max(cpu, 1e-3), Median(times), trials);
      fflush(stdout);
    }
  }
  printf("\n%d one-record tasks per job, %d executors (no-op runner), SQLite; medians of %d rounds\n", tasks, executors,
         rounds);
  printf("| pool | tasks/s | vs %s | tasks per CPU-second | vs %s | first result (ms) | added |\n"
         "|---|---:|---:|---:|---:|---:|---:|\n",
         Name(base), Name(base));
  const double base_rate = Median(throughput[base]);
  const double base_cpu = Median(per_cpu[base]);
  const double base_first = Median(first_result[base]);
  bool measured = true;
  for (Mode mode : modes) {
    const double rate = Median(throughput[mode]);
    const double efficiency = Median(per_cpu[mode]);
    const double first = Median(first_result[mode]);
    measured &= rate > 0 && efficiency > 0 && first > 0;  // nothing measured: the benchmark has rotted
    printf("| %s | %.1f | %.1f %% | %.1f | %.1f %% | %.1f | %+.1f ms |\n", Name(mode), rate, 100 * rate / base_rate,
           efficiency, 100 * efficiency / base_cpu, first, first - base_first);
  }
  printf("\ntls+tokens / %s: %.1f %% of the throughput, %.1f %% of the tasks per CPU-second (target >= 90 %% of "
         "before)\n",
         Name(base), 100 * Median(throughput[Mode::kTls]) / base_rate, 100 * Median(per_cpu[Mode::kTls]) / base_cpu);
  if (!measured) {
    fprintf(stderr, "minions-bench-security: a pool measured nothing; logs in %s\n", work.c_str());
    return 1;
  }
  fs::remove_all(work);
  return 0;
}
