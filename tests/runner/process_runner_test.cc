// ProcessRunner, through RunnerProcess, against real runner programs: the project's no-op runner
// and the Python example, both of which read one command and answer it before reading the next.
// Waits are for real processes, bounded only to fail a broken build instead of hanging it.

#include "runner/process_runner.h"

#include <signal.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "runner/runner_process.h"

namespace minions {
namespace {

using ::testing::HasSubstr;
using runner_protocol::Event;

const std::string kNoop = std::string(MINIONS_TEST_BIN_DIR) + "/minions-noop-runner";
const std::string kEcho = std::string(MINIONS_TEST_SOURCE_DIR) + "/examples/echo_runner.py";

// Records whose lines make the commands and the answers long.
std::vector<std::string> Records(int n, const std::string& prompt = "a prompt of some length to make lines longer") {
  std::vector<std::string> records;
  for (int i = 0; i < n; ++i) records.push_back(absl::StrCat("{\"custom_id\":\"r", i, "\",\"prompt\":\"", prompt, "\"}"));
  return records;
}

std::unique_ptr<RunnerProcess> Start(std::vector<std::string> command, std::vector<std::string> env = {}) {
  RunnerProcess::Options options;
  options.command = std::move(command);
  options.environment = std::move(env);
  auto runner = RunnerProcess::Start(options);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? std::move(*runner) : nullptr;
}

// Sends `batches` batches of `per_batch` records at once, reading nothing in between, then takes
// every answer: each record's result once and each batch's end, in order.
void FeedEverythingThenRead(RunnerProcess& runner, int batches, int per_batch) {
  ASSERT_TRUE(runner.Load({"none", {}}).ok());
  for (int b = 0; b < batches; ++b) ASSERT_TRUE(runner.StartBatch(absl::StrCat("b", b), Records(per_batch)).ok());
  std::vector<std::vector<int>> results(batches, std::vector<int>(per_batch, 0));
  int done = 0;
  while (done < batches) {
    auto event = runner.NextEvent(absl::Seconds(60));
    ASSERT_TRUE(event.ok()) << event.status() << " after " << done << " batches";
    if (event->type == Event::Type::kResult) ++results.at(std::stoi(event->batch.substr(1))).at(event->index);
    if (event->type == Event::Type::kBatchDone) {
      EXPECT_EQ(event->batch, absl::StrCat("b", done)) << "batches are served in order";
      ++done;
    }
  }
  for (int b = 0; b < batches; ++b) {
    for (int i = 0; i < per_batch; ++i) ASSERT_EQ(results[b][i], 1) << "batch " << b << " record " << i;
  }
}

TEST(ProcessRunner, AOneLineAtATimeRunnerTakesBatchesFarLargerThanAPipe) {
  // 8 batches of 5,000: each batch's command is ~400 KB and its answers ~1.5 MB, where a pipe holds
  // 64 KiB. The runner writes the answers of one batch before it reads the next: a caller that
  // wrote the next batch before reading (as the executor did) waits for ever on a runner waiting
  // for it.
  auto runner = Start({kNoop});
  ASSERT_TRUE(runner);
  FeedEverythingThenRead(*runner, 8, 5000);
}

TEST(ProcessRunner, ThePythonExampleRunnerToo) {
  auto runner = Start({"python3", kEcho});
  ASSERT_TRUE(runner);
  FeedEverythingThenRead(*runner, 4, 5000);
}

TEST(ProcessRunner, ARunnerThatStopsAnsweringIsSilentAliveAndCanBeKilled) {
  auto runner = Start({kNoop}, {"MINIONS_NOOP_STALL_ON=stall-me"});
  ASSERT_TRUE(runner);
  std::vector<std::string> records = Records(10);
  records[6] = R"({"custom_id":"r6","prompt":"stall-me"})";
  ASSERT_TRUE(runner->StartBatch("b", records).ok());
  ASSERT_TRUE(runner->StartBatch("c", Records(10000)).ok());  // queued behind a runner that reads nothing more
  for (int i = 0; i < 6; ++i) {
    auto event = runner->NextEvent(absl::Seconds(60));
    ASSERT_TRUE(event.ok()) << event.status();
    EXPECT_EQ(event->index, static_cast<size_t>(i));
  }
  auto silence = runner->NextEvent(absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(silence.status())) << "it says nothing more, and it is not dead";
  runner->runner().Kill();
  auto end = runner->NextEvent(absl::Seconds(60));
  ASSERT_FALSE(end.ok());
  EXPECT_TRUE(absl::IsUnavailable(end.status())) << end.status();
  EXPECT_THAT(std::string(end.status().message()), HasSubstr("killed by signal 9"));
  ASSERT_TRUE(runner->runner().exit_info().has_value());
  EXPECT_EQ(runner->runner().exit_info()->signal, SIGKILL);
}

TEST(ProcessRunner, ACrashEndsItAfterEveryAnswerItGaveIsTaken) {
  auto runner = Start({kNoop}, {"MINIONS_NOOP_CRASH_ON=poison"});
  ASSERT_TRUE(runner);
  std::vector<std::string> records = Records(5);
  records[3] = R"({"custom_id":"r3","prompt":"poison"})";
  ASSERT_TRUE(runner->StartBatch("b", records).ok());
  for (int i = 0; i < 3; ++i) {
    auto event = runner->NextEvent(absl::Seconds(60));
    ASSERT_TRUE(event.ok()) << event.status();
    EXPECT_EQ(event->type, Event::Type::kResult);
  }
  auto end = runner->NextEvent(absl::Seconds(60));
  ASSERT_FALSE(end.ok());
  EXPECT_THAT(std::string(end.status().message()), HasSubstr("killed by signal 6"));
  EXPECT_FALSE(runner->runner().Poll().ok()) << "its end stays said";
}

TEST(ProcessRunner, AProgramThatDoesNotSpeakTheProtocolIsRefused) {
  RunnerProcess::Options options;
  options.command = {"sh", "-c", "echo hello; sleep 600"};
  auto runner = RunnerProcess::Start(options);
  ASSERT_FALSE(runner.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(runner.status())) << runner.status();
  EXPECT_THAT(std::string(runner.status().message()), HasSubstr("does not speak the runner protocol"));
  EXPECT_THAT(std::string(runner.status().message()), HasSubstr("hello"));
}

TEST(ProcessRunner, EndingARunnerEndsWhatItStartedAndNeverWaitsForIt) {
  // The runner leaves a child holding its output open. Ending the runner ends the child too (its
  // process group), so its end is seen at once instead of when the child exits in ten minutes.
  const std::string pid_file = ::testing::TempDir() + "/runner-child.pid";
  std::filesystem::remove(pid_file);
  auto runner = Start({"sh", "-c", absl::StrCat("sleep 600 & echo $! > ", pid_file, "; exec ", kNoop)});
  ASSERT_TRUE(runner);
  pid_t child = 0;
  std::ifstream(pid_file) >> child;
  ASSERT_GT(child, 0);
  runner->runner().Kill();
  EXPECT_FALSE(runner->NextEvent(absl::Seconds(60)).ok());
}

TEST(RunnerProcess, ShutsDownARunnerThatExitsAndKillsOneThatDoesNot) {
  auto polite = Start({kNoop});
  ASSERT_TRUE(polite);
  ExitInfo exit = polite->Shutdown(absl::Seconds(30));
  EXPECT_TRUE(exit.exited);
  EXPECT_EQ(exit.code, 0);

  // It answers ready, then ignores everything.
  auto stubborn = Start({"sh", "-c", R"(echo '{"type":"ready","protocol":1}'; trap '' TERM; while true; do sleep 1; done)"});
  ASSERT_TRUE(stubborn);
  exit = stubborn->Shutdown(absl::Milliseconds(200));
  EXPECT_FALSE(exit.exited);
  EXPECT_EQ(exit.signal, SIGKILL);
}

TEST(RunnerProcess, RunsBatchesOneCallAtATime) {
  auto runner = Start({kNoop});
  ASSERT_TRUE(runner);
  EXPECT_EQ(JsonString(runner->ready_info(), "runner"), "noop");
  ASSERT_TRUE(runner->Load({"none", {}}).ok());
  int results = 0;
  auto done = runner->RunBatch("b", Records(20000), [&](size_t, const Json&) { ++results; });
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(results, 20000);
  EXPECT_EQ(JsonInt(*done, "records"), 20000);
}

}  // namespace
}  // namespace minions
