// End to end with real processes on loopback: a server, several executors, each running the real
// llama.cpp runner on a test model.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/sample_prompts.h"
#include "pool_test_util.h"
#include "testing/lease_holder.h"

namespace minions::testing {
namespace {

class Pool : public ::testing::TestWithParam<std::string> {};

TEST_P(Pool, ThousandRecordsOverThreeExecutorsEqualOneRunnerInOneProcess) {
  std::string dir = TempDir("thousand-" + GetParam());
  ProcessPool pool(kBin + "/minions", dir + "/pool", 6000);
  pool.AllowModels({MINIONS_TEST_MODELS_DIR});
  UseBackend(pool, GetParam(), "t" + std::to_string(__LINE__));
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_TRUE(pool.StartServer().ok());
  for (const char* name : {"e1", "e2", "e3"}) ASSERT_TRUE(pool.StartExecutor(name).ok());
  cli::SamplePromptOptions sample;
  sample.records = 1000;
  sample.max_tokens = 4;
  auto lines = cli::SamplePromptLines(sample);
  std::string input = WriteInput(dir, lines);

  v1::Job job = SubmitAndWait(pool, input, 40, R"({"n_parallel": 4})", absl::Minutes(8));
  ASSERT_EQ(job.state(), "completed") << job.error();
  EXPECT_EQ(job.request_counts().total(), 1000);
  EXPECT_EQ(job.request_counts().failed(), 2);  // the sample's two bad lines
  EXPECT_EQ(job.n_tasks(), 25);
  auto output = Lines(FetchResults(pool, job.id(), false));
  auto errors = Lines(FetchResults(pool, job.id(), true));
  ExpectEachRecordOnce(lines, output, errors);

  // The same records through one runner in one process, batched differently.
  RunLocally(input, dir);
  if (HasFatalFailure()) return;
  int embeddings_compared = ExpectSameResults(output, errors, Lines(ReadFile(dir + "/local.jsonl")),
                                              Lines(ReadFile(dir + "/local-errors.jsonl")));
  EXPECT_GT(embeddings_compared, 10);
  std::filesystem::remove_all(dir);
}

TEST_P(Pool, ASigkilledExecutorLosesNoRecord) {
  std::string dir = TempDir("sigkill-" + GetParam());
  ProcessPool pool(kBin + "/minions", dir + "/pool", 2000);
  pool.AllowModels({MINIONS_TEST_MODELS_DIR});
  UseBackend(pool, GetParam(), "t" + std::to_string(__LINE__));
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_TRUE(pool.StartServer().ok());
  for (const char* name : {"e1", "e2", "e3"}) ASSERT_TRUE(pool.StartExecutor(name).ok());
  cli::SamplePromptOptions sample;
  sample.records = 240;
  sample.max_tokens = 12;
  sample.include_bad_lines = false;
  auto lines = cli::SamplePromptLines(sample);
  std::string input = WriteInput(dir, lines);

  cli::JobsClient client(pool.connection());
  auto job = Submit(pool, input, 20);
  ASSERT_TRUE(job.ok()) << job.status();

  // Kill an executor while it holds a task.
  std::string victim;
  for (int i = 0; i < 300 && victim.empty(); ++i) {
    auto executors = client.Executors();
    if (executors.ok()) {
      for (const auto& e : *executors) {
        if (!e.current_tasks().empty()) victim = e.name();
      }
    }
    if (victim.empty()) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_FALSE(victim.empty()) << "no executor ever held a task";
  pool.executor(victim).Signal(SIGKILL);

  absl::Time deadline = absl::Now() + absl::Minutes(5);
  v1::Job done;
  while (absl::Now() < deadline) {
    auto j = client.Get(job->id());
    if (j.ok() && j->state() == "completed") {
      done = *j;
      break;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_EQ(done.state(), "completed");
  EXPECT_EQ(done.request_counts().completed(), 240);
  ExpectEachRecordOnce(lines, Lines(FetchResults(pool, job->id(), false)), Lines(FetchResults(pool, job->id(), true)));
  // The victim's task ran again under a new attempt; nothing is left leased.
  auto tasks = client.Tasks(job->id());
  ASSERT_TRUE(tasks.ok());
  int retried = 0;
  for (const auto& t : *tasks) {
    EXPECT_EQ(t.state(), "succeeded");
    retried += t.attempt() > 1;
  }
  EXPECT_GE(retried, 1);
  std::filesystem::remove_all(dir);
}

TEST_P(Pool, CancelStopsTheExecutorsWork) {
  std::string dir = TempDir("cancel-" + GetParam());
  const int ttl_ms = 3000;
  ProcessPool pool(kBin + "/minions", dir + "/pool", ttl_ms);
  pool.AllowModels({MINIONS_TEST_MODELS_DIR});
  UseBackend(pool, GetParam(), "t" + std::to_string(__LINE__));
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_TRUE(pool.StartServer().ok());
  for (const char* name : {"e1", "e2"}) ASSERT_TRUE(pool.StartExecutor(name).ok());
  cli::SamplePromptOptions sample;
  sample.records = 400;
  sample.max_tokens = 200;
  sample.include_bad_lines = false;
  sample.include_embeddings = false;
  std::string input = WriteInput(dir, cli::SamplePromptLines(sample));
  cli::JobsClient client(pool.connection());
  auto job = Submit(pool, input, 50);
  ASSERT_TRUE(job.ok()) << job.status();

  auto busy_executors = [&] {
    int busy = 0;
    auto executors = client.Executors();
    if (executors.ok()) {
      for (const auto& e : *executors) busy += !e.current_tasks().empty() || e.state() == "busy";
    }
    return busy;
  };
  for (int i = 0; i < 300 && busy_executors() < 2; ++i) absl::SleepFor(absl::Milliseconds(100));
  ASSERT_EQ(busy_executors(), 2);

  auto cancelled = client.Cancel(job->id());
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), "cancelled");
  // The executors hear of it in a heartbeat and stop; the heartbeat after reports them idle. (How
  // soon is a latency, measured by the benchmarks; here: that they stop at all.)
  for (absl::Time until = absl::Now() + absl::Minutes(1); absl::Now() < until && busy_executors() > 0;) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(busy_executors(), 0);
  auto results = cli::JobsClient(pool.connection()).Results(job->id(), false, [](const std::string&) {});
  EXPECT_TRUE(absl::IsFailedPrecondition(results));
  std::filesystem::remove_all(dir);
}

TEST_P(Pool, TwoServersOnOneStoreServeEveryRecordOnce) {
  // Two servers share the store; half the executors talk to each. A job submitted to one is
  // leased through both, and every record is served exactly once.
  std::string dir = TempDir("two-servers-" + GetParam());
  ProcessPool pool(kBin + "/minions", dir + "/pool", 3000);
  pool.AllowModels({MINIONS_TEST_MODELS_DIR});
  UseBackend(pool, GetParam(), "two");
  if (HasFatalFailure()) return;
  ASSERT_TRUE(pool.StartServer().ok());
  auto second = pool.StartAnotherServer("server-b");
  ASSERT_TRUE(second.ok()) << second.status();
  const std::string noop = kBin + "/minions-noop-runner";
  ASSERT_TRUE(pool.StartExecutor("e1", 1, noop).ok());
  ASSERT_TRUE(pool.StartExecutor("e2", 1, noop).ok());
  ASSERT_TRUE(pool.StartExecutor("e3", 1, noop, *second).ok());
  ASSERT_TRUE(pool.StartExecutor("e4", 1, noop, *second).ok());
  std::vector<std::string> lines;
  for (int i = 0; i < 3000; ++i) lines.push_back(absl::StrCat("{\"custom_id\":\"r", i, "\",\"prompt\":\"x\"}"));
  std::string input = WriteInput(dir, lines);
  v1::Job job = SubmitAndWait(pool, input, 10, "", absl::Minutes(5));
  ASSERT_EQ(job.state(), "completed") << job.error();
  EXPECT_EQ(job.request_counts().completed(), 3000);
  ExpectEachRecordOnce(lines, Lines(FetchResults(pool, job.id(), false)), Lines(FetchResults(pool, job.id(), true)));
  // Both servers handed out leases.
  cli::Connection b = pool.connection();
  b.server = *second;
  auto executors = cli::JobsClient(b).Executors();
  ASSERT_TRUE(executors.ok());
  int64_t by_a = 0, by_b = 0;
  for (const auto& e : *executors) (e.name() == "e1" || e.name() == "e2" ? by_a : by_b) += e.records_done();
  EXPECT_GT(by_a, 0);
  EXPECT_GT(by_b, 0);
  EXPECT_EQ(by_a + by_b, 3000);
  std::filesystem::remove_all(dir);
}

// Lines {"custom_id": "r<i>", "prompt": ...}; `poison` marks the prompt of record `poison_at`.
std::vector<std::string> NoopLines(int n, int poison_at = -1) {
  std::vector<std::string> lines;
  for (int i = 0; i < n; ++i) {
    lines.push_back(absl::StrCat("{\"custom_id\":\"r", i, "\",\"prompt\":\"", i == poison_at ? "poison-me" : "x", "\"}"));
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

TEST_P(Pool, ARecordThatCrashesTheRunnerBecomesAnErrorRecordNotAFailedTask) {
  std::string dir = TempDir("poison-" + GetParam());
  ProcessPool pool(kBin + "/minions", dir + "/pool", 3000);
  pool.AllowModels({MINIONS_TEST_MODELS_DIR});
  UseBackend(pool, GetParam(), "t" + std::to_string(__LINE__));
  if (HasFatalFailure()) return;
  ASSERT_TRUE(pool.StartServer().ok());
  ASSERT_TRUE(pool.StartExecutor("e1", 1, kBin + "/minions-noop-runner", "", {}, {"MINIONS_NOOP_CRASH_ON=poison-me"}).ok());
  auto lines = NoopLines(60, 37);
  cli::JobsClient client(pool.connection());
  auto submitted = Submit(pool, WriteInput(dir, lines), 20);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  v1::Job job = WaitForEnd(client, submitted->id(), absl::Minutes(2));
  ASSERT_EQ(job.state(), "completed") << job.error();
  EXPECT_EQ(job.request_counts().completed(), 59);
  EXPECT_EQ(job.request_counts().failed(), 1);
  auto errors = Lines(FetchResults(pool, job.id(), true));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0]["custom_id"], "r37");
  EXPECT_EQ(errors[0]["error"]["code"], "runner_crashed");
  ExpectEachRecordOnce(lines, Lines(FetchResults(pool, job.id(), false)), errors);
  // The task holding it succeeded on its first attempt: a poison record is not a task failure.
  auto tasks = client.Tasks(job.id());
  ASSERT_TRUE(tasks.ok());
  for (const auto& t : *tasks) {
    EXPECT_EQ(t.state(), "succeeded");
    EXPECT_EQ(t.attempt(), 1) << "task " << t.index();
    EXPECT_EQ(t.failures(), 0) << "task " << t.index();
  }
  if (!HasFailure()) std::filesystem::remove_all(dir);  // logs stay for a failure
}

TEST_P(Pool, AnExecutorsSuccessorResumesAfterItsLastCheckpoint) {
  std::string dir = TempDir("resume-" + GetParam());
  ProcessPool pool(kBin + "/minions", dir + "/pool", 1500);
  pool.AllowModels({MINIONS_TEST_MODELS_DIR});
  UseBackend(pool, GetParam(), "t" + std::to_string(__LINE__));
  if (HasFatalFailure()) return;
  ASSERT_TRUE(pool.StartServer().ok());
  const std::string noop = kBin + "/minions-noop-runner";
  ASSERT_TRUE(pool.StartExecutor("slow", 1, noop, "", {"--checkpoint-records", "10"},
                                 {"MINIONS_NOOP_RECORD_DELAY_MS=40"}).ok());
  auto lines = NoopLines(100);
  cli::JobsClient client(pool.connection());
  auto submitted = Submit(pool, WriteInput(dir, lines), 100);  // one task
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  // Once 30 records are committed, the executor dies.
  int64_t committed = 0;
  for (int i = 0; i < 300 && committed < 30; ++i) {
    auto tasks = client.Tasks(submitted->id());
    if (tasks.ok() && !tasks->empty()) committed = (*tasks)[0].records_committed();
    if (committed < 30) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_GE(committed, 30);
  pool.executor("slow").Signal(SIGKILL);
  ASSERT_TRUE(pool.StartExecutor("fresh", 1, noop).ok());
  v1::Job job = WaitForEnd(client, submitted->id(), absl::Minutes(2));
  ASSERT_EQ(job.state(), "completed") << job.error();
  ExpectEachRecordOnce(lines, Lines(FetchResults(pool, job.id(), false)), Lines(FetchResults(pool, job.id(), true)));
  auto tasks = client.Tasks(job.id());
  ASSERT_TRUE(tasks.ok());
  const v1::Task& task = (*tasks)[0];
  EXPECT_EQ(task.attempt(), 2);
  ASSERT_GE(task.chunks_size(), 2);
  EXPECT_EQ(task.chunks(0).attempt(), 1);
  // The second attempt started at the first's last commit: no committed record ran twice.
  const v1::Chunk& last = task.chunks(task.chunks_size() - 1);
  EXPECT_EQ(last.attempt(), 2);
  EXPECT_GE(last.begin(), committed);
  EXPECT_EQ(last.end(), 100);
  if (!HasFailure()) std::filesystem::remove_all(dir);  // logs stay for a failure
}

TEST_P(Pool, AJobPastItsCompletionWindowExpiresWithWhatItFinished) {
  std::string dir = TempDir("expire-" + GetParam());
  ProcessPool pool(kBin + "/minions", dir + "/pool", 3000);
  pool.AllowModels({MINIONS_TEST_MODELS_DIR});
  UseBackend(pool, GetParam(), "t" + std::to_string(__LINE__));
  if (HasFatalFailure()) return;
  ASSERT_TRUE(pool.StartServer().ok());
  auto lines = NoopLines(200);
  std::ifstream in(WriteInput(dir, lines));
  std::stringstream data;
  data << in.rdbuf();
  v1::SubmitJobRequest request;
  request.set_input(data.str());
  request.set_model(kModel);
  request.set_shard_size(20);
  request.set_completion_window_ms(2500);
  cli::JobsClient client(pool.connection());
  auto submitted = client.Submit(request);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  // One task is the test's own and never done: the window must pass with the job unfinished,
  // however fast the executor is.
  LeaseHolder holder(pool.connection());
  ASSERT_TRUE(holder.Hold().ok());
  ASSERT_TRUE(pool.StartExecutor("e1", 1, kBin + "/minions-noop-runner", "", {"--checkpoint-records", "5"},
                                 {"MINIONS_NOOP_RECORD_DELAY_MS=50"}).ok());
  v1::Job job = WaitForEnd(client, submitted->id(), absl::Minutes(1));
  ASSERT_EQ(job.state(), "expired") << job.error();
  EXPECT_THAT(job.error(), ::testing::HasSubstr("completion window"));
  auto output = Lines(FetchResults(pool, job.id(), false));
  auto errors = Lines(FetchResults(pool, job.id(), true));
  EXPECT_LE(output.size(), lines.size() - holder.held_records());
  EXPECT_GE(errors.size(), static_cast<size_t>(holder.held_records()));
  for (const auto& e : errors) EXPECT_EQ(e["error"]["code"], "batch_expired");
  EXPECT_EQ(job.request_counts().completed(), static_cast<int64_t>(output.size()));
  ExpectEachRecordOnce(lines, output, errors);
  if (!HasFailure()) std::filesystem::remove_all(dir);  // logs stay for a failure
}

TEST_P(Pool, ExecutorsRideOutAServerRestartAndReattachTheirLeases) {
  std::string dir = TempDir("restart-" + GetParam());
  const int ttl_ms = 1500;
  ProcessPool pool(kBin + "/minions", dir + "/pool", ttl_ms);
  pool.AllowModels({MINIONS_TEST_MODELS_DIR});
  UseBackend(pool, GetParam(), "t" + std::to_string(__LINE__));
  if (HasFatalFailure()) return;
  ASSERT_TRUE(pool.StartServer().ok());
  const std::string noop = kBin + "/minions-noop-runner";
  for (const char* name : {"e1", "e2"}) {
    ASSERT_TRUE(pool.StartExecutor(name, 1, noop, "", {}, {"MINIONS_NOOP_RECORD_DELAY_MS=25"}).ok());
  }
  auto lines = NoopLines(400);
  cli::JobsClient client(pool.connection());
  auto submitted = Submit(pool, WriteInput(dir, lines), 40);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  // Both executors hold tasks; the server dies and stays away for two TTLs.
  for (int i = 0; i < 100; ++i) {
    auto tasks = client.Tasks(submitted->id());
    int running = 0;
    if (tasks.ok()) {
      for (const auto& t : *tasks) running += t.state() == "running";
    }
    if (running >= 2) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  pool.server(0).Signal(SIGKILL);
  (void)pool.server(0).Wait(absl::Seconds(10));
  absl::SleepFor(absl::Milliseconds(2 * ttl_ms));
  ASSERT_TRUE(pool.StartServer().ok());
  v1::Job job = WaitForEnd(client, submitted->id(), absl::Minutes(2));
  ASSERT_EQ(job.state(), "completed") << job.error();
  ExpectEachRecordOnce(lines, Lines(FetchResults(pool, job.id(), false)), Lines(FetchResults(pool, job.id(), true)));
  // No lease was taken from its holder: the executors re-attached them.
  auto tasks = client.Tasks(job.id());
  ASSERT_TRUE(tasks.ok());
  for (const auto& t : *tasks) {
    EXPECT_EQ(t.failures(), 0) << "task " << t.index() << ": " << t.last_error();
    EXPECT_EQ(t.attempt(), 1) << "task " << t.index();
  }
  if (!HasFailure()) std::filesystem::remove_all(dir);  // logs stay for a failure
}

TEST_P(Pool, AStragglerGetsABackupAndTheFirstToFinishWins) {
  std::string dir = TempDir("straggler-" + GetParam());
  ProcessPool pool(kBin + "/minions", dir + "/pool", 3000);
  pool.AllowModels({MINIONS_TEST_MODELS_DIR});
  UseBackend(pool, GetParam(), "t" + std::to_string(__LINE__));
  if (HasFatalFailure()) return;
  pool.AddServerArgs({"--straggler-min-runtime-ms", "500"});
  ASSERT_TRUE(pool.StartServer().ok());
  const std::string noop = kBin + "/minions-noop-runner";
  // "slow" would need 2 s a task; "fast" 50 ms.
  ASSERT_TRUE(pool.StartExecutor("slow", 1, noop, "", {}, {"MINIONS_NOOP_RECORD_DELAY_MS=400"}).ok());
  auto lines = NoopLines(40);
  cli::JobsClient client(pool.connection());
  auto submitted = Submit(pool, WriteInput(dir, lines), 5);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  // Let the slow one hold its first tasks, then bring the fast one.
  for (int i = 0; i < 100; ++i) {
    auto executors = client.Executors();
    if (executors.ok() && !executors->empty() && !(*executors)[0].current_tasks().empty()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(pool.StartExecutor("fast", 1, noop, "", {}, {"MINIONS_NOOP_RECORD_DELAY_MS=10"}).ok());
  v1::Job job = WaitForEnd(client, submitted->id(), absl::Minutes(2));
  ASSERT_EQ(job.state(), "completed") << job.error();
  ExpectEachRecordOnce(lines, Lines(FetchResults(pool, job.id(), false)), Lines(FetchResults(pool, job.id(), true)));
  auto tasks = client.Tasks(job.id());
  ASSERT_TRUE(tasks.ok());
  int backed_up = 0;
  for (const auto& t : *tasks) {
    EXPECT_EQ(t.failures(), 0) << "task " << t.index() << ": a lost race is not a failure";
    backed_up += t.attempt() > 1;
  }
  EXPECT_GE(backed_up, 1) << "no task finished under a backup attempt";
  // The losing attempts are cancelled within a heartbeat or two: the slow one holds nothing.
  bool idle = false;
  for (int i = 0; i < 60 && !idle; ++i) {
    auto executors = client.Executors();
    idle = executors.ok();
    if (executors.ok()) {
      for (const auto& e : *executors) idle &= e.current_tasks().empty();
    }
    if (!idle) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(idle) << "an executor still holds a task of the finished job";
  if (!HasFailure()) std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Backends, Pool, ::testing::Values("embedded", "postgres-s3"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "embedded" ? std::string("Embedded") : std::string("PostgresS3");
                         });

}  // namespace
}  // namespace minions::testing
