// Owner first, end to end with real processes: an executor that sees its owner come back (owner
// activity injected through its control socket) pauses in the middle of a job, hands its task
// back as preempted, another executor finishes it without a failure counted, and once the owner
// has been away for the idle period the first executor comes back and takes work again.

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "cli/sample_prompts.h"
#include "executor/control_channel.h"
#include "testing/http_get.h"
#include "testing/process_pool.h"
#include "testing/prometheus_text.h"

namespace minions::testing {
namespace {

const std::string kBin = MINIONS_TEST_BIN_DIR;
const std::string kModel = std::string(MINIONS_TEST_MODELS_DIR) + "/text.gguf";

// Short periods so the whole chain runs in seconds; probes of the test machine itself are off
// (its own owner's activity, CPU and GPU load must not steer the test). Reported activity is the
// only owner signal.
const std::vector<std::string> kOwnerArgs = {
    "--availability", "dedicated",
    "--availability-set", "probe_logind=false", "--availability-set", "probe_input_devices=false",
    "--availability-set", "probe_nvml=false",
    "--availability-set", "start_max_other_cpu=1", "--availability-set", "pause_other_cpu=1",
    "--availability-set", "start_idle=1s", "--availability-set", "resume_idle=3s",
    "--availability-set", "min_paused=0s", "--availability-set", "release_after=1s",
    "--availability-set", "stop_after=2s", "--availability-set", "backoff_initial=1s",
    "--availability-set", "pause_grace=200ms"};

absl::StatusOr<v1::Job> Submit(ProcessPool& pool, const std::vector<std::string>& lines, int64_t shard_size) {
  v1::SubmitJobRequest request;
  std::string input;
  for (const auto& l : lines) input += l + "\n";
  request.set_input(input);
  request.set_model(kModel);
  request.set_shard_size(shard_size);
  return cli::JobsClient(pool.connection()).Submit(request);
}

v1::Job WaitDone(ProcessPool& pool, const std::string& job_id, absl::Duration timeout) {
  cli::JobsClient client(pool.connection());
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    auto job = client.Get(job_id);
    if (job.ok() && (job->state() == "completed" || job->state() == "failed")) return *job;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ADD_FAILURE() << "job " << job_id << " did not finish; logs in " << pool.dir() << "/logs";
  return {};
}

std::optional<v1::Executor> Find(ProcessPool& pool, const std::string& name) {
  auto executors = cli::JobsClient(pool.connection()).Executors();
  if (!executors.ok()) return std::nullopt;
  for (const auto& e : *executors) {
    if (e.name() == name) return e;
  }
  return std::nullopt;
}

TEST(Availability, OwnerActivityPreemptsWithoutFailureAndTheExecutorComesBack) {
  std::string dir = (std::filesystem::temp_directory_path() / absl::StrCat("minions-it-avail-", getpid())).string();
  ProcessPool pool(kBin + "/minions", dir, 2000);
  pool.AllowModels({MINIONS_TEST_MODELS_DIR});
  ASSERT_TRUE(pool.StartServer().ok());
  const std::string metrics = absl::StrCat("127.0.0.1:", PickFreePort());
  std::vector<std::string> owner_args = kOwnerArgs;
  owner_args.insert(owner_args.end(), {"--metrics-listen", metrics});
  ASSERT_TRUE(pool.StartExecutor("owner", 1, "", "", owner_args).ok());
  std::string socket = ControlSocketPath(dir + "/owner");
  cli::SamplePromptOptions sample;
  sample.records = 160;
  sample.max_tokens = 16;
  sample.include_bad_lines = false;
  auto lines = cli::SamplePromptLines(sample);
  auto job = Submit(pool, lines, 20);
  ASSERT_TRUE(job.ok()) << job.status();

  // The owner executor takes a task ...
  std::string held;
  for (int i = 0; i < 300 && held.empty(); ++i) {
    auto e = Find(pool, "owner");
    if (e && !e->current_tasks().empty()) held = e->current_tasks(0);
    if (held.empty()) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_FALSE(held.empty()) << "the owner executor never took a task; see " << dir << "/logs";

  // ... and its owner comes back: keep "typing" for 4 s, past stop_after.
  ASSERT_TRUE(SendControlCommand(socket, "activity").ok());
  ASSERT_TRUE(pool.StartExecutor("helper", 1).ok());
  bool seen_owner_active = false;
  std::string reason;
  for (int i = 0; i < 8; ++i) {
    absl::SleepFor(absl::Milliseconds(500));
    ASSERT_TRUE(SendControlCommand(socket, "activity").ok());
    auto e = Find(pool, "owner");
    if (e && e->state() == "unavailable") {
      seen_owner_active = true;
      reason = e->state_reason();
    }
  }
  // The fleet sees a coarse state; why the owner is back stays on the machine (its status says).
  EXPECT_TRUE(seen_owner_active) << "the fleet view never showed the owner executor as unavailable";
  EXPECT_EQ(reason, "");
  auto status = SendControlCommand(socket, "status");
  ASSERT_TRUE(status.ok());
  EXPECT_NE(status->find("stop: paused for"), std::string::npos) << *status;
  // The executor's own metrics time the yield: the owner came back once, so one observation (how
  // fast is docs/benchmarks.md's business: a test does not time it).
  auto samples = ParsePrometheusSamples(HttpGet("http://" + metrics + "/metrics").body);
  EXPECT_EQ(samples["minions_executor_yield_seconds_count"], 1);
  EXPECT_GT(samples["minions_executor_yield_seconds_sum"], 0);

  // The task is finished elsewhere; the preemption is not a failure.
  v1::Job done = WaitDone(pool, job->id(), absl::Minutes(4));
  ASSERT_EQ(done.state(), "completed");
  EXPECT_EQ(done.request_counts().completed(), 160);
  auto tasks = cli::JobsClient(pool.connection()).Tasks(job->id());
  ASSERT_TRUE(tasks.ok());
  int preemptions = 0, failures = 0;
  for (const auto& t : *tasks) {
    EXPECT_EQ(t.state(), "succeeded");
    preemptions += t.preemptions();
    failures += t.failures();
  }
  EXPECT_GE(preemptions, 1);
  EXPECT_EQ(failures, 0);

  // The owner leaves. Only the owner executor may take the next job: the helper drains.
  auto helper = Find(pool, "helper");
  ASSERT_TRUE(helper.has_value());
  ASSERT_TRUE(cli::JobsClient(pool.connection()).Drain(helper->id()).ok());
  auto second = Submit(pool, std::vector<std::string>(lines.begin(), lines.begin() + 20), 10);
  ASSERT_TRUE(second.ok());
  v1::Job again = WaitDone(pool, second->id(), absl::Minutes(2));
  ASSERT_EQ(again.state(), "completed");
  auto owner = Find(pool, "owner");
  ASSERT_TRUE(owner.has_value());
  auto second_tasks = cli::JobsClient(pool.connection()).Tasks(second->id());
  ASSERT_TRUE(second_tasks.ok());
  for (const auto& t : *second_tasks) EXPECT_EQ(t.executor_id(), owner->id());
  std::filesystem::remove_all(dir);
}

TEST(Availability, AnExecutorStoppedWhilePausedByHandHandsItsTasksBack) {
  std::string dir = (std::filesystem::temp_directory_path() / absl::StrCat("minions-it-avail-stop-", getpid())).string();
  ProcessPool pool(kBin + "/minions", dir, 2000);
  pool.AllowModels({MINIONS_TEST_MODELS_DIR});
  ASSERT_TRUE(pool.StartServer().ok());
  ASSERT_TRUE(pool.StartExecutor("owner", 1, "", "", kOwnerArgs).ok());
  cli::SamplePromptOptions sample;
  // 15 tasks: whatever a loaded machine lets it finish between the check below and the pause, it
  // still holds work when paused (with 3 it once had finished them all: nothing to hand back).
  sample.records = 300;
  sample.max_tokens = 16;
  sample.include_bad_lines = false;
  auto job = Submit(pool, cli::SamplePromptLines(sample), 20);
  ASSERT_TRUE(job.ok()) << job.status();
  bool held = false;
  for (int i = 0; i < 300 && !held; ++i) {
    auto e = Find(pool, "owner");
    held = e && !e->current_tasks().empty();
    if (!held) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(held);
  // The owner takes the machine back by hand, then the service is stopped (SIGTERM: drain).
  auto paused = SendControlCommand(ControlSocketPath(dir + "/owner"), "pause");
  ASSERT_TRUE(paused.ok()) << paused.status();
  pool.executor("owner").Signal(SIGTERM);
  auto exit = pool.executor("owner").Wait(absl::Seconds(15));
  ASSERT_TRUE(exit.ok()) << "a paused executor must not hold its exit until the owner leaves";
  EXPECT_TRUE(exit->exited && exit->code == 0) << exit->ToString();
  // Its tasks went back as preempted; another executor finishes them without a failure.
  ASSERT_TRUE(pool.StartExecutor("helper", 1).ok());
  v1::Job done = WaitDone(pool, job->id(), absl::Minutes(2));
  ASSERT_EQ(done.state(), "completed");
  auto tasks = cli::JobsClient(pool.connection()).Tasks(job->id());
  ASSERT_TRUE(tasks.ok());
  int preemptions = 0, failures = 0;
  for (const auto& t : *tasks) {
    preemptions += t.preemptions();
    failures += t.failures();
  }
  EXPECT_GE(preemptions, 1);
  EXPECT_EQ(failures, 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace minions::testing
