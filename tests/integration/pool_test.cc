// End to end with real processes on loopback: a server, several executors, each running the real
// llama.cpp runner on a test model, or the no-op runner. The smoke over real processes and
// sockets; the executor's behaviours one by one are stories on fake time
// (tests/executor/agent_scenario_test.cc).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/model_verbs.h"
#include "cli/sample_prompts.h"
#include "pool_test_util.h"

namespace minions::testing {
namespace {

// Lines {"custom_id": "r<i>", "prompt": ...}; `mark` is the prompt of record `marked_at`.
std::vector<std::string> NoopLines(int n, int marked_at = -1, const std::string& mark = "") {
  std::vector<std::string> lines;
  for (int i = 0; i < n; ++i) {
    lines.push_back(absl::StrCat("{\"custom_id\":\"r", i, "\",\"prompt\":\"", i == marked_at ? mark : "x", "\"}"));
  }
  return lines;
}

v1::Job WaitForEnd(cli::JobsClient& client, const std::string& job_id, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<v1::Job> job;
  while (absl::Now() < deadline) {
    job = client.Get(job_id);
    if (job.ok() && (job->state() == "completed" || job->state() == "failed" || job->state() == "cancelled" ||
                     job->state() == "expired")) {
      return *job;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  ADD_FAILURE() << "job " << job_id << " did not end in time";
  return job.ok() ? *job : v1::Job();
}

// PoolTest's pool, and what several of these tests do with it.
class Pool : public PoolTest {
 protected:
  // Starts the server and executor `name` (with its own `args`), whose no-op runner stalls for good
  // on the record StalledLines marks; then submits `lines` in tasks of `shard_size`: the job.
  absl::StatusOr<v1::Job> SubmitToAStallingExecutor(const std::string& name, const std::vector<std::string>& args,
                                                    const std::vector<std::string>& lines, int64_t shard_size) {
    if (absl::Status s = pool_->StartServer(); !s.ok()) return s;
    if (absl::Status s = pool_->StartExecutor(name, 1, noop_, "", args, {"MINIONS_NOOP_STALL_ON=stall-me"}); !s.ok()) {
      return s;
    }
    return Submit(*pool_, WriteInput(dir_, lines), shard_size);
  }
  // `n` no-op records; the runner of SubmitToAStallingExecutor stalls on record `stall_at`.
  static std::vector<std::string> StalledLines(int n, int stall_at) { return NoopLines(n, stall_at, "stall-me"); }

  // Starts the pool's first server (A) and another on the same store (B, "server-b"): B's address.
  absl::StatusOr<std::string> StartTwoServers() {
    if (absl::Status s = pool_->StartServer(); !s.ok()) return s;
    return pool_->StartAnotherServer("server-b");
  }
  // The pool's connection, to `server` instead of the first.
  cli::Connection ConnectionTo(const std::string& server) const {
    cli::Connection connection = pool_->connection();
    connection.server = server;
    return connection;
  }

  const std::string noop_ = kBin + "/minions-noop-runner";
};

// The name of an executor that holds a task, once one does (within half a minute); "" if none.
std::string BusyExecutor(cli::JobsClient& client) {
  for (int i = 0; i < 600; ++i) {
    auto executors = client.Executors();
    if (executors.ok()) {
      for (const auto& e : *executors) {
        if (!e.current_tasks().empty()) return e.name();
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return "";
}

// How many of job `job_id`'s tasks ran more than once.
int TasksRunAgain(cli::JobsClient& client, const std::string& job_id) {
  auto tasks = client.Tasks(job_id);
  EXPECT_TRUE(tasks.ok()) << tasks.status();
  int again = 0;
  if (tasks.ok()) {
    for (const auto& t : *tasks) again += t.attempt() > 1;
  }
  return again;
}

// Polls job `job_id`'s tasks every 100 ms, `tries` times at most, until `ready` holds: whether it did.
bool WaitForTasks(cli::JobsClient& client, const std::string& job_id, int tries,
                  const std::function<bool(const std::vector<v1::Task>&)>& ready) {
  for (int i = 0; i < tries; ++i) {
    auto tasks = client.Tasks(job_id);
    if (tasks.ok() && ready(*tasks)) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

TEST_P(Pool, ThousandRecordsOverThreeExecutorsEqualOneRunnerInOneProcess) {
  ProcessPool& pool = NewPool("thousand", 6000, "t" + std::to_string(__LINE__));
  if (HasFatalFailure()) return;
  ASSERT_TRUE(pool.StartServer().ok());
  for (const char* name : {"e1", "e2", "e3"}) ASSERT_TRUE(pool.StartExecutor(name).ok());
  auto lines = cli::SamplePromptLines({.records = 1000, .max_tokens = 4});
  std::string input = WriteInput(dir_, lines);

  v1::Job job = SubmitAndWait(pool, input, 40, R"({"n_parallel": 4})", absl::Minutes(8));
  ASSERT_EQ(job.state(), "completed") << job.error();
  EXPECT_EQ(job.request_counts().total(), 1000);
  EXPECT_EQ(job.request_counts().failed(), 2);  // the sample's two bad lines
  EXPECT_EQ(job.n_tasks(), 25);
  auto output = Lines(FetchResults(pool, job.id(), false));
  auto errors = Lines(FetchResults(pool, job.id(), true));
  ExpectEachRecordOnce(lines, output, errors);

  // The same records through one runner in one process, batched differently.
  RunLocally(input, dir_);
  if (HasFatalFailure()) return;
  int embeddings_compared = ExpectSameResults(output, errors, Lines(ReadFile(dir_ + "/local.jsonl")),
                                              Lines(ReadFile(dir_ + "/local-errors.jsonl")));
  EXPECT_GT(embeddings_compared, 10);
}

TEST_P(Pool, ASigkilledExecutorLosesNoRecord) {
  ProcessPool& pool = NewPool("sigkill", 2000, "t" + std::to_string(__LINE__));
  if (HasFatalFailure()) return;
  ASSERT_TRUE(pool.StartServer().ok());
  for (const char* name : {"e1", "e2", "e3"}) ASSERT_TRUE(pool.StartExecutor(name).ok());
  auto lines = cli::SamplePromptLines({.records = 240, .max_tokens = 12, .include_bad_lines = false});
  std::string input = WriteInput(dir_, lines);

  cli::JobsClient client(pool.connection());
  auto job = Submit(pool, input, 20);
  ASSERT_TRUE(job.ok()) << job.status();

  // Kill an executor while it holds a task.
  std::string victim = BusyExecutor(client);
  ASSERT_FALSE(victim.empty()) << "no executor ever held a task";
  pool.executor(victim).Signal(SIGKILL);

  v1::Job done = WaitForEnd(client, job->id(), absl::Minutes(5));
  ASSERT_EQ(done.state(), "completed");
  EXPECT_EQ(done.request_counts().completed(), 240);
  ExpectEachRecordOnce(lines, pool, job->id());
  // The victim's task ran again under a new attempt; nothing is left leased.
  auto tasks = client.Tasks(job->id());
  ASSERT_TRUE(tasks.ok());
  for (const auto& t : *tasks) EXPECT_EQ(t.state(), "succeeded");
  EXPECT_GE(TasksRunAgain(client, job->id()), 1);
}

TEST_P(Pool, TwoServersOnOneStoreServeEveryRecordOnce) {
  // Two servers share the store; half the executors talk to each. A job submitted to one is
  // leased through both, and every record is served exactly once.
  ProcessPool& pool = NewPool("two-servers", 3000, "two");
  if (HasFatalFailure()) return;
  auto second = StartTwoServers();
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(pool.StartExecutor("e1", 1, noop_).ok());
  ASSERT_TRUE(pool.StartExecutor("e2", 1, noop_).ok());
  ASSERT_TRUE(pool.StartExecutor("e3", 1, noop_, *second).ok());
  ASSERT_TRUE(pool.StartExecutor("e4", 1, noop_, *second).ok());
  std::vector<std::string> lines = NoopLines(3000);
  std::string input = WriteInput(dir_, lines);
  v1::Job job = SubmitAndWait(pool, input, 10, "", absl::Minutes(5));
  ASSERT_EQ(job.state(), "completed") << job.error();
  EXPECT_EQ(job.request_counts().completed(), 3000);
  ExpectEachRecordOnce(lines, pool, job.id());
  // Both servers handed out leases.
  auto executors = cli::JobsClient(ConnectionTo(*second)).Executors();
  ASSERT_TRUE(executors.ok());
  int64_t by_a = 0, by_b = 0;
  for (const auto& e : *executors) (e.name() == "e1" || e.name() == "e2" ? by_a : by_b) += e.records_done();
  EXPECT_GT(by_a, 0);
  EXPECT_GT(by_b, 0);
  EXPECT_EQ(by_a + by_b, 3000);
}

// An executor given both servers' addresses (--server A,B) goes on with B when A is gone for
// good: A is killed after the executor has worked through it, a job is then submitted through B,
// and the executor (which talked to A) runs it.
TEST_P(Pool, AnExecutorGivenSeveralServersFailsOverWhenOneIsGone) {
  ProcessPool& pool = NewPool("failover", 3000, "fo");
  if (HasFatalFailure()) return;
  auto second = StartTwoServers();
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(pool.StartExecutor("e1", 1, noop_, pool.connection().server + "," + *second).ok());
  std::vector<std::string> lines = NoopLines(50);
  v1::Job first = SubmitAndWait(pool, WriteInput(dir_, lines), 10, "", absl::Minutes(3));
  ASSERT_EQ(first.state(), "completed") << first.error();
  ASSERT_TRUE(pool.StopServer(SIGKILL).ok());

  cli::JobsClient client(ConnectionTo(*second));
  auto job = Submit(client, WriteInput(dir_, lines), 10);
  ASSERT_TRUE(job.ok()) << job.status();
  v1::Job ended = WaitForEnd(client, job->id(), absl::Minutes(3));
  ASSERT_EQ(ended.state(), "completed") << ended.error() << "; logs in " << pool.dir() << "/logs";
  EXPECT_EQ(ended.request_counts().completed(), 50);
  auto executors = client.Executors();
  ASSERT_TRUE(executors.ok());
  ASSERT_EQ(executors->size(), 1u) << "the executor kept its identity on B";
  EXPECT_EQ((*executors)[0].records_done(), 100);
  // It says where it went, and why.
  EXPECT_THAT(ReadFile(pool.dir() + "/logs/executor-e1.log"), ::testing::HasSubstr("going on with " + *second));
}

// The watchdog always runs somewhere. Server A (which took the watchdog lock first) is killed
// for good; on PostgreSQL the database then restarts, ending every session and the lock with
// them. Only then is a job submitted through B, and an executor holding one of its tasks killed:
// its lease is reaped only if B took the watchdog over (and took it again after the restart), and
// the job must complete with every record exactly once.
TEST_P(Pool, TheWatchdogMovesToAServerStillUpWhenItsHolderIsKilled) {
  ProcessPool& pool = NewPool("watchdog-moves", 2000, "wd");
  if (HasFatalFailure()) return;
  auto second = StartTwoServers();  // A takes the watchdog lock; B stands by
  ASSERT_TRUE(second.ok()) << second.status();
  const std::vector<std::string> slow = {"MINIONS_NOOP_RECORD_DELAY_MS=20"};
  ASSERT_TRUE(pool.StartExecutor("e1", 1, noop_, *second, {}, slow).ok());
  ASSERT_TRUE(pool.StartExecutor("e2", 1, noop_, *second, {}, slow).ok());
  ASSERT_TRUE(pool.StopServer(SIGKILL).ok());  // A, for good
  if (GetParam() == "postgres-s3") {
    Subprocess::Options sp;
    sp.argv = {std::string(MINIONS_TEST_SOURCE_DIR) + "/tests/services/postgres.sh", "restart",
               MINIONS_TEST_POSTGRES_DIR};
    sp.stderr_path = dir_ + "/pool/logs/postgres-restart.log";
    ASSERT_TRUE(RunsToSuccess(sp, absl::Minutes(1))) << "see " << sp.stderr_path;
  }
  cli::JobsClient client(ConnectionTo(*second));
  std::vector<std::string> lines = NoopLines(200);
  std::string input = WriteInput(dir_, lines);
  absl::StatusOr<v1::Job> job;
  for (int i = 0; i < 100 && !job.ok(); ++i) {  // B may still be reconnecting to the restarted database
    job = Submit(client, input, 10);
    if (!job.ok()) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(job.ok()) << job.status();

  std::string victim = BusyExecutor(client);
  ASSERT_FALSE(victim.empty()) << "no executor ever held a task";
  ASSERT_TRUE(pool.StopExecutor(victim, SIGKILL).ok());
  ASSERT_TRUE(pool.StartExecutor("e3", 1, noop_, *second, {}, slow).ok());

  v1::Job done = WaitForEnd(client, job->id(), absl::Minutes(4));
  ASSERT_EQ(done.state(), "completed") << done.error();
  EXPECT_EQ(done.request_counts().completed(), 200);
  ExpectEachRecordOnce(lines, client, job->id());
  EXPECT_GE(TasksRunAgain(client, job->id()), 1) << "the victim's task never ran again";
}

// Death noticed at once: with a lease TTL of ten minutes, a SIGKILLed executor's task can run
// elsewhere within the test's few minutes only because its closed connection was noticed (the
// server backs up the tasks of an executor whose presence stream closes), never by expiry.
TEST_P(Pool, ASigkilledExecutorsTaskRunsElsewhereLongBeforeItsLeaseCouldExpire) {
  ProcessPool& pool = NewPool("presence", 600000, "presence");
  if (HasFatalFailure()) return;
  ASSERT_TRUE(pool.StartServer().ok());
  const std::vector<std::string> slow = {"MINIONS_NOOP_RECORD_DELAY_MS=20"};
  ASSERT_TRUE(pool.StartExecutor("e1", 1, noop_, "", {}, slow).ok());
  ASSERT_TRUE(pool.StartExecutor("e2", 1, noop_, "", {}, slow).ok());
  cli::JobsClient client(pool.connection());
  std::vector<std::string> lines = NoopLines(200);
  auto job = Submit(pool, WriteInput(dir_, lines), 20);
  ASSERT_TRUE(job.ok()) << job.status();
  std::string victim = BusyExecutor(client);
  ASSERT_FALSE(victim.empty()) << "no executor ever held a task";
  ASSERT_TRUE(pool.StopExecutor(victim, SIGKILL).ok());
  v1::Job done = WaitForEnd(client, job->id(), absl::Minutes(4));
  // By which mechanism: the closed connection, not the watchdog's straggler backups (which would
  // also rescue the task, after 30 s at least).
  EXPECT_THAT(ReadFile(dir_ + "/pool/logs/server.log"), ::testing::HasSubstr("closed its connection without handing the task back"));
  ASSERT_EQ(done.state(), "completed") << done.error();
  ExpectEachRecordOnce(lines, pool, job->id());
  EXPECT_GE(TasksRunAgain(client, job->id()), 1);
}

// A mere reconnect costs no lease: the server is killed and started again while an executor runs
// the job's only task; the executor re-attaches and finishes that very attempt.
TEST_P(Pool, AServerRestartCostsNoLease) {
  ProcessPool& pool = NewPool("restart-lease", 600000, "restartlease");
  if (HasFatalFailure()) return;
  ASSERT_TRUE(pool.StartServer().ok());
  ASSERT_TRUE(pool.StartExecutor("e1", 1, noop_, "", {}, {"MINIONS_NOOP_RECORD_DELAY_MS=40"}).ok());
  cli::JobsClient client(pool.connection());
  std::vector<std::string> lines = NoopLines(100);
  auto job = Submit(pool, WriteInput(dir_, lines), 100);  // one task
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_FALSE(BusyExecutor(client).empty()) << "the executor never held the task";
  ASSERT_TRUE(pool.StopServer(SIGKILL).ok());
  ASSERT_TRUE(pool.StartServer().ok());
  cli::JobsClient again(pool.connection());
  v1::Job done = WaitForEnd(again, job->id(), absl::Minutes(4));
  ASSERT_EQ(done.state(), "completed") << done.error();
  auto tasks = again.Tasks(job->id());
  ASSERT_TRUE(tasks.ok());
  ASSERT_EQ(tasks->size(), 1);
  EXPECT_EQ((*tasks)[0].attempt(), 1) << "the restart cost the executor its lease";
  ExpectEachRecordOnce(lines, pool, job->id());
}

// Spot checks on real processes (docs/verification.md): each executor's answers are re-scored by
// the other's llama.cpp runner while it is idle, and the job publishes once they are judged.
TEST_F(Pool, WithSpotChecksOnHonestAnswersAreVerifiedByTheOtherExecutorBeforeTheJobPublishes) {
  ProcessPool& pool = NewPool("spot-checks", 6000);
  pool.AddServerArgs({"--spot-checks"});
  ASSERT_TRUE(pool.StartServer().ok());
  for (const char* name : {"e1", "e2"}) ASSERT_TRUE(pool.StartExecutor(name).ok());
  auto lines = cli::SamplePromptLines({.records = 40, .max_tokens = 4});
  std::string input = WriteInput(dir_, lines);

  v1::Job job = SubmitAndWait(pool, input, 10, "", absl::Minutes(8));
  ASSERT_EQ(job.state(), "completed") << job.error();
  ExpectEachRecordOnce(lines, pool, job.id());
  // An executor's first records are all drawn; honest answers pass.
  EXPECT_GT(job.verification().checked(), 0);
  EXPECT_EQ(job.verification().failed(), 0);
  EXPECT_EQ(job.verification().passed(), job.verification().checked());
}

// A cheating executor among honest ones (issue 38, point 6): its runner
// (tests/runners/dishonest_runner.py) answers every record at once, inventing the answer and
// claiming 999,999 prompt tokens, so it takes most of the job. The honest executors' llama.cpp
// runners re-score its answers, it is quarantined, its records are redone, and the job publishes
// only honest answers, every record once.
TEST_F(Pool, AForgingExecutorAmongHonestOnesIsQuarantinedAndNoneOfItsAnswersPublish) {
  ProcessPool& pool = NewPool("forger", 6000);
  pool.AddServerArgs({"--spot-checks"});
  ASSERT_TRUE(pool.StartServer().ok());
  for (const char* name : {"e1", "e2"}) ASSERT_TRUE(pool.StartExecutor(name).ok());
  ASSERT_TRUE(pool.StartExecutor("forger", 1, std::string(MINIONS_TEST_SOURCE_DIR) + "/tests/runners/dishonest_runner.py").ok());
  auto lines = cli::SamplePromptLines({.records = 40, .max_tokens = 4});
  std::string input = WriteInput(dir_, lines);

  v1::Job job = SubmitAndWait(pool, input, 5, "", absl::Minutes(8));
  ASSERT_EQ(job.state(), "completed") << job.error() << "; logs in " << pool.dir() << "/logs";
  std::vector<Json> output = Lines(FetchResults(pool, job.id(), false));
  ExpectEachRecordOnce(lines, output, Lines(FetchResults(pool, job.id(), true)));
  for (const Json& line : output) EXPECT_EQ(DumpJson(line).find("Forty-two"), std::string::npos) << DumpJson(line);
  EXPECT_GT(job.verification().failed(), 0);
  auto executors = cli::JobsClient(pool.connection()).Executors();
  ASSERT_TRUE(executors.ok()) << executors.status();
  bool seen = false;
  for (const auto& e : *executors) {
    if (e.name() != "forger") {
      EXPECT_NE(e.state(), "quarantined") << e.name() << ": " << e.state_reason();
      continue;
    }
    seen = true;
    EXPECT_EQ(e.state(), "quarantined") << e.state_reason();
    EXPECT_GT(e.records_done(), 0);  // it did take work, which was caught
  }
  EXPECT_TRUE(seen);
}

// The no-op runner reads one command and answers it before it reads the next, as
// examples/echo_runner.py does. Tasks of 5,000 records send it commands and get answers far
// larger than a pipe's buffer, and the executor queues the next task's before the last is
// answered: it must never wait on the pipe to the runner while the runner waits on the pipe back.
TEST_F(Pool, AOneLineAtATimeRunnerServesTasksFarLargerThanAPipe) {
  ProcessPool& pool = NewPool("pipes", 3000);
  ASSERT_TRUE(pool.StartServer().ok());
  for (const char* name : {"e1", "e2"}) ASSERT_TRUE(pool.StartExecutor(name, 1, noop_).ok());
  auto lines = NoopLines(40000);
  cli::JobsClient client(pool.connection());
  auto submitted = Submit(pool, WriteInput(dir_, lines), 5000);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  v1::Job job = WaitForEnd(client, submitted->id(), absl::Minutes(5));
  ASSERT_EQ(job.state(), "completed") << job.error() << "; logs in " << dir_ << "/pool/logs";
  ExpectEachRecordOnce(lines, pool, job.id());
  auto tasks = client.Tasks(job.id());  // held: a range over *Tasks(...) would outlive its StatusOr
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  for (const auto& t : *tasks) EXPECT_EQ(t.attempt(), 1) << "task " << t.index();
}

// A runner that stops answering is killed as hung, its task goes back to the server, and a
// SIGTERM ends its executor even then.
TEST_F(Pool, AHungRunnerIsKilledItsTaskRunsElsewhereAndSigtermStillStopsItsExecutor) {
  ProcessPool& pool = NewPool("hung", 3000);
  auto lines = StalledLines(40, 25);
  auto submitted = SubmitToAStallingExecutor("stuck", {"--runner-hang-ms", "1500"}, lines, 20);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  cli::JobsClient client(pool.connection());
  // Task 1 holds the record its runner stalls on: the attempt is given back as hung.
  std::string last_error;
  WaitForTasks(client, submitted->id(), 600, [&](const std::vector<v1::Task>& tasks) {
    if (tasks.size() == 2) last_error = tasks[1].last_error();
    return last_error.find("hung") != std::string::npos;
  });
  ASSERT_THAT(last_error, ::testing::HasSubstr("killed as hung")) << "logs in " << dir_ << "/pool/logs";
  // SIGTERM: it drains, and whatever its runner does, it exits.
  pool.executor("stuck").Signal(SIGTERM);
  auto exit = pool.executor("stuck").Wait(absl::Minutes(1));
  ASSERT_TRUE(exit.ok()) << "the executor did not exit on SIGTERM";
  EXPECT_TRUE(exit->exited && exit->code == 0) << exit->ToString();
  // A healthy executor finishes the job; nothing is lost or repeated.
  ASSERT_TRUE(pool.StartExecutor("healthy", 1, noop_).ok());
  v1::Job job = WaitForEnd(client, submitted->id(), absl::Minutes(2));
  ASSERT_EQ(job.state(), "completed") << job.error();
  ExpectEachRecordOnce(lines, pool, job.id());
}

// A runner dies with its executor, however the executor dies: one stalled on a record (alive,
// reading nothing more, so it never sees its stdin close) is gone once its executor is SIGKILLed,
// though nothing else kills it (Subprocess: the lifeline, and a parent-death signal on Linux).
TEST_F(Pool, ARunnerStalledOnARecordDiesWithItsSigkilledExecutor) {
  ProcessPool& pool = NewPool("orphan", 3000);
  // One task, sent to the runner as one batch.
  auto submitted = SubmitToAStallingExecutor("e1", {"--checkpoint-records", "2"}, StalledLines(10, 2), 10);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  cli::JobsClient client(pool.connection());
  // Progress, not time: r0 and r1 committed means the runner answered them in the batch that goes
  // on with the record it stalls on; it reads its stdin no more.
  const bool stalled = WaitForTasks(client, submitted->id(), 600, [](const std::vector<v1::Task>& tasks) {
    return tasks.size() == 1 && tasks[0].records_committed() >= 2;
  });
  ASSERT_TRUE(stalled) << "the task never committed its first two records; logs in " << dir_ << "/pool/logs";
  const auto [children, lifeline] = pool.ExecutorChildrenAndLifeline("e1");
  ASSERT_EQ(children.size(), 1u) << "the executor should have one child, its runner";
  const pid_t runner = children[0];
  const std::string started = LiveProcessStart(runner);
  ASSERT_FALSE(started.empty());
  ASSERT_GT(lifeline, 0) << "the executor has no lifeline";
  const std::string lifeline_started = LiveProcessStart(lifeline);
  ASSERT_FALSE(lifeline_started.empty()) << "the lifeline " << lifeline << " is not running";

  ASSERT_TRUE(pool.StopExecutor("e1", SIGKILL).ok());
  const bool died = WaitUntilDead(runner, started, absl::Minutes(1));
  if (!died) ::kill(runner, SIGKILL);  // not left behind by a failing test
  EXPECT_TRUE(died) << "the runner " << runner << " outlived its SIGKILLed executor";
  // The lifeline itself does not linger either.
  const bool lifeline_gone = WaitUntilDead(lifeline, lifeline_started, absl::Minutes(1));
  if (!lifeline_gone) ::kill(lifeline, SIGKILL);
  EXPECT_TRUE(lifeline_gone) << "the lifeline " << lifeline << " outlived its executor";
}

// Cancel keeps finished work: a job cancelled part way gives, through `minions results`, the
// answers its tasks finished (a succeeded task's and a stalled task's committed checkpoints) and
// an error line "batch_cancelled" for every record that never ran; status, jobs and watch count
// them alike: what ran. Progress, not time, decides when to cancel: the runner stalls for good on record 160.
TEST_F(Pool, ACancelledJobKeepsWhatItFinishedAndSaysSoOnEveryScreen) {
  ProcessPool& pool = NewPool("cancel-keeps", 3000);
  auto lines = StalledLines(300, 160);
  auto submitted = SubmitToAStallingExecutor("e1", {"--checkpoint-records", "10"}, lines, 100);  // three tasks of 100
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  cli::JobsClient client(pool.connection());
  const bool ready = WaitForTasks(client, submitted->id(), 1200, [](const std::vector<v1::Task>& tasks) {
    return tasks.size() == 3 && tasks[0].state() == "succeeded" && tasks[1].records_committed() >= 50;
  });
  ASSERT_TRUE(ready) << "task 0 never finished or task 1 never committed 50 records; logs in " << dir_ << "/pool/logs";
  auto cancelled = client.Cancel(submitted->id());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), "cancelled");
  auto tasks = client.Tasks(submitted->id());
  ASSERT_TRUE(tasks.ok());
  const int64_t finished = 100 + tasks->at(1).records_committed();

  auto output = Lines(FetchResults(pool, submitted->id(), false));
  auto errors = Lines(FetchResults(pool, submitted->id(), true));
  ExpectEachRecordOnce(lines, output, errors);
  EXPECT_EQ(static_cast<int64_t>(output.size()), finished);
  for (const Json& e : errors) EXPECT_EQ(e["error"]["code"], "batch_cancelled") << e;
  // Every screen counts the same: status (GetJob), jobs (ListJobs) and watch (its last report).
  auto job = client.Get(submitted->id());
  ASSERT_TRUE(job.ok());
  auto listed = client.List("cancelled", 10);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  auto watched = client.Watch(submitted->id(), absl::Milliseconds(100), [](const v1::JobProgress&) {});
  ASSERT_TRUE(watched.ok()) << watched.status();
  // Every screen counts what ran (the records that never ran are total - completed - failed).
  for (const v1::Job& seen : {*job, listed->at(0), *watched}) {
    EXPECT_EQ(seen.request_counts().completed(), finished);
    EXPECT_EQ(seen.request_counts().failed(), 0);
    EXPECT_EQ(seen.request_counts().total(), 300);
  }
  EXPECT_EQ(static_cast<int64_t>(errors.size()), 300 - finished);
  // Asked again, the same bytes.
  EXPECT_EQ(Lines(FetchResults(pool, submitted->id(), false)), output);
}

TEST_P(Pool, AModelPushedOnceIsFetchedByTheExecutorsAndServesAsTheFileDoes) {
  // The executors are given no model folder holding the test model: they run it only from
  // their caches, fetched by digest from the object store.
  ProcessPool& pool = NewPool("registry", 3000, "reg", /*allow_models=*/false);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(pool.StartServer().ok());
  absl::StatusOr<v1::Model> pushed = cli::ModelsClient(pool.connection()).Push(kModel, "text", "");
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  // A second push of the same bytes sends nothing and names the same digest.
  absl::StatusOr<v1::Model> again = cli::ModelsClient(pool.connection()).Push(kModel, "text-again", "");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->digest(), pushed->digest());
  for (const char* name : {"e1", "e2", "e3"}) ASSERT_TRUE(pool.StartExecutor(name).ok());

  auto lines = cli::SamplePromptLines({.records = 120, .max_tokens = 4});
  std::string input = WriteInput(dir_, lines);
  v1::SubmitJobRequest request;
  request.set_input(ReadFile(input));
  request.set_model("text");
  request.set_shard_size(4);
  request.set_runner_options_json(R"({"n_parallel": 4})");
  cli::JobsClient client(pool.connection());
  absl::StatusOr<v1::Job> submitted = client.Submit(request);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_EQ(submitted->model_digest(), pushed->digest());
  v1::Job job = WaitForEnd(client, submitted->id(), absl::Minutes(8));
  ASSERT_EQ(job.state(), "completed") << job.error() << "; logs in " << pool.dir() << "/logs";
  auto output = Lines(FetchResults(pool, job.id(), false));
  auto errors = Lines(FetchResults(pool, job.id(), true));
  ExpectEachRecordOnce(lines, output, errors);

  // Every executor that ran a task holds the model in its cache, and says so.
  auto executors = client.Executors();
  ASSERT_TRUE(executors.ok()) << executors.status();
  int holders = 0;
  for (const auto& e : *executors) {
    if (e.records_done() == 0) continue;
    EXPECT_THAT(e.models_cached(), ::testing::Contains(pushed->digest())) << e.name();
    holders += 1;
  }
  EXPECT_GE(holders, 1);
  // `minions executors` shows each machine's device, usable memory and its cached models by
  // name and short digest (the first of the two names the bytes have).
  {
    Subprocess::Options sp;
    sp.argv = {kBin + "/minions", "executors", "--server", pool.connection().server};
    sp.extra_env = {"MINIONS_TOKEN=" + pool.connection().token};
    sp.stderr_path = dir_ + "/executors.log";
    std::string shown;
    ASSERT_TRUE(RunsToSuccess(sp, absl::Minutes(1), &shown)) << "see " << sp.stderr_path;
    EXPECT_THAT(shown, ::testing::HasSubstr("DEVICE")) << shown;
    EXPECT_THAT(shown, ::testing::HasSubstr("USABLE")) << shown;
    EXPECT_THAT(shown, ::testing::HasSubstr("text@sha256:" + pushed->digest().substr(7, 12))) << shown;
  }

  // The same records through one runner in one process, from the original file.
  RunLocally(input, dir_);
  if (HasFatalFailure()) return;
  ExpectSameResults(output, errors, Lines(ReadFile(dir_ + "/local.jsonl")), Lines(ReadFile(dir_ + "/local-errors.jsonl")));
}

MINIONS_INSTANTIATE_ON_BOTH_BACKENDS(Pool);

}  // namespace
}  // namespace minions::testing
