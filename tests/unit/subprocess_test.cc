#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "testing/process_pool.h"

namespace minions {
namespace {

TEST(Subprocess, EchoesLinesThroughPipes) {
  auto p = Subprocess::Start({{"cat"}, {}, ""});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE((*p)->Write("one\ntwo\n").ok());
  EXPECT_EQ(*(*p)->ReadLine(absl::Seconds(5)), "one");
  EXPECT_EQ(*(*p)->ReadLine(absl::Seconds(5)), "two");
  (*p)->CloseStdin();
  EXPECT_TRUE(absl::IsOutOfRange((*p)->ReadLine(absl::Seconds(5)).status()));
  auto exit = (*p)->Wait(absl::Seconds(5));
  ASSERT_TRUE(exit.ok());
  EXPECT_TRUE(exit->exited);
  EXPECT_EQ(exit->code, 0);
}

// Every line comes back whole and in order, however the reads cut them: many short ones (a runner's
// answers), one longer than many reads (a long answer), and a last one with no newline.
TEST(Subprocess, ReadLineReturnsManyShortLinesALongOneAndAnUnendedLastOne) {
  auto p = Subprocess::Start(
      {{"sh", "-c", "seq 0 199999; head -c 3000000 /dev/zero | tr '\\0' x; echo; echo; printf tail"}, {}, ""});
  ASSERT_TRUE(p.ok()) << p.status();
  for (int i = 0; i < 200000; ++i) {
    absl::StatusOr<std::string> line = (*p)->ReadLine(absl::Seconds(30));
    ASSERT_TRUE(line.ok()) << i << ": " << line.status();
    ASSERT_EQ(*line, absl::StrCat(i));
  }
  absl::StatusOr<std::string> long_line = (*p)->ReadLine(absl::Seconds(30));
  ASSERT_TRUE(long_line.ok()) << long_line.status();
  EXPECT_EQ(long_line->size(), 3000000u);
  EXPECT_EQ(long_line->find_first_not_of('x'), std::string::npos);
  EXPECT_EQ(*(*p)->ReadLine(absl::Seconds(30)), "") << "an empty line is a line";
  EXPECT_EQ(*(*p)->ReadLine(absl::Seconds(30)), "tail");
  EXPECT_TRUE(absl::IsOutOfRange((*p)->ReadLine(absl::Seconds(5)).status()));
  ASSERT_TRUE((*p)->Wait(absl::Seconds(10)).ok());
}

TEST(Subprocess, ReadLineTimesOut) {
  auto p = Subprocess::Start({{"sleep", "5"}, {}, ""});
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded((*p)->ReadLine(absl::Milliseconds(50)).status()));
  (*p)->Signal(SIGKILL);
  auto exit = (*p)->Wait(absl::Seconds(5));
  ASSERT_TRUE(exit.ok());
  EXPECT_FALSE(exit->exited);
  EXPECT_EQ(exit->signal, SIGKILL);
}

TEST(Subprocess, WritingToADeadChildIsAnErrorNotACrash) {
  auto p = Subprocess::Start({{"true"}, {}, ""});
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE((*p)->Wait(absl::Seconds(5)).ok());
  absl::Status s;
  for (int i = 0; i < 100 && s.ok(); ++i) s = (*p)->Write(std::string(65536, 'x'));
  EXPECT_FALSE(s.ok());
}

TEST(Subprocess, MissingProgramIsNotFound) {
  auto p = Subprocess::Start({{"/nonexistent/minions-no-such-program"}, {}, ""});
  EXPECT_TRUE(absl::IsNotFound(p.status())) << p.status();
}

TEST(Subprocess, PassesExtraEnvironment) {
  auto p = Subprocess::Start({{"sh", "-c", "echo $MINIONS_TEST_VALUE"}, {"MINIONS_TEST_VALUE=42"}, ""});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*(*p)->ReadLine(absl::Seconds(5)), "42");
}

