// End to end with real processes on loopback: a server, several executors, each running the real
// llama.cpp runner on a test model.

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/sample_prompts.h"
#include "common/json_util.h"
#include "absl/strings/str_cat.h"
#include "testing/process_pool.h"

namespace minions::testing {
namespace {

const std::string kBin = MINIONS_TEST_BIN_DIR;
const std::string kModel = std::string(MINIONS_TEST_MODELS_DIR) + "/text.gguf";

// The backend pairs the end-to-end suite runs on.
std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Points the pool at `backend`: "embedded" (SQLite + a directory, the default) or "postgres-s3"
// (a fresh schema in the fixture's PostgreSQL, a fresh prefix in the fixture's S3 server).
void UseBackend(ProcessPool& pool, const std::string& backend, const std::string& name) {
  if (backend == "embedded") return;
  std::string schema = absl::StrCat("it_", name, "_", getpid());
  std::string base = MINIONS_TEST_POSTGRES_URL;
  Subprocess::Options sp;
  sp.argv = {"psql", base, "-q", "-v", "ON_ERROR_STOP=1", "-c", "CREATE SCHEMA " + schema};
  sp.stderr_path = pool.dir() + "/logs/psql.log";
  auto psql = Subprocess::Start(sp);
  ASSERT_TRUE(psql.ok()) << psql.status();
  (*psql)->CloseStdin();
  auto exit = (*psql)->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.ok() && exit->exited && exit->code == 0)
      << "cannot create a schema in the test PostgreSQL (" << base << "); see " << pool.dir() << "/logs/psql.log";
  std::string endpoint = ReadFirstLine(std::string(MINIONS_TEST_S3_DIR) + "/endpoint");
  ASSERT_FALSE(endpoint.empty()) << "the test S3 server is not running (fixture s3rver_start)";
  pool.SetBackend({"--database", base + "?options=-csearch_path%3D" + schema, "--objects",
                   "s3://minions-test/" + schema},
                  {"AWS_ACCESS_KEY_ID=S3RVER", "AWS_SECRET_ACCESS_KEY=S3RVER", "AWS_ENDPOINT_URL=" + endpoint,
                   "AWS_REGION=us-east-1"});
}

class Pool : public ::testing::TestWithParam<std::string> {};

std::string TempDir(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("minions-it-" + std::to_string(getpid()) + "-" + name)).string();
}

std::string WriteInput(const std::string& dir, const std::vector<std::string>& lines) {
  std::filesystem::create_directories(dir);
  std::string path = dir + "/input.jsonl";
  std::ofstream out(path);
  for (const auto& l : lines) out << l << "\n";
  return path;
}

// Submits the JSONL file at `input` with the test model.
absl::StatusOr<v1::Job> Submit(ProcessPool& pool, const std::string& input, int64_t shard_size,
                               const std::string& options = "") {
  std::ifstream in(input);
  std::stringstream data;
  data << in.rdbuf();
  v1::SubmitJobRequest request;
  request.set_input(data.str());
  request.set_model(kModel);
  request.set_shard_size(shard_size);
  request.set_runner_options_json(options);
  return cli::JobsClient(pool.connection()).Submit(request);
}

v1::Job SubmitAndWait(ProcessPool& pool, const std::string& input, int64_t shard_size, const std::string& options,
                      absl::Duration timeout) {
  cli::JobsClient client(pool.connection());
  auto job = Submit(pool, input, shard_size, options);
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return {};
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    auto now = client.Get(job->id());
    if (now.ok() && (now->state() == "completed" || now->state() == "failed" || now->state() == "cancelled")) {
      return *now;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  ADD_FAILURE() << "job " << job->id() << " did not finish in time; logs in " << pool.dir() << "/logs";
  return *client.Get(job->id());
}

std::vector<Json> Lines(const std::string& text) {
  std::vector<Json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto parsed = ParseJson(line);
    EXPECT_TRUE(parsed.ok()) << line;
    if (parsed.ok()) out.push_back(*parsed);
  }
  return out;
}

std::string FetchResults(ProcessPool& pool, const std::string& job_id, bool errors) {
  std::string all;
  auto s = cli::JobsClient(pool.connection()).Results(job_id, errors, [&](const std::string& c) { all += c; });
  EXPECT_TRUE(s.ok()) << s;
  return all;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The parts of an output line that must not depend on where or when it ran. Generated text must
// be identical; embedding vectors agree to rounding (mean pooling sums over however many tokens
// share the batch), so they are compared separately and removed here.
Json Normalised(Json line, std::vector<std::vector<float>>* embeddings = nullptr) {
  if (line.contains("response") && line["response"].is_object() && line["response"].contains("body")) {
    Json& body = line["response"]["body"];
    body.erase("created");
    if (body.contains("data") && body["data"].is_array()) {
      for (auto& item : body["data"]) {
        if (embeddings) embeddings->push_back(item["embedding"].get<std::vector<float>>());
        item.erase("embedding");
      }
    }
  }
  return line;
}

double Cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    dot += double(a[i]) * b[i];
    na += double(a[i]) * a[i];
    nb += double(b[i]) * b[i];
  }
  return dot / std::sqrt(na * nb);
}

