// End to end with real processes on loopback: a server, several executors, each running the real
// llama.cpp runner on a test model.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/sample_prompts.h"
#include "pool_test_util.h"

namespace minions::testing {
namespace {

class Pool : public ::testing::TestWithParam<std::string> {};

TEST_P(Pool, ThousandRecordsOverThreeExecutorsEqualOneRunnerInOneProcess) {
  std::string dir = TempDir("thousand-" + GetParam());
  ProcessPool pool(kBin + "/minions", dir + "/pool", 6000);
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

TEST_P(Pool, CancelStopsExecutorsWithinAHeartbeat) {
  std::string dir = TempDir("cancel-" + GetParam());
  const int ttl_ms = 3000;
  ProcessPool pool(kBin + "/minions", dir + "/pool", ttl_ms);
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
  absl::Time at = absl::Now();
  // Within a heartbeat the executors hear of it and stop; the heartbeat after reports them idle.
  while (absl::Now() - at < absl::Milliseconds(ttl_ms) * 2 && busy_executors() > 0) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  double seconds = absl::ToDoubleSeconds(absl::Now() - at);
  EXPECT_EQ(busy_executors(), 0);
  EXPECT_LT(seconds, 2.0 * ttl_ms / 3 / 1000 + 1.0) << "executors took " << seconds << " s to stop";
  auto results = cli::JobsClient(pool.connection()).Results(job->id(), false, [](const std::string&) {});
  EXPECT_TRUE(absl::IsFailedPrecondition(results));
  std::filesystem::remove_all(dir);
}

TEST_P(Pool, TwoServersOnOneStoreServeEveryRecordOnce) {
  // Two servers share the store; half the executors talk to each. A job submitted to one is
  // leased through both, and every record is served exactly once.
  std::string dir = TempDir("two-servers-" + GetParam());
  ProcessPool pool(kBin + "/minions", dir + "/pool", 3000);
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

INSTANTIATE_TEST_SUITE_P(Backends, Pool, ::testing::Values("embedded", "postgres-s3"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "embedded" ? std::string("Embedded") : std::string("PostgresS3");
                         });

}  // namespace
}  // namespace minions::testing