// A child starts with descriptors 0-2 only: a descriptor this process holds without close-on-exec
// (one it inherited from the shell that started it, say) never reaches a runner.
TEST(Subprocess, AChildGetsOnlyStdinStdoutAndStderr) {
  int inherited[2];
  ASSERT_EQ(pipe(inherited), 0);  // no O_CLOEXEC: as a descriptor inherited from a shell would be
  const int high = fcntl(inherited[0], F_DUPFD, 200);  // one far above the others, also inheritable
  ASSERT_GE(high, 200);
  // The child (a shell) says which of its descriptors are open: stderr, then the three above.
  const std::string script = absl::StrCat("for fd in 2 ", inherited[0], " ", inherited[1], " ", high,
                                          "; do if [ -e /proc/$$/fd/$fd ]; then printf 'open '; "
                                          "else printf 'closed '; fi; done; echo");
  auto p = Subprocess::Start({{"sh", "-c", script}, {}, ""});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*(*p)->ReadLine(absl::Seconds(5)), "open closed closed closed ");
  EXPECT_TRUE((*p)->Wait(absl::Seconds(5)).ok());
  close(inherited[0]);
  close(inherited[1]);
  close(high);
}

// An executor SIGKILLed (here: a process that started a child through Subprocess, as an executor
// starts its runner or a gang member its rpc-server) takes its child with it: a child that reads
// no stdin (sleep, like rpc-server) would otherwise run on as an orphan.
TEST(Subprocess, AChildDiesWhenTheProcessThatStartedItIsKilled) {
  auto parent = Subprocess::Start({{MINIONS_TEST_SPAWNING_PARENT, "sleep", "600"}, {}, ""});
  ASSERT_TRUE(parent.ok()) << parent.status();
  auto line = (*parent)->ReadLine(absl::Minutes(1));
  ASSERT_TRUE(line.ok()) << line.status();
  const pid_t child = std::stoi(*line);
  const std::string started = testing::LiveProcessStart(child);
  ASSERT_FALSE(started.empty()) << "the child " << child << " is not running";

  (*parent)->Signal(SIGKILL);
  auto exit = (*parent)->Wait(absl::Minutes(1));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->signal, SIGKILL);
  const bool gone = testing::WaitUntilDead(child, started, absl::Minutes(1));
  if (!gone) ::kill(child, SIGKILL);  // not left behind by a failing test
  EXPECT_TRUE(gone) << "the child " << child << " outlived the process that started it";
}

// A child started in a process group of its own runs `sleep 600` in the background and writes
// its pid to a file of `dir` named after the child's own pid; this reads it.
std::vector<std::string> GrandchildCommand(const std::filesystem::path& dir) {
  return {MINIONS_TEST_SPAWNING_PARENT, "sh", "-c",
          absl::StrCat("sleep 600 & echo $! > ", dir.string(), "/$$.tmp && mv ", dir.string(), "/$$.tmp ",
                       dir.string(), "/$$; wait")};
}

