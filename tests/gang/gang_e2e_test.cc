// Gangs end to end (docs/architecture.md, "Gangs"): a `minions server` and three `minions
// executor`s on loopback, each with a gang address, running the real llama.cpp runner and
// ggml-rpc-server on CPU. A job that needs more memory than any one executor declares runs on a
// gang of two (a leader whose runner spreads the model's layers over a member's rpc-server); its
// greedy output equals `minions local-run` of the same model on one machine.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "cli/sample_prompts.h"
#include "executor/control_channel.h"
#include "executor/runner_devices.h"
#include "pool_test_util.h"

namespace minions::testing {
namespace {

// Starts three executors e1..e3, each with a gang address of its own on loopback, and waits until
// the server knows them. Returns the most usable memory any of them declares (0 on failure).
// `runner` "": the llama.cpp runner; `env` goes to the executors and their runners.
int64_t StartGangFleet(ProcessPool& pool, const std::vector<std::string>& extra = {}, const std::string& runner = "",
                       const std::vector<std::string>& env = {}) {
  for (const char* name : {"e1", "e2", "e3"}) {
    std::vector<std::string> args = {"--gang-address", absl::StrCat("127.0.0.1:", PickFreePort())};
    args.insert(args.end(), extra.begin(), extra.end());
    absl::Status started = pool.StartExecutor(name, 1, runner, "", args, env);
    if (!started.ok()) {
      ADD_FAILURE() << started;
      return 0;
    }
  }
  cli::JobsClient client(pool.connection());
  for (int i = 0; i < 300; ++i) {
    auto executors = client.Executors();
    if (executors.ok() && executors->size() == 3) {
      int64_t largest = 0;
      for (const v1::Executor& e : *executors) largest = std::max(largest, e.usable_memory_bytes());
      return largest;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  ADD_FAILURE() << "the three executors did not register; logs in " << pool.dir() << "/logs";
  return 0;
}

absl::StatusOr<v1::Job> SubmitGang(ProcessPool& pool, const std::string& input, int gang, int64_t memory_bytes,
                                   int64_t shard_size) {
  v1::SubmitJobRequest request;
  request.set_input(ReadFile(input));
  request.set_model(kModel);
  request.set_shard_size(shard_size);
  request.set_runner_options_json(R"({"n_parallel": 4})");
  request.set_min_memory_bytes(memory_bytes);
  request.set_gang_size(gang);
  return cli::JobsClient(pool.connection()).Submit(request);
}

v1::Job WaitForEnd(ProcessPool& pool, const std::string& job_id, absl::Duration timeout) {
  cli::JobsClient client(pool.connection());
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    auto now = client.Get(job_id);
    if (now.ok() && IsFinished(*now)) return *now;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ADD_FAILURE() << "job " << job_id << " did not finish in time; logs in " << pool.dir() << "/logs";
  auto last = client.Get(job_id);
  return last.ok() ? *last : v1::Job{};
}

std::vector<std::string> GreedyLines(int n) {
  cli::SamplePromptOptions sample;
  sample.records = n;
  sample.max_tokens = 8;
  sample.greedy_only = true;
  sample.include_embeddings = false;
  return cli::SamplePromptLines(sample);
}

// Each test's pool (PoolTest), most of them with a fleet of gang executors.
class GangEndToEnd : public PoolTest {
 protected:
  // A pool (NewPool) with its server and a fleet of gang executors (StartGangFleet with `extra`):
  // the largest executor's memory; 0 (a test failure) where the server did not start.
  int64_t NewGangPool(const std::string& name, int lease_ttl_ms, const std::vector<std::string>& extra = {}) {
    ProcessPool& pool = NewPool(name, lease_ttl_ms);
    absl::Status started = pool.StartServer();
    EXPECT_TRUE(started.ok()) << started;
    return started.ok() ? StartGangFleet(pool, extra) : 0;
  }
};

TEST_F(GangEndToEnd, AModelNoExecutorCanHoldRunsOnAGangOfTwoAndEqualsOneMachine) {
  const int64_t largest = NewGangPool("gang-e2e", 6000);
  ASSERT_GT(largest, 0);
  ProcessPool& pool = *pool_;
  const std::vector<std::string> lines = GreedyLines(48);
  const std::string input = WriteInput(dir_, lines);

  // More than two executors can hold together is refused as a gang of two; more than the whole
  // fleet can hold is refused outright.
  auto too_big = SubmitGang(pool, input, 2, 2 * largest + 1, 16);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kFailedPrecondition) << too_big.status();
  auto beyond_fleet = SubmitGang(pool, input, 0, 3 * largest + 1, 16);
  EXPECT_EQ(beyond_fleet.status().code(), absl::StatusCode::kFailedPrecondition) << beyond_fleet.status();
  auto job = SubmitGang(pool, input, 2, largest + 1, 16);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->gang_size(), 2);

  v1::Job done = WaitForEnd(pool, job->id(), absl::Minutes(10));
  ASSERT_EQ(done.state(), "completed") << done.error() << "; logs in " << pool.dir() << "/logs";
  auto output = Lines(FetchResults(pool, job->id(), false));
  auto errors = Lines(FetchResults(pool, job->id(), true));
  ExpectEachRecordOnce(lines, output, errors);

  // Every task ran on a gang: the server formed one per task, and members served its leaders.
  const std::string server_log = ReadFile(pool.dir() + "/logs/server.log");
  int gangs = 0;
  for (size_t at = server_log.find("leased to a gang of 2"); at != std::string::npos;
       at = server_log.find("leased to a gang of 2", at + 1)) {
    ++gangs;
  }
  EXPECT_GE(gangs, done.n_tasks()) << "see " << pool.dir() << "/logs/server.log";
  std::string member_logs;
  for (const char* name : {"e1", "e2", "e3"}) member_logs += ReadFile(pool.dir() + "/logs/executor-" + name + ".log");
  EXPECT_THAT(member_logs, ::testing::HasSubstr("serving the gang of leader 127.0.0.1"));
  // And the leader really spread the model: a member took megabytes of tensors over its gate.
  int64_t most_in = 0;
  for (size_t at = member_logs.find(" bytes in"); at != std::string::npos; at = member_logs.find(" bytes in", at + 1)) {
    size_t begin = member_logs.rfind(' ', at - 1) + 1;
    most_in = std::max<int64_t>(most_in, std::stoll(member_logs.substr(begin, at - begin)));
  }
  EXPECT_GT(most_in, 1'000'000) << "no member received the model's layers";

  // The same records on one machine, one runner.
  RunLocally(input, dir_, 4, 1);
  if (HasFatalFailure()) return;
  ExpectSameResults(output, errors, Lines(ReadFile(dir_ + "/local.jsonl")), Lines(ReadFile(dir_ + "/local-errors.jsonl")));
}

// The pid of executor `name`'s ggml-rpc-server (it serves a gang now), or 0.
pid_t RpcServerOf(ProcessPool& pool, const std::string& name) {
  for (pid_t child : pool.ExecutorChildren(name)) {
    std::string comm = ReadFirstLine(absl::StrCat("/proc/", child, "/comm"));
    if (comm.find("rpc-server") != std::string::npos) return child;
  }
  return 0;
}

// The member serving the job's one task once it runs with at least `min_committed` (and fewer
// than `records`) records committed: the fault follows progress, not time. "" if none did.
std::string MemberOfACheckpointedTask(ProcessPool& pool, cli::JobsClient& client, const std::string& job_id,
                                      int64_t min_committed, int64_t records) {
  for (int i = 0; i < 3000; ++i) {
    auto tasks = client.Tasks(job_id);
    if (tasks.ok() && tasks->size() == 1 && tasks->at(0).state() == "running" &&
        tasks->at(0).records_committed() >= min_committed && tasks->at(0).records_committed() < records) {
      for (const std::string& name : pool.executor_names()) {
        if (RpcServerOf(pool, name) != 0) return name;
      }
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return "";
}

// A pool of three gang executors (a checkpoint every 4 records) running a gang job of one task,
// 64 greedy records on two of them, waited for until the task has committed a checkpoint.
struct CheckpointedGangTask {
  std::string dir;
  std::unique_ptr<ProcessPool> pool;
  std::vector<std::string> lines;
  std::string input;
  std::string job_id;
  std::string victim;  // the member serving the task
};

// Fills `task` (a fatal failure of the test when it cannot).
void StartCheckpointedGangTask(const std::string& name, CheckpointedGangTask* task) {
  task->dir = TempDir(name);
  task->pool = std::make_unique<ProcessPool>(kBin + "/minions", task->dir + "/pool", 3000);
  ProcessPool& pool = *task->pool;
  pool.AllowModels({MINIONS_TEST_MODELS_DIR});
  ASSERT_TRUE(pool.StartServer().ok());
  const int64_t largest = StartGangFleet(pool, {"--checkpoint-records", "4"});
  ASSERT_GT(largest, 0);
  task->lines = GreedyLines(64);
  task->input = WriteInput(task->dir, task->lines);
  auto job = SubmitGang(pool, task->input, 2, largest + 1, 64);  // one task
  ASSERT_TRUE(job.ok()) << job.status();
  task->job_id = job->id();
  cli::JobsClient client(pool.connection());
  task->victim = MemberOfACheckpointedTask(pool, client, task->job_id, 4, 64);
  ASSERT_FALSE(task->victim.empty()) << "no member served a running task with a checkpoint; logs in " << pool.dir();
}

// The task's job completed, its attempt ended by a member's end was preempted (never failed),
// every record came out once, and the results equal one machine's.
void ExpectPreemptedOnceAndTheSameAsOneMachine(ProcessPool& pool, cli::JobsClient& client,
                                               const CheckpointedGangTask& task) {
  const std::string& job_id = task.job_id;
  const std::vector<std::string>& lines = task.lines;
  const std::string& input = task.input;
  const std::string& dir = task.dir;
  v1::Job done = WaitForEnd(pool, job_id, absl::Minutes(10));
  ASSERT_EQ(done.state(), "completed") << done.error() << "; logs in " << pool.dir() << "/logs";
  auto output = Lines(FetchResults(pool, job_id, false));
  auto errors = Lines(FetchResults(pool, job_id, true));
  ExpectEachRecordOnce(lines, output, errors);
  auto tasks = client.Tasks(job_id);
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_GE(tasks->at(0).preemptions(), 1) << "the attempt the member's end ended was not preempted";
  EXPECT_EQ(tasks->at(0).failures(), 0) << tasks->at(0).last_error();
  EXPECT_GE(tasks->at(0).attempt(), 2);

  RunLocally(input, dir, 4, 1);
  if (::testing::Test::HasFatalFailure()) return;
  ExpectSameResults(output, errors, Lines(ReadFile(dir + "/local.jsonl")), Lines(ReadFile(dir + "/local-errors.jsonl")));
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

// A member machine dies mid-task (its executor SIGKILLed once the task has committed a
// checkpoint: the fault follows progress, not time; its rpc-server dies with it). The leader's attempt ends as
// preempted, not failed; the task resumes from its checkpoint on a new gang of the two left, and
// every custom_id comes out exactly once, equal to one machine's output.
TEST_F(GangEndToEnd, AMemberKilledMidTaskPreemptsTheAttemptAndTheTaskFinishesOnANewGang) {
  CheckpointedGangTask task;
  StartCheckpointedGangTask("gang-kill", &task);  // then kill its member
  if (HasFatalFailure()) return;
  ProcessPool& pool = *task.pool;
  cli::JobsClient client(pool.connection());
  const std::string& victim = task.victim;
  // `minions executors` shows the gang: the member and its leader name the same gang and leader.
  {
    auto fleet = client.Executors();
    ASSERT_TRUE(fleet.ok()) << fleet.status();
    std::map<std::string, v1::Executor> by_name;
    for (const v1::Executor& e : *fleet) by_name[e.name()] = e;
    const v1::Executor& member = by_name[victim];
    ASSERT_THAT(member.gang(), ::testing::StartsWith(task.job_id + "/0#"));
    EXPECT_NE(member.gang_leader(), member.id());
    int leaders = 0;
    for (const v1::Executor& e : *fleet) {
      if (e.id() == member.gang_leader()) {
        ++leaders;
        EXPECT_EQ(e.gang(), member.gang());
        EXPECT_EQ(e.gang_leader(), e.id());
      }
    }
    EXPECT_EQ(leaders, 1);
  }
  const pid_t rpc_server = RpcServerOf(pool, victim);
  ASSERT_GT(rpc_server, 0);
  const std::string rpc_server_started = LiveProcessStart(rpc_server);
  ASSERT_FALSE(rpc_server_started.empty());
  ASSERT_TRUE(pool.StopExecutor(victim, SIGKILL).ok());  // the member executor dies
  // ... and its rpc-server with it, though nothing else kills it and it reads no stdin: no orphan
  // keeps the member's memory (Subprocess, parent-death signal).
  const bool rpc_server_died = WaitUntilDead(rpc_server, rpc_server_started, absl::Minutes(1));
  if (!rpc_server_died) ::kill(rpc_server, SIGKILL);  // not left behind by a failing test
  EXPECT_TRUE(rpc_server_died) << "the rpc-server " << rpc_server << " outlived its SIGKILLed executor";

  ExpectPreemptedOnceAndTheSameAsOneMachine(pool, client, task);
}

// A member's rpc-server dies while its executor lives (it crashed, or was killed): its gate
// closes, so the leader finds the member gone. The attempt ends as preempted (not as a runner that
// crashed on its own, which would blame its records and count as a failure), and the task
// finishes on a new gang, every record once, equal to one machine's output.
TEST_F(GangEndToEnd, AMembersRpcServerDyingAloneIsAMemberGoneNotACrash) {
  CheckpointedGangTask task;
  StartCheckpointedGangTask("gang-rpc", &task);
  if (HasFatalFailure()) return;
  cli::JobsClient client(task.pool->connection());
  const pid_t rpc_server = RpcServerOf(*task.pool, task.victim);
  ASSERT_GT(rpc_server, 0);
  ASSERT_EQ(::kill(rpc_server, SIGKILL), 0);  // only the rpc-server: its executor lives on
  ExpectPreemptedOnceAndTheSameAsOneMachine(*task.pool, client, task);
}

// Automatic gangs: a job that asks for none, whose model no executor can hold alone, becomes a
// job of the fewest executors that can (two of three here); more than the fleet can hold is
// still refused.
TEST_F(GangEndToEnd, AJobNoExecutorCanHoldGetsTheFewestExecutorsThatCan) {
  const int64_t largest = NewGangPool("gang-auto", 6000);
  ASSERT_GT(largest, 0);
  ProcessPool& pool = *pool_;
  const std::vector<std::string> lines = GreedyLines(16);
  const std::string input = WriteInput(dir_, lines);
  auto job = SubmitGang(pool, input, 0, largest + 1, 16);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->gang_size(), 2);
  auto three = SubmitGang(pool, input, 0, 2 * largest + 1, 16);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->gang_size(), 3);
  auto beyond = SubmitGang(pool, input, 0, 3 * largest + 1, 16);
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kFailedPrecondition) << beyond.status();
  cli::JobsClient client(pool.connection());
  ASSERT_TRUE(client.Cancel(three->id()).ok());
  v1::Job done = WaitForEnd(pool, job->id(), absl::Minutes(10));
  ASSERT_EQ(done.state(), "completed") << done.error() << "; logs in " << pool.dir() << "/logs";
  ExpectEachRecordOnce(lines, pool, job->id());
}

// A member's owner comes back mid-task (the owner's "pause" on its control socket, once the task
// has committed a checkpoint): the member leaves the gang at once (its rpc-server goes, without
// waiting for the gang), the attempt ends as preempted, not failed, and the task finishes on a
// new gang; every custom_id exactly once.
TEST_F(GangEndToEnd, AMembersOwnerReturningPreemptsTheAttemptAndNeverWaits) {
  // Dedicated machines whose only owner signal is the hand control (the test machine's own
  // activity, CPU and GPU load must not steer the test).
  const int64_t largest = NewGangPool(
      "gang-owner", 3000,
      {"--checkpoint-records", "4", "--availability", "dedicated", "--availability-set", "probe_logind=false",
       "--availability-set", "probe_input_devices=false", "--availability-set", "probe_nvml=false",
       "--availability-set", "start_max_other_cpu=1", "--availability-set", "pause_other_cpu=1",
       "--availability-set", "start_idle=1s", "--availability-set", "pause_grace=200ms"});
  ASSERT_GT(largest, 0);
  ProcessPool& pool = *pool_;
  const std::vector<std::string> lines = GreedyLines(64);
  const std::string input = WriteInput(dir_, lines);
  auto job = SubmitGang(pool, input, 2, largest + 1, 64);  // one task
  ASSERT_TRUE(job.ok()) << job.status();

  cli::JobsClient client(pool.connection());
  const std::string member = MemberOfACheckpointedTask(pool, client, job->id(), 4, 64);
  ASSERT_FALSE(member.empty()) << "no member served a running task with a checkpoint; logs in " << pool.dir();
  auto paused = SendControlCommand(ControlSocketPath(pool.dir() + "/" + member), "pause");
  ASSERT_TRUE(paused.ok()) << paused.status();
  // The owner never waits for the gang: the member's rpc-server goes at once, long before the
  // task could finish (it still runs, or waits for a new gang).
  bool gone = false;
  for (int i = 0; i < 600 && !gone; ++i) {
    gone = RpcServerOf(pool, member) == 0;
    if (!gone) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(gone) << "the paused member kept serving its gang";

  v1::Job done = WaitForEnd(pool, job->id(), absl::Minutes(10));
  ASSERT_EQ(done.state(), "completed") << done.error() << "; logs in " << pool.dir() << "/logs";
  ExpectEachRecordOnce(lines, pool, job->id());
  auto tasks = client.Tasks(job->id());
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_GE(tasks->at(0).preemptions(), 1) << "the attempt the owner ended was not preempted";
  EXPECT_EQ(tasks->at(0).failures(), 0) << tasks->at(0).last_error();
}

// A gang leader's runner aborts on a record of its own while its member's gate answers (the noop
// runner's crash switch, as a poison record kills a real runner; members still run the real
// rpc-server behind their gates): the record becomes an error record (runner_crashed), every other
// record is answered once, and no attempt is failed or preempted. Before, such a task was
// preempted again and again. The crash follows the record, not a time.
TEST_F(GangEndToEnd, ALeadersRunnerCrashingOnAPoisonRecordIsolatesItAndTheJobCompletes) {
  ProcessPool& pool = NewPool("gang-poison", 3000);
  ASSERT_TRUE(pool.StartServer().ok());
  ASSERT_GT(StartGangFleet(pool, {}, kBin + "/minions-noop-runner", {"MINIONS_NOOP_CRASH_ON=poison-me"}), 0);
  std::vector<std::string> lines;
  for (int i = 0; i < 40; ++i) {
    lines.push_back(absl::StrCat("{\"custom_id\":\"r", i, "\",\"prompt\":\"", i == 23 ? "poison-me" : "x", "\"}"));
  }
  const std::string input = WriteInput(dir_, lines);
  auto job = SubmitGang(pool, input, 2, 0, 20);  // two tasks, each on a gang of two
  ASSERT_TRUE(job.ok()) << job.status();

  v1::Job done = WaitForEnd(pool, job->id(), absl::Minutes(5));
  ASSERT_EQ(done.state(), "completed") << done.error() << "; logs in " << pool.dir() << "/logs";
  const auto errors = Lines(FetchResults(pool, job->id(), true));
  ExpectEachRecordOnce(lines, Lines(FetchResults(pool, job->id(), false)), errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0]["custom_id"], "r23");
  EXPECT_EQ(errors[0]["error"]["code"], "runner_crashed") << DumpJson(errors[0]);
  cli::JobsClient client(pool.connection());
  auto tasks = client.Tasks(job->id());
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  for (const auto& t : *tasks) {
    EXPECT_EQ(t.failures(), 0) << "task " << t.index() << ": " << t.last_error();
    EXPECT_EQ(t.preemptions(), 0) << "task " << t.index() << ": " << t.last_error();
    EXPECT_EQ(t.attempt(), 1) << "task " << t.index();
  }
  // The gang was real: a member served its leader, and the leader found its gates answering.
  std::string logs;
  for (const char* name : {"e1", "e2", "e3"}) logs += ReadFile(pool.dir() + "/logs/executor-" + name + ".log");
  EXPECT_THAT(logs, ::testing::HasSubstr("serving the gang of leader 127.0.0.1"));
  EXPECT_THAT(logs, ::testing::HasSubstr("every gang member still answers: the runner crashed on its own"));
}

// The vulkan runner (minions-llama-runner-vulkan, tests/llama/vulkan_test.cc) on Mesa's lavapipe:
// why a gang with a Vulkan executor cannot run here, "" when it can.
const std::vector<std::string> kLavapipe = {"GGML_VK_VISIBLE_DEVICES=0"};  // ggml skips CPU-type Vulkan devices unless told
const std::string kVulkanRunner = kBin + "/minions-llama-runner-vulkan";

std::string WhyNoVulkanGang() {
  if (!std::filesystem::exists(kVulkanRunner)) {
    return "this build has no vulkan runner: scripts/setup could not fetch the npm package "
           "@node-llama-cpp/linux-x64-vulkan (or MINIONS_VULKAN=0, or not Linux x86-64)";
  }
  if (!std::filesystem::exists(kBin + "/llama-vulkan/libggml-rpc.so")) {
    return "the vulkan runner has no RPC backend (apps/llama-vulkan/libggml-rpc.so): scripts/setup copies its "
           "sources into the prebuilt prefix; run it again";
  }
  auto devices = QueryRunnerDevices({kVulkanRunner}, kLavapipe);
  if (!devices.ok()) return absl::StrCat("the vulkan runner cannot list devices: ", devices.status().message());
  auto accelerator = AcceleratorFromDevices(*devices);
  if (!accelerator || accelerator->kind != "vulkan") {
    return "no Vulkan device on this machine (apt-get install mesa-vulkan-drivers gives Mesa's lavapipe)";
  }
  return "";
}

// A mixed gang (issue 41, point 3): one executor whose runner drives a Vulkan device (lavapipe)
// and one CPU executor. The Vulkan executor declares the most memory (its device's), so it leads:
// its runner keeps its share of the layers in the device's buffers and sends the rest to the CPU
// member's rpc-server through its tunnel, the member's gate and the attempt's secret. The job
// completes, every record once, and its greedy text agrees with one CPU machine's within the
// bound docs/runner-protocol.md ("Backends") documents for the Vulkan device.
TEST_F(GangEndToEnd, AGangOfAVulkanAndACpuExecutorRunsAJobAcrossBothDevices) {
  if (std::string why = WhyNoVulkanGang(); !why.empty()) GTEST_SKIP() << why;
  ProcessPool& pool = NewPool("gang-vulkan", 6000);
  ASSERT_TRUE(pool.StartServer().ok());
  // lavapipe compiles ggml's shaders on first use (minutes on a busy machine): the runner starts
  // with the Mesa shader cache the user's earlier runs filled, and may be silent that long.
  if (const char* home = std::getenv("HOME")) {
    std::error_code ec;
    std::filesystem::create_directories(pool.dir() + "/vk/runner-scratch/.cache", ec);
    std::filesystem::copy(std::string(home) + "/.cache/mesa_shader_cache",
                          pool.dir() + "/vk/runner-scratch/.cache/mesa_shader_cache",
                          std::filesystem::copy_options::recursive, ec);
  }
  ASSERT_TRUE(pool.StartExecutor("vk", 2, kVulkanRunner, "",
                                 {"--gang-address", absl::StrCat("127.0.0.1:", PickFreePort()), "--runner-hang-ms",
                                  "1800000"},
                                 kLavapipe)
                  .ok());
  cli::JobsClient client(pool.connection());
  // name -> what the server knows of it, once `n` executors registered.
  auto fleet_of = [&](size_t n) {
    std::map<std::string, v1::Executor> fleet;
    for (int i = 0; i < 3000 && fleet.size() < n; ++i) {  // the vulkan runner lists its devices first
      auto executors = client.Executors();
      if (executors.ok() && executors->size() == n) {
        for (const v1::Executor& e : *executors) fleet[e.name()] = e;
      } else {
        absl::SleepFor(absl::Milliseconds(100));
      }
    }
    return fleet;
  };
  const int64_t device = fleet_of(1)["vk"].usable_memory_bytes();
  ASSERT_GT(device, 0) << "the Vulkan executor did not register; logs in " << pool.dir() << "/logs";
  // The CPU executor lends 70% of what the device has (a share of this machine's memory): less,
  // so the Vulkan executor leads, and enough that the member gets layers of its own.
  const double share = 0.7 * static_cast<double>(device) /
                       (static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE)));
  ASSERT_LT(share, 1.0) << "this machine has less memory than its Vulkan device";
  ASSERT_TRUE(pool.StartExecutor("cpu", 1, "", "",
                                 {"--gang-address", absl::StrCat("127.0.0.1:", PickFreePort()), "--availability-set",
                                  absl::StrCat("max_memory_share=", share)})
                  .ok());
  std::map<std::string, v1::Executor> fleet = fleet_of(2);
  ASSERT_EQ(fleet.size(), 2u) << "the two executors did not register; logs in " << pool.dir() << "/logs";
  ASSERT_EQ(fleet["vk"].accelerator(), "vulkan");
  ASSERT_NE(fleet["cpu"].accelerator(), "vulkan");
  ASSERT_GT(fleet["vk"].usable_memory_bytes(), fleet["cpu"].usable_memory_bytes());

