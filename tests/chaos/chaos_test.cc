// The chaos suite: a job of several thousand records over three executors running the real
// llama.cpp runner, while a driver with a seeded RNG SIGKILLs executors (starting replacements),
// SIGKILLs runners, restarts the server (SIGKILL or SIGTERM) and restarts the metadata store. Then:
// the merged output equals a fault-free run's, every custom_id appears exactly once, every task
// succeeded and no executor holds a lease.
//
// On SQLite + a directory the server restart is the store restart (the database lives in the
// server process); on PostgreSQL + S3 the PostgreSQL cluster is restarted on its own as well.
//
// The fault plan is driven by the job's progress, never by the wall clock: fault k fires once the
// job has done (k+1)/(n+2) of its records. So that every fault lands while the job runs, however
// fast the machine, the test holds one task of the job itself (a LeaseHolder: an executor of its
// own that heartbeats the task and runs nothing) until the last fault has fired, then hands it
// back; the job cannot end before that.
//
// MINIONS_CHAOS_SEED=N replays a run's choices (timing still differs from run to run); the seed is
// printed with the summary of what the driver did. Logs are kept when a test fails, or always with
// MINIONS_CHAOS_KEEP_LOGS=1.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <random>

#include <gtest/gtest.h>

#include "absl/strings/str_format.h"
#include "chaos_util.h"
#include "cli/sample_prompts.h"
#include "pool_test_util.h"
#include "testing/lease_holder.h"

namespace minions::testing {
namespace {

constexpr int kRecords = 3000;
constexpr int kShardSize = 40;
constexpr int kExecutors = 3;
constexpr int kLeaseTtlMs = 3000;
// Each fault costs a task at most one real failure; a task may be unlucky several times in a row.
constexpr int kMaxAttempts = 12;

enum class Fault { kKillExecutor, kKillRunner, kRestartServer, kRestartStore };

const char* FaultName(Fault f) {
  switch (f) {
    case Fault::kKillExecutor: return "kill executor";
    case Fault::kKillRunner: return "kill runner";
    case Fault::kRestartServer: return "restart server";
    case Fault::kRestartStore: return "restart store";
  }
  return "?";
}

// The records, the same for every backend, and their fault-free results (chaos_util.h).
Reference ChaosReference() {
  cli::SamplePromptOptions sample;
  sample.records = kRecords;
  sample.max_tokens = 3;
  return MakeReference(cli::SamplePromptLines(sample), MINIONS_CHAOS_REFERENCE_DIR);
}

// Drives the faults. Owns the RNG and the log of what it did.
class ChaosDriver {
 public:
  ChaosDriver(ProcessPool* pool, bool separate_store, uint64_t seed)
      : pool_(pool), separate_store_(separate_store), random_(seed), start_(absl::Now()) {}

  // The faults of one run, in a random order.
  std::vector<Fault> Plan() {
    std::vector<Fault> plan = {Fault::kKillExecutor, Fault::kKillExecutor, Fault::kKillExecutor,
                               Fault::kKillExecutor, Fault::kKillRunner,   Fault::kRestartServer,
                               Fault::kRestartServer};
    plan.push_back(separate_store_ ? Fault::kRestartStore : Fault::kRestartServer);
    if (separate_store_) plan.push_back(Fault::kRestartStore);
    std::shuffle(plan.begin(), plan.end(), random_);
    return plan;
  }

  void Inject(Fault fault) {
    std::string what;
    switch (fault) {
      case Fault::kKillExecutor: what = KillExecutor(); break;
      case Fault::kKillRunner: what = KillRunner(); break;
      case Fault::kRestartServer: what = RestartServer(); break;
      case Fault::kRestartStore: what = RestartStore(); break;
    }
    ++done_[fault];
    Log(absl::StrCat(FaultName(fault), ": ", what));
  }

  void Log(const std::string& line) {
    log_.push_back(absl::StrFormat("  %6.1f s  %s", absl::ToDoubleSeconds(absl::Now() - start_), line));
  }
  int done(Fault f) const { return done_.count(f) ? done_.at(f) : 0; }
  const std::vector<std::string>& log() const { return log_; }
  std::mt19937_64& random() { return random_; }

 private:
  absl::Duration Uniform(int min_ms, int max_ms) {
    return absl::Milliseconds(std::uniform_int_distribution<int>(min_ms, max_ms)(random_));
  }
  bool Coin() { return std::uniform_int_distribution<int>(0, 1)(random_) == 1; }
  template <typename T>
  const T& Pick(const std::vector<T>& from) {
    return from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(random_)];
  }

