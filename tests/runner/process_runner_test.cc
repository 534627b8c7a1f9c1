// ProcessRunner and RunnerProcess against real runner programs: the project's no-op runner and
// the Python example, both of which read one command and answer it before reading the next.
// Waits are for real processes, bounded only to fail a broken build instead of hanging it.

#include "runner/process_runner.h"

#include <signal.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "runner/runner_process.h"

namespace minions {
namespace {

using ::testing::HasSubstr;
using runner_protocol::Event;

const std::string kNoop = std::string(MINIONS_TEST_BIN_DIR) + "/minions-noop-runner";
const std::string kEcho = std::string(MINIONS_TEST_SOURCE_DIR) + "/examples/echo_runner.py";

// Records whose answers are far larger than a pipe's buffer (64 KiB on Linux).
std::vector<std::string> Records(int n, const std::string& prompt = "a prompt of some length to make lines longer") {
  std::vector<std::string> records;
  for (int i = 0; i < n; ++i) records.push_back(absl::StrCat("{\"custom_id\":\"r", i, "\",\"prompt\":\"", prompt, "\"}"));
  return records;
}

// A ProcessRunner and the means to wait for what it says.
class Driven {
 public:
  explicit Driven(std::vector<std::string> command, std::vector<std::string> env = {}) {
    ProcessRunner::Options options;
    options.command = std::move(command);
    options.environment = std::move(env);
    auto runner = ProcessRunner::Start(options, [this] {
      absl::MutexLock lock(&mu_);
      ++arrivals_;
    });
    EXPECT_TRUE(runner.ok()) << runner.status();
    if (runner.ok()) runner_ = std::move(*runner);
  }

  // The next event; the runner's end as an error; DeadlineExceeded when nothing came in `limit`.
  absl::StatusOr<Event> Next(absl::Duration limit = absl::Seconds(60)) {
    const absl::Time deadline = absl::Now() + limit;
    while (true) {
      uint64_t seen;
      {
        absl::MutexLock lock(&mu_);
        seen = arrivals_;
      }
      auto event = runner_->Poll();
      if (!event.ok()) return event.status();
      if (*event) return std::move(**event);
      absl::MutexLock lock(&mu_);
      auto arrived = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return arrivals_ != seen; };
      if (!mu_.AwaitWithDeadline(absl::Condition(&arrived), deadline)) {
        return absl::DeadlineExceededError("nothing from the runner");
      }
    }
  }

  ProcessRunner& operator*() { return *runner_; }
  ProcessRunner* operator->() { return runner_.get(); }
  void Reset() { runner_.reset(); }