// Waits (on progress; at most a minute) until `file` exists.
bool WaitForFile(const std::filesystem::path& file) {
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (!std::filesystem::exists(file) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  return std::filesystem::exists(file);
}

pid_t GrandchildOf(const std::filesystem::path& dir, pid_t child) {
  const std::filesystem::path file = dir / std::to_string(child);
  WaitForFile(file);
  std::ifstream in(file);
  int pid = 0;
  in >> pid;
  return pid;
}

std::filesystem::path FreshDir(const std::string& name) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / absl::StrCat(name, "-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The spawning parent's line for a child it started: {CHILD_PID, LIFELINE_PID}.
void ReadStarted(Subprocess& parent, std::vector<std::string>* pids) {
  auto line = parent.ReadLine(absl::Minutes(1));
  ASSERT_TRUE(line.ok()) << line.status();
  *pids = absl::StrSplit(*line, ' ');
  ASSERT_EQ(pids->size(), 2u) << *line;
}

// A process started with GrandchildCommand in a fresh folder, and the pids its first child said.
struct Grandparent {
  std::filesystem::path dir;
  std::unique_ptr<Subprocess> process;
  std::vector<std::string> pids;  // ReadStarted's
};

// Starts `g` in FreshDir(name).
void StartGrandparent(const std::string& name, Grandparent* g) {
  g->dir = FreshDir(name);
  auto started = Subprocess::Start({GrandchildCommand(g->dir), {}, ""});
  ASSERT_TRUE(started.ok()) << started.status();
  g->process = std::move(*started);
  ReadStarted(*g->process, &g->pids);
}

// What a child started in turn (in the child's process group) dies too: the lifeline kills the
// group. A parent-death signal would not reach it (it is not inherited), and macOS has none.
TEST(Subprocess, WhatAChildStartedDiesWhenTheProcessThatStartedItIsKilled) {
  Grandparent g;
  ASSERT_NO_FATAL_FAILURE(StartGrandparent("minions-lifeline", &g));
  auto& [dir, parent, pids] = g;
  const pid_t grandchild = GrandchildOf(dir, std::stoi(pids[0]));
  ASSERT_GT(grandchild, 0);
  const std::string started = testing::LiveProcessStart(grandchild);
  ASSERT_FALSE(started.empty()) << "the grandchild " << grandchild << " is not running";
  // The helper holds nothing of its process but its end of the lifeline (a listening socket or
  // the process's stdout would otherwise stay open after it died), and a ^C to the process's
  // group does not reach it.
  const pid_t helper = std::stoi(pids[1]);
  ASSERT_GT(helper, 0);
  // It closes what it inherited just after the fork, after naming itself and taking its group:
  // wait for that (progress, not time).
  auto descriptors = [helper] {
    int count = 0;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(absl::StrCat("/proc/", helper, "/fd"), ec)) {
      (void)entry;
      ++count;
    }
    return count;
  };
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (descriptors() != 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(descriptors(), 1);
  EXPECT_EQ(getpgid(helper), helper);
  std::string comm;
  std::getline(std::ifstream(absl::StrCat("/proc/", helper, "/comm")), comm);
  EXPECT_EQ(comm, Subprocess::kLifelineName);

  parent->Signal(SIGKILL);
  ASSERT_TRUE(parent->Wait(absl::Minutes(1)).ok());
  const bool gone = testing::WaitUntilDead(grandchild, started, absl::Minutes(1));
  if (!gone) ::kill(grandchild, SIGKILL);  // not left behind by a failing test
  EXPECT_TRUE(gone) << "the grandchild " << grandchild << " outlived the process that started its parent";
  std::filesystem::remove_all(dir);
}

// A child may ask for another death signal than SIGKILL (a pool's executors stop their runners
// on SIGTERM): it gets that one when the process that started it dies.
TEST(Subprocess, AChildGetsTheDeathSignalItAskedForWhenTheProcessThatStartedItIsKilled) {
  const auto dir = FreshDir("minions-lifeline-term");
  const std::string d = dir.string();
  auto parent = Subprocess::Start(
      {{MINIONS_TEST_SPAWNING_PARENT, "sh", "-c",
        absl::StrCat("trap 'echo term > ", d, "/$$.term; exit 0' TERM; echo ready > ", d,
                     "/$$; while true; do sleep 0.05; done")},
       {absl::StrCat("MINIONS_TEST_DEATH_SIGNAL=", SIGTERM)},
       ""});
  ASSERT_TRUE(parent.ok()) << parent.status();
  auto line = (*parent)->ReadLine(absl::Minutes(1));
  ASSERT_TRUE(line.ok()) << line.status();
  const pid_t child = std::stoi(*line);
  ASSERT_TRUE(WaitForFile(dir / std::to_string(child))) << "the child never set its trap";
  (*parent)->Signal(SIGKILL);
  ASSERT_TRUE((*parent)->Wait(absl::Minutes(1)).ok());
  EXPECT_TRUE(WaitForFile(dir / absl::StrCat(child, ".term"))) << "the child never got SIGTERM";
  ::kill(child, SIGKILL);  // not left behind by a failing test
  std::filesystem::remove_all(dir);
}

// A lifeline helper that someone killed is replaced at the next start, and the new one is told
// of every child still alive, not only the new one.
TEST(Subprocess, AKilledLifelineIsReplacedAndToldOfEveryChildStillAlive) {
  Grandparent g;
  ASSERT_NO_FATAL_FAILURE(StartGrandparent("minions-lifeline-again", &g));
  auto& [dir, parent, first_pids] = g;
  const pid_t first_helper = std::stoi(first_pids[1]);
  const std::string first_helper_started = testing::LiveProcessStart(first_helper);
  ASSERT_FALSE(first_helper_started.empty());
  ::kill(first_helper, SIGKILL);
  ASSERT_TRUE(testing::WaitUntilDead(first_helper, first_helper_started, absl::Minutes(1)));

  ASSERT_TRUE(parent->Write("again\n").ok());
  std::vector<std::string> second_pids;
  ReadStarted(*parent, &second_pids);
  if (HasFatalFailure()) return;
  EXPECT_NE(std::stoi(second_pids[1]), first_helper);
  EXPECT_GT(std::stoi(second_pids[1]), 0);

  std::vector<std::pair<pid_t, std::string>> grandchildren;
  for (const auto& pids : {first_pids, second_pids}) {
    const pid_t grandchild = GrandchildOf(dir, std::stoi(pids[0]));
    ASSERT_GT(grandchild, 0);
    grandchildren.emplace_back(grandchild, testing::LiveProcessStart(grandchild));
    ASSERT_FALSE(grandchildren.back().second.empty());
  }
  parent->Signal(SIGKILL);
  ASSERT_TRUE(parent->Wait(absl::Minutes(1)).ok());
  for (const auto& [grandchild, started] : grandchildren) {
    const bool gone = testing::WaitUntilDead(grandchild, started, absl::Minutes(1));
    if (!gone) ::kill(grandchild, SIGKILL);
    EXPECT_TRUE(gone) << "the grandchild " << grandchild << " outlived the process that started its parent";
  }
  std::filesystem::remove_all(dir);
}

// The parent-death signal follows the thread that forked the child, not the process: a child
// started from a thread that has ended since (a task's worker, a test's thread) must live on as
// long as the process that started it.
TEST(Subprocess, AChildStartedFromAThreadThatHasEndedLivesOn) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p = absl::UnknownError("not started");
  pid_t thread_id = 0;
  std::thread starter([&] {
    thread_id = static_cast<pid_t>(::syscall(SYS_gettid));
    p = Subprocess::Start({{"cat"}, {}, ""});
  });
  starter.join();
  ASSERT_TRUE(p.ok()) << p.status();
  // Gone from the process's threads: whatever its exit signals to its children has been sent.
  const std::string task = absl::StrCat("/proc/self/task/", thread_id);
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (std::filesystem::exists(task) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_FALSE(std::filesystem::exists(task)) << "the thread that started the child never ended";
  ASSERT_TRUE((*p)->Write("still here\n").ok());
  auto echoed = (*p)->ReadLine(absl::Minutes(1));
  ASSERT_TRUE(echoed.ok()) << echoed.status() << ": the child died with the thread that started it";
  EXPECT_EQ(*echoed, "still here");
}

TEST(Subprocess, AStderrFileThatCannotBeOpenedIsAnError) {
  auto p = Subprocess::Start({{"true"}, {}, "/nonexistent/minions-no-such-folder/stderr.log"});
  EXPECT_FALSE(p.ok());
}

TEST(Subprocess, FindsAProgramByNameOnThePath) {
  auto p = Subprocess::Start({{"sh", "-c", "echo found"}, {}, ""});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*(*p)->ReadLine(absl::Seconds(5)), "found");
  auto missing = Subprocess::Start({{"minions-no-such-program-anywhere"}, {}, ""});
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
}

}  // namespace
}  // namespace minions