  // SIGKILLs an executor, preferring one that holds tasks; after a pause a replacement starts:
  // the same executor again (same state directory, so same id) or a new one.
  std::string KillExecutor() {
    std::vector<std::string> live = pool_->executor_names();
    std::vector<std::string> busy;
    std::map<std::string, int> held;
    auto executors = cli::JobsClient(pool_->connection()).Executors();
    if (executors.ok()) {
      for (const auto& e : *executors) {
        if (!e.current_tasks().empty() && std::count(live.begin(), live.end(), e.name())) {
          busy.push_back(e.name());
          held[e.name()] = e.current_tasks_size();
        }
      }
    }
    std::sort(busy.begin(), busy.end());  // the server's order is not the RNG's business
    std::string victim = Pick(busy.empty() ? live : busy);
    absl::Status s = pool_->StopExecutor(victim, SIGKILL);
    EXPECT_TRUE(s.ok()) << s;
    absl::Duration pause = Uniform(0, 1000);
    absl::SleepFor(pause);
    std::string replacement = Coin() ? victim : absl::StrCat("e", ++last_executor_);
    s = pool_->StartExecutor(replacement, 1);
    EXPECT_TRUE(s.ok()) << s;
    return absl::StrCat(victim, " (", executors.ok() ? absl::StrCat(held[victim], " tasks held") : "server down",
                        "); ", replacement == victim ? "restarted it" : "started " + replacement, " after ",
                        absl::FormatDuration(pause));
  }

  // SIGKILLs the runner of an executor (the executor must start another and retry its tasks).
  std::string KillRunner() {
    std::vector<std::string> with_runner;
    for (const auto& name : pool_->executor_names()) {
      if (!pool_->ExecutorChildren(name).empty()) with_runner.push_back(name);
    }
    if (with_runner.empty()) return "no executor has a runner now";
    std::string name = Pick(with_runner);
    for (pid_t child : pool_->ExecutorChildren(name)) ::kill(child, SIGKILL);
    return absl::StrCat("of ", name);
  }

  std::string RestartServer() {
    int sig = Coin() ? SIGKILL : SIGTERM;
    absl::Status s = pool_->StopServer(sig);
    EXPECT_TRUE(s.ok()) << s;
    absl::Duration down = Uniform(0, 2000);
    absl::SleepFor(down);
    absl::Time at = absl::Now();
    s = pool_->StartServer();
    EXPECT_TRUE(s.ok()) << s;
    return absl::StrCat(sig == SIGKILL ? "SIGKILL" : "SIGTERM", ", down ", absl::FormatDuration(down),
                        ", up again in ", absl::FormatDuration(absl::Trunc(absl::Now() - at, absl::Milliseconds(1))));
  }

  // A fast restart of the PostgreSQL cluster: every connection drops, writes in flight fail.
  std::string RestartStore() {
    Subprocess::Options sp;
    sp.argv = {std::string(MINIONS_TEST_SOURCE_DIR) + "/tests/services/postgres.sh", "restart",
               MINIONS_TEST_POSTGRES_DIR};
    sp.stderr_path = pool_->dir() + "/logs/postgres-restart.log";
    absl::Time at = absl::Now();
    auto p = Subprocess::Start(sp);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return "could not start postgres.sh";
    (*p)->CloseStdin();
    while ((*p)->ReadLine().ok()) {
    }
    auto exit = (*p)->Wait(absl::Minutes(1));
    EXPECT_TRUE(exit.ok() && exit->exited && exit->code == 0) << "see " << sp.stderr_path;
    return absl::StrCat("PostgreSQL fast restart in ",
                        absl::FormatDuration(absl::Trunc(absl::Now() - at, absl::Milliseconds(1))));
  }

  ProcessPool* pool_;
  bool separate_store_;
  std::mt19937_64 random_;
  absl::Time start_;
  int last_executor_ = kExecutors;
  std::map<Fault, int> done_;
  std::vector<std::string> log_;
};

uint64_t Seed() {
  if (const char* env = std::getenv("MINIONS_CHAOS_SEED"); env && *env) return std::strtoull(env, nullptr, 10);
  return static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) % 1000000;
}

class Chaos : public ::testing::TestWithParam<std::string> {};