// Every custom_id of `lines` exactly once across output and errors.
void ExpectEachRecordOnce(const std::vector<std::string>& lines, const std::vector<Json>& output,
                          const std::vector<Json>& errors) {
  std::map<std::string, int> seen;
  int nulls = 0;
  for (const auto* file : {&output, &errors}) {
    for (const auto& l : *file) {
      if (l["custom_id"].is_string()) {
        ++seen[l["custom_id"].get<std::string>()];
      } else {
        ++nulls;  // a line too broken to name its record
      }
    }
  }
  int expected_nulls = 0;
  for (const auto& line : lines) {
    auto parsed = ParseJson(line);
    if (!parsed.ok() || !parsed->contains("custom_id")) {
      ++expected_nulls;
      continue;
    }
    std::string id = (*parsed)["custom_id"].get<std::string>();
    EXPECT_EQ(seen[id], 1) << id;
    seen.erase(id);
  }
  EXPECT_TRUE(seen.empty()) << "unexpected custom_ids, e.g. " << (seen.empty() ? "" : seen.begin()->first);
  EXPECT_EQ(nulls, expected_nulls);
}

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
  Subprocess::Options sp;
  sp.argv = {kBin + "/minions", "local-run", input, "--model", kModel, "-o", dir + "/local.jsonl", "--errors",
             dir + "/local-errors.jsonl", "--parallel", "8", "--no-progress"};
  sp.stderr_path = dir + "/local-run.log";
  auto local = Subprocess::Start(sp);
  ASSERT_TRUE(local.ok());
  (*local)->CloseStdin();
  while ((*local)->ReadLine().ok()) {
  }
  auto exit = (*local)->Wait(absl::Minutes(5));
  ASSERT_TRUE(exit.ok() && exit->exited && exit->code == 0);
  auto local_output = Lines(ReadFile(dir + "/local.jsonl"));
  auto local_errors = Lines(ReadFile(dir + "/local-errors.jsonl"));
  ASSERT_EQ(output.size(), local_output.size());
  int embeddings_compared = 0;
  for (size_t i = 0; i < output.size(); ++i) {
    std::vector<std::vector<float>> a, b;
    ASSERT_EQ(Normalised(output[i], &a), Normalised(local_output[i], &b)) << "output line " << i;
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) {
      EXPECT_GT(Cosine(a[k], b[k]), 1 - 1e-5) << "output line " << i;
      ++embeddings_compared;
    }
  }
  EXPECT_GT(embeddings_compared, 10);
  ASSERT_EQ(errors.size(), local_errors.size());
  for (size_t i = 0; i < errors.size(); ++i) EXPECT_EQ(errors[i], local_errors[i]);
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
  UseBackend(pool, GetParam(), "t" + std::to_string(__LINE__));
  if (HasFatalFailure()) return;
  ASSERT_TRUE(pool.StartServer().ok());
  ASSERT_TRUE(pool.StartExecutor("e1", 1, kBin + "/minions-noop-runner", "", {"--checkpoint-records", "5"},
                                 {"MINIONS_NOOP_RECORD_DELAY_MS=50"}).ok());
  auto lines = NoopLines(200);
  std::ifstream in(WriteInput(dir, lines));
  std::stringstream data;
  data << in.rdbuf();
  v1::SubmitJobRequest request;
  request.set_input(data.str());
  request.set_model(kModel);
  request.set_shard_size(20);
  request.set_completion_window_ms(2500);  // 200 records at 20 a second need 10 s
  cli::JobsClient client(pool.connection());
  auto submitted = client.Submit(request);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  v1::Job job = WaitForEnd(client, submitted->id(), absl::Minutes(1));
  ASSERT_EQ(job.state(), "expired") << job.error();
  EXPECT_THAT(job.error(), ::testing::HasSubstr("completion window"));
  auto output = Lines(FetchResults(pool, job.id(), false));
  auto errors = Lines(FetchResults(pool, job.id(), true));
  EXPECT_GT(output.size(), 10u);
  EXPECT_LT(output.size(), 150u);
  for (const auto& e : errors) EXPECT_EQ(e["error"]["code"], "batch_expired");
  EXPECT_EQ(job.request_counts().completed(), static_cast<int64_t>(output.size()));
  ExpectEachRecordOnce(lines, output, errors);
  if (!HasFailure()) std::filesystem::remove_all(dir);  // logs stay for a failure
}

TEST_P(Pool, ExecutorsRideOutAServerRestartAndReattachTheirLeases) {
  std::string dir = TempDir("restart-" + GetParam());
  const int ttl_ms = 1500;
  ProcessPool pool(kBin + "/minions", dir + "/pool", ttl_ms);
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
  absl::Time start = absl::Now();
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
  // Far sooner than the slow executor alone would take for its tasks (2 s each).
  EXPECT_LT(absl::ToDoubleSeconds(absl::Now() - start), 2.0 * backed_up + 10);
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