  const std::vector<std::string> lines = GreedyLines(16);
  const std::string input = WriteInput(dir_, lines);
  auto job = SubmitGang(pool, input, 2, fleet["vk"].usable_memory_bytes() + 1, 16);  // one task, neither alone
  ASSERT_TRUE(job.ok()) << job.status();
  v1::Job done = WaitForEnd(pool, job->id(), absl::Minutes(10));
  ASSERT_EQ(done.state(), "completed") << done.error() << "; logs in " << pool.dir() << "/logs";
  auto output = Lines(FetchResults(pool, job->id(), false));
  auto errors = Lines(FetchResults(pool, job->id(), true));
  ExpectEachRecordOnce(lines, output, errors);
  EXPECT_TRUE(errors.empty()) << errors.size() << " error records, the first: " << errors[0].dump();

  // Both devices held the model: the leader's runner put layers in the Vulkan device's buffers
  // and in its member's (llama.cpp's own account, as the leader's executor logs it), and the
  // member served the leader.
  const std::string leader_log = ReadFile(pool.dir() + "/logs/executor-vk.log");
  EXPECT_THAT(leader_log, ::testing::ContainsRegex("runner loaded .*\"Vulkan0\":[1-9]"))
      << "see " << pool.dir() << "/logs/executor-vk.log";
  EXPECT_THAT(leader_log, ::testing::ContainsRegex("runner loaded .*\"RPC0[^\"]*\":[1-9]"))
      << "see " << pool.dir() << "/logs/executor-vk.log";
  const std::string member_log = ReadFile(pool.dir() + "/logs/executor-cpu.log");
  EXPECT_THAT(member_log, ::testing::HasSubstr("serving the gang of leader 127.0.0.1"));
  EXPECT_THAT(ReadFile(pool.dir() + "/logs/server.log"), ::testing::HasSubstr("leased to a gang of 2"));

  // Against one CPU machine: the Vulkan device's kernels round differently, so the measured
  // agreement (printed) is held to the documented bound, half the records' greedy text.
  RunLocally(input, dir_, 4, 1);
  if (HasFatalFailure()) return;
  std::map<std::string, std::string> local;
  for (const Json& line : Lines(ReadFile(dir_ + "/local.jsonl"))) {
    local[line["custom_id"].get<std::string>()] = Normalised(line)["response"]["body"]["choices"].dump();
  }
  int same = 0;
  for (const Json& line : output) {
    same += local[line["custom_id"].get<std::string>()] == Normalised(line)["response"]["body"]["choices"].dump();
  }
  printf("mixed gang (vulkan leader + cpu member) vs one cpu machine, greedy: %d of %zu records identical\n", same,
         lines.size());
  EXPECT_GE(same * 2, static_cast<int>(lines.size())) << "fewer than half the records gave the CPU's greedy text";
}

}  // namespace
}  // namespace minions::testing