TEST_P(Chaos, FaultsLoseNoRecordAndRepeatNone) {
  const Reference reference = ChaosReference();
  if (HasFatalFailure()) return;
  ASSERT_EQ(reference.output.size() + reference.errors.size(), reference.lines.size());

  const bool postgres = GetParam() == "postgres-s3";
  std::string dir = TempDir("chaos-" + GetParam());
  ProcessPool pool(kBin + "/minions", dir + "/pool", kLeaseTtlMs);
  pool.AllowModels({MINIONS_TEST_MODELS_DIR});
  UseBackend(pool, GetParam(), "chaos");
  if (HasFatalFailure()) return;
  ASSERT_TRUE(pool.StartServer().ok());

  const uint64_t seed = Seed();
  ChaosDriver driver(&pool, postgres, seed);
  std::vector<Fault> plan = driver.Plan();
  auto job = Submit(pool, WriteInput(dir, reference.lines), kShardSize, R"({"n_parallel": 4})", kMaxAttempts);
  ASSERT_TRUE(job.ok()) << job.status();
  driver.Log(absl::StrCat("submitted job ", job->id(), ": ", kRecords, " records, ", job->n_tasks(), " tasks"));
  // The hold first (the job cannot end before it is released), then the executors.
  LeaseHolder holder(pool.connection());
  ASSERT_TRUE(holder.Hold().ok());
  for (int i = 1; i <= kExecutors; ++i) ASSERT_TRUE(pool.StartExecutor(absl::StrCat("e", i), 1).ok());

  // Fault k fires once the job has done (k+1)/(n+2) of its records, one after another; then the
  // hold ends. (The held task is one of 75: the job can pass every threshold while it is held.)
  cli::JobsClient client(pool.connection());
  absl::Time deadline = absl::Now() + absl::Minutes(8);  // a stuck job fails the test, not the plan
  size_t next = 0;
  bool held = true;
  v1::Job last;
  while (absl::Now() < deadline) {
    auto now = client.Get(job->id());
    if (now.ok()) {
      last = *now;
      if (IsFinished(last)) break;
    }
    double progress = double(last.request_counts().completed() + last.request_counts().failed()) / kRecords;
    if (next < plan.size() && progress >= double(next + 1) / (plan.size() + 2)) {
      driver.Inject(plan[next++]);
      continue;
    }
    if (next == plan.size() && held) {
      absl::Status released = holder.Release();
      EXPECT_TRUE(released.ok()) << released;
      held = false;
      driver.Log(absl::StrCat("the hold ends (the watchdog took the held task ", holder.taken_away(), " times)"));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  driver.Log(absl::StrCat("job ", last.state()));

  // The summary of what the driver did, printed whatever happens next.
  auto tasks = client.Tasks(job->id());
  int retried = 0, failures = 0, preemptions = 0, max_attempt = 0;
  if (tasks.ok()) {
    for (const auto& t : *tasks) {
      retried += t.attempt() > 1;
      failures += t.failures();
      preemptions += t.preemptions();
      max_attempt = std::max(max_attempt, t.attempt());
    }
  }
  std::cout << "chaos " << GetParam() << ", seed " << seed << " (replay: MINIONS_CHAOS_SEED=" << seed << "), "
            << kExecutors << " executors, lease ttl " << kLeaseTtlMs << " ms:\n"
            << absl::StrJoin(driver.log(), "\n") << "\n"
            << "  " << driver.done(Fault::kKillExecutor) << " executors killed, " << driver.done(Fault::kKillRunner)
            << " runners killed, " << driver.done(Fault::kRestartServer) << " server restarts, "
            << driver.done(Fault::kRestartStore) << " store restarts; " << retried << " tasks ran more than once ("
            << failures << " failures, " << preemptions << " preemptions counted, highest attempt " << max_attempt
            << ")\n"
            << "  logs: " << pool.dir() << "/logs" << std::endl;

  ASSERT_EQ(last.state(), "completed") << DescribeState(pool, job->id());
  EXPECT_EQ(next, plan.size()) << "the job ended before every planned fault fired";
  EXPECT_GT(retried, 0) << "no fault cost a task its attempt: the driver missed the running tasks";
  EXPECT_EQ(last.request_counts().total(), kRecords);
  EXPECT_EQ(last.request_counts().failed(), static_cast<int64_t>(reference.errors.size())) << DescribeState(pool, job->id());
  auto output = Lines(FetchResults(pool, job->id(), false));
  auto errors = Lines(FetchResults(pool, job->id(), true));
  ExpectEachRecordOnce(reference.lines, output, errors);
  ExpectSameResults(output, errors, reference.output, reference.errors);

  // Nothing is left leased: every task succeeded, and within a heartbeat or two every executor
  // reports holding nothing.
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  for (const auto& t : *tasks) {
    EXPECT_EQ(t.state(), "succeeded") << "task " << t.index() << " attempt " << t.attempt() << ": " << t.last_error();
  }
  std::vector<std::string> holding;
  for (absl::Time until = absl::Now() + absl::Milliseconds(3 * kLeaseTtlMs); absl::Now() < until;) {
    holding.clear();
    auto executors = client.Executors();
    if (executors.ok()) {
      for (const auto& e : *executors) {
        if (e.state() != "lost" && !e.current_tasks().empty()) {
          holding.push_back(absl::StrCat(e.name(), " [", absl::StrJoin(e.current_tasks(), " "), "]"));
        }
      }
    }
    if (executors.ok() && holding.empty()) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(holding.empty()) << "executors still hold leases: " << absl::StrJoin(holding, ", ");

  if (HasFailure() || std::getenv("MINIONS_CHAOS_KEEP_LOGS")) {
    if (HasFailure()) std::cout << DescribeState(pool, job->id());
    std::cout << "logs kept in " << pool.dir() << "/logs" << std::endl;
  } else {
    std::filesystem::remove_all(dir);
  }
}

MINIONS_INSTANTIATE_ON_BOTH_BACKENDS(Chaos);

}  // namespace
}  // namespace minions::testing