 private:
  absl::Mutex mu_;
  uint64_t arrivals_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<ProcessRunner> runner_;
};

// Sends `batches` batches of `per_batch` records at once, reading nothing in between, then takes
// every answer: each record's result once and each batch's end.
void FeedEverythingThenRead(Driven& runner, int batches, int per_batch) {
  auto ready = runner.Next();
  ASSERT_TRUE(ready.ok()) << ready.status();
  ASSERT_EQ(ready->type, Event::Type::kReady);
  runner->Load({"none", {}});
  for (int b = 0; b < batches; ++b) runner->StartBatch(absl::StrCat("b", b), Records(per_batch));
  std::vector<std::vector<int>> results(batches, std::vector<int>(per_batch, 0));
  int done = 0, loaded = 0;
  while (done < batches) {
    auto event = runner.Next();
    ASSERT_TRUE(event.ok()) << event.status() << " after " << done << " batches";
    if (event->type == Event::Type::kLoaded) ++loaded;
    if (event->type == Event::Type::kResult) ++results.at(std::stoi(event->batch.substr(1))).at(event->index);
    if (event->type == Event::Type::kBatchDone) {
      EXPECT_EQ(event->batch, absl::StrCat("b", done)) << "batches are served in order";
      ++done;
    }
  }
  EXPECT_EQ(loaded, 1);
  for (int b = 0; b < batches; ++b) {
    for (int i = 0; i < per_batch; ++i) ASSERT_EQ(results[b][i], 1) << "batch " << b << " record " << i;
  }
}

TEST(ProcessRunner, AOneLineAtATimeRunnerTakesBatchesFarLargerThanAPipe) {
  // 8 batches of 5,000: each batch's command is ~400 KB and its answers ~1.5 MB. The runner
  // writes the answers of one batch before it reads the next: a caller that wrote the next batch
  // before reading would wait for ever on a runner waiting for it.
  Driven runner({kNoop});
  FeedEverythingThenRead(runner, 8, 5000);
}

TEST(ProcessRunner, ThePythonExampleRunnerToo) {
  Driven runner({"python3", kEcho});
  FeedEverythingThenRead(runner, 4, 5000);
}

TEST(ProcessRunner, ARunnerThatStopsAnsweringIsSilentAliveAndCanBeKilled) {
  Driven runner({kNoop}, {"MINIONS_NOOP_STALL_ON=stall-me"});
  ASSERT_TRUE(runner.Next().ok());
  std::vector<std::string> records = Records(10);
  records[6] = R"({"custom_id":"r6","prompt":"stall-me"})";
  runner->StartBatch("b", records);
  runner->StartBatch("c", Records(10000));  // queued behind a runner that reads nothing more
  for (int i = 0; i < 6; ++i) {
    auto event = runner.Next();
    ASSERT_TRUE(event.ok()) << event.status();
    EXPECT_EQ(event->index, static_cast<size_t>(i));
  }
  auto silence = runner.Next(absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(silence.status())) << "it says nothing more, and it is not dead";
  runner->Kill();
  auto end = runner.Next();
  ASSERT_FALSE(end.ok());
  EXPECT_TRUE(absl::IsUnavailable(end.status())) << end.status();
  EXPECT_THAT(std::string(end.status().message()), HasSubstr("killed by signal 9"));
  ASSERT_TRUE(runner->exit_info().has_value());
  EXPECT_EQ(runner->exit_info()->signal, SIGKILL);
}

TEST(ProcessRunner, ACrashEndsItAfterEveryAnswerItGaveIsTaken) {
  Driven runner({kNoop}, {"MINIONS_NOOP_CRASH_ON=poison"});
  ASSERT_TRUE(runner.Next().ok());
  std::vector<std::string> records = Records(5);
  records[3] = R"({"custom_id":"r3","prompt":"poison"})";
  runner->StartBatch("b", records);
  for (int i = 0; i < 3; ++i) {
    auto event = runner.Next();
    ASSERT_TRUE(event.ok()) << event.status();
    EXPECT_EQ(event->type, Event::Type::kResult);
  }
  auto end = runner.Next();
  ASSERT_FALSE(end.ok());
  EXPECT_THAT(std::string(end.status().message()), HasSubstr("killed by signal 6"));
  EXPECT_FALSE(runner->Poll().ok()) << "its end stays said";
}

TEST(ProcessRunner, AProgramThatDoesNotSpeakTheProtocolIsRefused) {
  Driven runner({"sh", "-c", "echo hello; sleep 600"});
  auto end = runner.Next();
  ASSERT_FALSE(end.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(end.status())) << end.status();
  EXPECT_THAT(std::string(end.status().message()), HasSubstr("does not speak the runner protocol"));
  EXPECT_THAT(std::string(end.status().message()), HasSubstr("hello"));
}

TEST(ProcessRunner, EndingARunnerEndsWhatItStartedAndNeverWaitsForIt) {
  // The runner leaves a child holding its output open. Ending the runner ends the child too (its
  // process group), so the reader sees the end at once instead of when the child exits.
  const std::string dir = ::testing::TempDir();
  const std::string pid_file = dir + "/runner-child.pid";
  std::filesystem::remove(pid_file);
  Driven runner({"sh", "-c", absl::StrCat("sleep 600 & echo $! > ", pid_file, "; exec ", kNoop)});
  ASSERT_TRUE(runner.Next().ok());
  std::ifstream in(pid_file);
  pid_t child = 0;
  in >> child;
  ASSERT_GT(child, 0);
  runner->Kill();
  auto end = runner.Next();
  EXPECT_FALSE(end.ok()) << "the end came although the child held the pipe";
  runner.Reset();
}

TEST(RunnerProcess, ShutsDownARunnerThatExitsAndKillsOneThatDoesNot) {
  RunnerProcess::Options options;
  options.command = {kNoop};
  auto polite = RunnerProcess::Start(options);
  ASSERT_TRUE(polite.ok()) << polite.status();
  ExitInfo exit = (*polite)->Shutdown(absl::Seconds(30));
  EXPECT_TRUE(exit.exited);
  EXPECT_EQ(exit.code, 0);

  // `sh` answers ready, then ignores everything.
  options.command = {"sh", "-c", R"(echo '{"type":"ready","protocol":1}'; trap '' TERM; while true; do sleep 1; done)"};
  auto stubborn = RunnerProcess::Start(options);
  ASSERT_TRUE(stubborn.ok()) << stubborn.status();
  exit = (*stubborn)->Shutdown(absl::Milliseconds(200));
  EXPECT_FALSE(exit.exited);
  EXPECT_EQ(exit.signal, SIGKILL);
}

TEST(RunnerProcess, RunsBatchesOneCallAtATime) {
  RunnerProcess::Options options;
  options.command = {kNoop};
  auto runner = RunnerProcess::Start(options);
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ(JsonString((*runner)->ready_info(), "runner"), "noop");
  ASSERT_TRUE((*runner)->Load({"none", {}}).ok());
  int results = 0;
  auto done = (*runner)->RunBatch("b", Records(20000), [&](size_t, const Json&) { ++results; });
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(results, 20000);
  EXPECT_EQ(JsonInt(*done, "records"), 20000);
}

}  // namespace
}  // namespace minions
