// Attacks that involve real processes: an executor started with another executor's id, secrets
// leaking into a runner's environment, a pool started on a public address without TLS, an
// executor cut off while it works. The no-op runner does the "inference", so these need no model.

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/admin_verbs.h"
#include "common/json_util.h"
#include "testing/must.h"
#include "testing/process_pool.h"
#include "testing/read_file.h"

namespace minions::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kBin = MINIONS_TEST_BIN_DIR;
const std::string kNoop = kBin + "/minions-noop-runner";

std::string TempDir(const std::string& name) {
  return (fs::temp_directory_path() / absl::StrCat("minions-sec-", getpid(), "-", name)).string();
}

// Submits `records` records (the no-op runner answers each) and waits for the job to end.
v1::Job RunJob(ProcessPool& pool, int records, int64_t shard_size, const std::string& model) {
  std::string input;
  for (int i = 0; i < records; ++i) absl::StrAppend(&input, R"({"custom_id":"r)", i, R"(","prompt":"hi"})", "\n");
  v1::SubmitJobRequest request;
  request.set_input(input);
  request.set_model(model);
  request.set_shard_size(shard_size);
  cli::JobsClient client(pool.connection());
  auto job = client.Submit(request);
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return {};
  for (absl::Time deadline = absl::Now() + absl::Minutes(2); absl::Now() < deadline;) {
    auto now = client.Get(job->id());
    if (now.ok() && (now->state() == "completed" || now->state() == "failed")) return *now;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ADD_FAILURE() << "job did not end; logs in " << pool.dir() << "/logs";
  return *job;
}

// The executors the server knows, by name.
std::map<std::string, v1::Executor> Fleet(ProcessPool& pool) {
  std::map<std::string, v1::Executor> fleet;
  auto executors = cli::JobsClient(pool.connection()).Executors();
  if (executors.ok()) {
    for (const auto& e : *executors) fleet[e.name()] = e;
  }
  return fleet;
}

bool WaitForExecutors(ProcessPool& pool, size_t n) {
  for (int i = 0; i < 300; ++i) {
    if (Fleet(pool).size() >= n) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

class ProcessAttack : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    pool_ = std::make_unique<ProcessPool>(kBin + "/minions", dir_, 3000);
    // The model in a folder of its own, the only one the executors may load from.
    fs::create_directories(dir_ + "/models");
    pool_->AllowModels({dir_ + "/models"});
    ASSERT_TRUE(pool_->StartServer().ok());
    model_ = dir_ + "/models/model.gguf";
    std::ofstream(model_) << "the no-op runner reads no model";
  }
  void TearDown() override {
    pool_.reset();
    if (!HasFailure()) fs::remove_all(dir_);
  }
  std::string dir_;
  std::string model_;
  std::unique_ptr<ProcessPool> pool_;
};

TEST_F(ProcessAttack, AnExecutorStartedWithAnotherExecutorsIdIsRefusedAndTheVictimWorksOn) {
  ASSERT_TRUE(pool_->StartExecutor("victim", 1, kNoop).ok());
  ASSERT_TRUE(pool_->StartExecutor("attacker", 1, kNoop).ok());
  ASSERT_TRUE(WaitForExecutors(*pool_, 2));
  const std::string victim_id = Fleet(*pool_)["victim"].id();
  const std::string attacker_id = Fleet(*pool_)["attacker"].id();
  // The attacker copies the victim's id (shown on the dashboard) into its own state and starts
  // again with its own credential.
  ASSERT_TRUE(pool_->StopExecutor("attacker").ok());
  std::ofstream(dir_ + "/attacker/executor-id", std::ios::trunc) << victim_id << "\n";
  ASSERT_TRUE(pool_->StartExecutor("attacker", 1, kNoop).ok());
  auto exit = pool_->executor("attacker").Wait(absl::Minutes(1));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_TRUE(exit->exited && exit->code != 0) << "the impostor was not refused: " << exit->ToString();
  // The victim is as it was and does the whole job; the impostor got nothing.
  v1::Job job = RunJob(*pool_, 40, 4, model_);
  EXPECT_EQ(job.state(), "completed");
  EXPECT_EQ(job.request_counts().completed(), 40);
  auto fleet = Fleet(*pool_);
  EXPECT_EQ(fleet["victim"].id(), victim_id);
  EXPECT_NE(fleet["victim"].state(), "revoked");
  EXPECT_EQ(fleet["attacker"].id(), attacker_id);
  EXPECT_EQ(fleet["attacker"].records_done(), 0);
}

TEST_F(ProcessAttack, NoCredentialReachesTheRunnersEnvironmentAndTheCredentialFileIsPrivate) {
  // The runner: a script that writes its environment down, then is the no-op runner. Both in a
  // folder of their own: the sandbox lets a runner read its program's folder and write only its
  // scratch folder (its HOME), so that is where the environment goes.
  fs::create_directories(dir_ + "/runner");
  fs::copy_file(kNoop, dir_ + "/runner/noop", fs::copy_options::overwrite_existing);
  const std::string runner = dir_ + "/runner/env-runner.sh";
  std::ofstream(runner) << "#!/bin/sh\nenv > \"$HOME/runner-env.txt\"\nexec '" << dir_ << "/runner/noop'\n";
  fs::permissions(runner, fs::perms::owner_all);
  const std::string env_file = dir_ + "/e/runner-scratch/runner-env.txt";
  // This executor is handed its join token and a stray token in its environment.
  auto join = pool_->IssueToken("join", "", "env-test");
  ASSERT_TRUE(join.ok()) << join.status();
  ASSERT_TRUE(pool_
                  ->StartExecutor("e", 1, runner, "", {},
                                  {"MINIONS_JOIN_TOKEN=" + *join, "MINIONS_TOKEN=" + pool_->connection().token})
                  .ok());
  v1::Job job = RunJob(*pool_, 10, 5, model_);
  ASSERT_EQ(job.state(), "completed");
  const std::string env = ReadFile(env_file);
  ASSERT_FALSE(env.empty()) << "the runner did not start";
  EXPECT_EQ(env.find("MINIONS_TOKEN"), std::string::npos);
  EXPECT_EQ(env.find("MINIONS_JOIN_TOKEN"), std::string::npos);
  for (const char* prefix : {"mne_", "mnj_", "mna_"}) EXPECT_EQ(env.find(prefix), std::string::npos) << prefix;
  // The executor's own credential is in its state folder, for its owner's eyes only.
  struct stat st;
  ASSERT_EQ(stat((dir_ + "/e/credential").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  EXPECT_EQ(ReadFile(dir_ + "/e/credential").substr(0, 4), "mne_");
}

TEST_F(ProcessAttack, RevokingAWorkingExecutorCutsItOffAndItsTasksAreDoneElsewhere) {
  ASSERT_TRUE(pool_->StartExecutor("doomed", 1, kNoop, "", {}, {"MINIONS_NOOP_RECORD_DELAY_MS=50"}).ok());
  ASSERT_TRUE(WaitForExecutors(*pool_, 1));
  const std::string doomed = Fleet(*pool_)["doomed"].id();
  std::string input;
  for (int i = 0; i < 60; ++i) absl::StrAppend(&input, R"({"custom_id":"r)", i, R"(","prompt":"hi"})", "\n");
  v1::SubmitJobRequest request;
  request.set_input(input);
  request.set_model(model_);
  request.set_shard_size(10);
  cli::JobsClient client(pool_->connection());
  auto job = client.Submit(request);
  ASSERT_TRUE(job.ok()) << job.status();
  // Once it works on the job, `minions executors revoke` cuts it off.
  for (int i = 0; i < 300 && Fleet(*pool_)["doomed"].current_tasks_size() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_GT(Fleet(*pool_)["doomed"].current_tasks_size(), 0);
  auto revoked = cli::RemoteAdmin(pool_->connection())->RevokeExecutor(doomed);
  ASSERT_TRUE(revoked.ok()) << revoked.status();
  EXPECT_EQ(Fleet(*pool_)["doomed"].state(), "revoked");
  EXPECT_EQ(Fleet(*pool_)["doomed"].current_tasks_size(), 0);
  // 40.7j: its next call refused, the executor stops on its own, its runner with it, and exits
  // with an error (no signal sent; the wait is a bound, not a measurement).
  const std::vector<pid_t> runners = pool_->ExecutorChildren("doomed");
  absl::StatusOr<ExitInfo> exited = pool_->WaitForExecutorExit("doomed", absl::Minutes(1));
  ASSERT_TRUE(exited.ok()) << exited.status() << "; logs in " << dir_ << "/logs";
  EXPECT_TRUE(exited->exited);
  EXPECT_NE(exited->code, 0);
  EXPECT_THAT(ReadFile(dir_ + "/logs/executor-doomed.log"), HasSubstr("refused this executor's credential"));
  for (pid_t runner : runners) {
    for (int i = 0; i < 100 && kill(runner, 0) == 0; ++i) absl::SleepFor(absl::Milliseconds(100));
    EXPECT_NE(kill(runner, 0), 0) << "runner " << runner << " outlived its revoked executor";
  }
  // Another executor finishes the job: every record exactly once, the revoked one never back.
  ASSERT_TRUE(pool_->StartExecutor("rescuer", 1, kNoop).ok());
  for (absl::Time deadline = absl::Now() + absl::Minutes(2); absl::Now() < deadline;) {
    auto now = client.Get(job->id());
    if (now.ok() && now->state() == "completed") break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  auto done = client.Get(job->id());
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(done->state(), "completed");
  std::string output;
  ASSERT_TRUE(client.Results(job->id(), false, [&](const std::string& chunk) { output += chunk; }).ok());
  std::multiset<std::string> ids;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    ids.insert(Must(ParseJson(std::string(line)))["custom_id"].get<std::string>());
  }
  EXPECT_EQ(ids.size(), 60u);
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 60u);
  EXPECT_EQ(Fleet(*pool_)["doomed"].state(), "revoked");
}

TEST(ProcessTls, AWholePoolRunsOverTlsFromItsPrivateCa) {
  const std::string dir = TempDir("tls");
  ProcessPool pool(kBin + "/minions", dir, 3000);
  pool.AllowModels({dir + "/models"});
  ASSERT_TRUE(pool.EnableTls().ok());
  ASSERT_TRUE(pool.StartServer().ok());
  ASSERT_TRUE(pool.connection().tls.enabled());
  // Executors enrol and work over TLS, checking the server against the pool's CA.
  for (const char* name : {"e1", "e2"}) ASSERT_TRUE(pool.StartExecutor(name, 1, kNoop).ok());
  fs::create_directories(dir + "/models");
  std::ofstream(dir + "/models/model.gguf") << "no model";
  v1::Job job = RunJob(pool, 30, 5, dir + "/models/model.gguf");
  EXPECT_EQ(job.state(), "completed");
  EXPECT_EQ(job.request_counts().completed(), 30);
  // The same client without the CA reaches nothing.
  cli::Connection plain = pool.connection();
  plain.tls = {};
  EXPECT_FALSE(cli::JobsClient(plain).List("", 1).ok());
  fs::remove_all(dir);
}

TEST(ProcessAttackUp, APoolOnAPublicAddressWithoutTlsIsRefused) {
  const std::string dir = TempDir("up");
  Subprocess::Options sp;
  sp.argv = {kBin + "/minions", "up", "--listen", "0.0.0.0:0", "--http-listen", "off", "--data-dir", dir,
             "--executors", "0"};
  sp.stderr_path = dir + ".log";
  auto up = Subprocess::Start(sp);
  ASSERT_TRUE(up.ok());
  (*up)->CloseStdin();
  auto exit = (*up)->Wait(absl::Minutes(1));
  ASSERT_TRUE(exit.ok());
  EXPECT_TRUE(exit->exited && exit->code != 0) << exit->ToString();
  // What to do about it is said (the CLI's own words to a person).
  EXPECT_THAT(ReadFile(dir + ".log"), HasSubstr("--tls"));
  // Refused before anything was made: no admin token minted for a pool that never ran.
  EXPECT_FALSE(fs::exists(dir + "/admin-token"));
  fs::remove_all(dir);
  fs::remove(dir + ".log");
}

TEST(ProcessAttackConfig, AConfigErrorNeverPrintsTheDatabasesPassword) {
  // A database string the server cannot use, carrying a password: `minions config check` says
  // what is wrong without the password (issue 40, point 7).
  const std::string command = kBin + "/minions config check --database 'mysql://alice:hunter2@db.example/minions' 2>&1";
  FILE* out = popen(command.c_str(), "r");
  ASSERT_NE(out, nullptr);
  std::string said;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), out)) > 0;) said.append(buffer, n);
  pclose(out);
  EXPECT_THAT(said, HasSubstr("is neither postgresql://"));
  EXPECT_THAT(said, HasSubstr("db.example"));
  EXPECT_EQ(said.find("hunter2"), std::string::npos) << said;
}

}  // namespace
}  // namespace minions::testing
