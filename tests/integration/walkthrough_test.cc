// The first hour, run as a user would (issue 39, point 9): `minions up` starts a pool, a batch
// is submitted, watched in a pseudo-terminal of 80 columns, its results fetched; another is
// cancelled part-way and its results still come; a wrong model path is refused at once. What the
// user reads is checked: every line fits 80 columns, and each screen says what the next needs.

#include <fcntl.h>
#ifdef __APPLE__
#include <util.h>
#else
#include <pty.h>
#endif
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/sample_prompts.h"
#include "common/subprocess.h"
#include "testing/process_pool.h"

namespace minions::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kMinions = std::string(MINIONS_TEST_BIN_DIR) + "/minions";
const std::string kModels = MINIONS_TEST_MODELS_DIR;

// What a command printed (stdout and stderr together) and how it exited.
struct Said {
  int code = -1;
  std::string text;
};

// Runs `minions ARGS` with MINIONS_HOME=home (the pool's admin token is found there), as a shell
// would, in a pipe.
Said Minions(const std::string& home, const std::vector<std::string>& args) {
  std::string command = "MINIONS_HOME='" + home + "' '" + kMinions + "'";
  for (const std::string& a : args) command += " '" + a + "'";
  command += " 2>&1";
  Said said;
  FILE* out = popen(command.c_str(), "r");
  if (out == nullptr) return said;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), out)) > 0;) said.text.append(buffer, n);
  int status = pclose(out);
  said.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return said;
}

// Runs `minions ARGS` in a pseudo-terminal of 80 columns, as a person's terminal; answers what it
// drew. Gives up (and kills it) after `patience`.
Said RunInTerminal(const std::string& home, const std::vector<std::string>& args, absl::Duration patience) {
  Said said;
  struct winsize size = {};
  size.ws_col = 80;
  size.ws_row = 24;
  int master = -1;
  pid_t pid = forkpty(&master, nullptr, nullptr, &size);
  if (pid < 0) return said;
  if (pid == 0) {
    setenv("MINIONS_HOME", home.c_str(), 1);
    setenv("TERM", "xterm", 1);
    std::vector<char*> argv = {const_cast<char*>(kMinions.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(kMinions.c_str(), argv.data());
    _exit(127);
  }
  fcntl(master, F_SETFL, O_NONBLOCK);
  const absl::Time deadline = absl::Now() + patience;
  int status = 0;
  while (true) {
    char buffer[4096];
    ssize_t n = read(master, buffer, sizeof(buffer));
    if (n > 0) {
      said.text.append(buffer, n);
      continue;
    }
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      said.text += "\n[killed: no end in time]";
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  // What was still in the terminal.
  char buffer[4096];
  for (ssize_t n; (n = read(master, buffer, sizeof(buffer))) > 0;) said.text.append(buffer, n);
  close(master);
  said.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return said;
}

// The lines a terminal shows: split at newlines and carriage returns, escape sequences removed.
std::vector<std::string> ScreenLines(const std::string& text) {
  static const std::regex kEscape("\x1b\\[[0-9;?]*[A-Za-z]");
  std::string plain = std::regex_replace(text, kEscape, "");
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(plain, absl::ByAnyChar("\r\n"))) lines.emplace_back(line);
  return lines;
}

// Every line at most 80 columns (characters, not bytes: progress bars draw in UTF-8).
void ExpectFits80Columns(const std::string& what, const std::string& text) {
  for (const std::string& line : ScreenLines(text)) {
    size_t columns = 0;
    for (unsigned char c : line) columns += (c & 0xC0) != 0x80;
    EXPECT_LE(columns, 80u) << what << " printed a line wider than 80 columns:\n" << line;
  }
}

std::string LastLine(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  return lines.empty() ? "" : lines.back();
}

// `minions up` with `executors` executors on `server` and MINIONS_HOME=`home`, left running as a
// person leaves it in a terminal, as *up; *said gets what it printed until it says how to stop
// it (Ctrl-C).
void StartUp(const std::string& home, const std::string& server, int executors, std::unique_ptr<Subprocess>* up,
             std::string* said) {
  Subprocess::Options sp;
  sp.argv = {kMinions, "up", "--executors", absl::StrCat(executors), "--listen", server, "--http-listen", "off",
             "--models", kModels};
  sp.extra_env = {"MINIONS_HOME=" + home};
  sp.stderr_path = home + "/up.log";
  auto started = Subprocess::Start(sp);
  ASSERT_TRUE(started.ok()) << started.status();
  *up = std::move(*started);
  (*up)->CloseStdin();
  for (int i = 0; i < 40; ++i) {
    auto line = (*up)->ReadLine(absl::Seconds(60));
    ASSERT_TRUE(line.ok()) << "minions up said:\n" << *said;
    *said += *line + "\n";
    if (line->find("Ctrl-C") != std::string::npos) break;
  }
}

TEST(Walkthrough, TheFirstHourAsAUserMeetsIt) {
  const std::string home = (fs::temp_directory_path() / absl::StrCat("minions-walk-", getpid())).string();
  fs::remove_all(home);
  fs::create_directories(home);
  const std::string server = absl::StrCat("127.0.0.1:", PickFreePort());
  const std::string model = kModels + "/text.gguf";

  // minions up: a pool of one executor.
  std::unique_ptr<Subprocess> up;
  std::string up_said;
  StartUp(home, server, 1, &up, &up_said);
  if (HasFatalFailure()) return;
  ExpectFits80Columns("minions up", up_said);
  EXPECT_THAT(up_said, HasSubstr("pool up"));

  // A batch of 50 sample prompts, two of them bad (as a user's first file often has).
  cli::SamplePromptOptions sample;
  sample.records = 50;
  sample.max_tokens = 8;
  const std::string input = home + "/batch.jsonl";
  {
    std::ofstream out(input);
    for (const std::string& line : cli::SamplePromptLines(sample)) out << line << "\n";
  }
  Said submitted = Minions(home, {"submit", input, "--model", model, "--server", server});
  ASSERT_EQ(submitted.code, 0) << submitted.text;
  ExpectFits80Columns("minions submit", submitted.text);
  const std::string job = LastLine(submitted.text);
  ASSERT_THAT(job, ::testing::StartsWith("job-")) << submitted.text;

  // watch, in an 80-column terminal, until the job ends.
  Said watched = RunInTerminal(home, {"watch", job, "--server", server}, absl::Minutes(4));
  EXPECT_EQ(watched.code, 0) << watched.text;
  ExpectFits80Columns("minions watch", watched.text);
  EXPECT_THAT(watched.text, HasSubstr("completed")) << watched.text;

  // results: 48 answers, and the 2 bad lines' errors.
  const std::string output = home + "/out.jsonl";
  Said results = Minions(home, {"results", job, "-o", output, "--server", server});
  ASSERT_EQ(results.code, 0) << results.text;
  ExpectFits80Columns("minions results", results.text);
  std::ifstream out(output);
  int answers = 0;
  for (std::string line; std::getline(out, line);) answers += !line.empty();
  EXPECT_EQ(answers, 48);
  Said errors = Minions(home, {"results", job, "--errors", "--server", server});
  ASSERT_EQ(errors.code, 0) << errors.text;
  EXPECT_EQ(ScreenLines(errors.text).size() - 1, 2u) << errors.text;  // two lines and the last newline

  // status: the finished job, in 80 columns.
  Said status = Minions(home, {"status", job, "--server", server});
  EXPECT_EQ(status.code, 0) << status.text;
  ExpectFits80Columns("minions status", status.text);

  // A wrong model path is refused at submission, saying what to do.
  Said wrong = Minions(home, {"submit", input, "--model", home + "/models/nope.gguf", "--server", server});
  EXPECT_NE(wrong.code, 0) << wrong.text;
  ExpectFits80Columns("minions submit (a wrong model)", wrong.text);
  EXPECT_THAT(wrong.text, HasSubstr("nope.gguf")) << wrong.text;

  // A bigger job cancelled at once: cancel says what is kept, results still come.
  sample.records = 2000;
  {
    std::ofstream big(input);
    for (const std::string& line : cli::SamplePromptLines(sample)) big << line << "\n";
  }
  Said second = Minions(home, {"submit", input, "--model", model, "--server", server});
  ASSERT_EQ(second.code, 0) << second.text;
  const std::string cancelled = LastLine(second.text);
  Said cancel = Minions(home, {"cancel", cancelled, "--server", server});
  EXPECT_EQ(cancel.code, 0) << cancel.text;
  ExpectFits80Columns("minions cancel", cancel.text);
  EXPECT_THAT(cancel.text, HasSubstr("cancel")) << cancel.text;
  Said kept;
  for (int i = 0; i < 300; ++i) {  // finalising the cancelled job takes a moment
    kept = Minions(home, {"results", cancelled, "--errors", "--server", server});
    if (kept.code == 0) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(kept.code, 0) << kept.text;
  EXPECT_THAT(kept.text, HasSubstr("batch_cancelled")) << "every record that never ran has an error line";

  up->Signal(SIGINT);
  auto exit = up->Wait(absl::Seconds(60));
  EXPECT_TRUE(exit.ok());
  fs::remove_all(home);
}

// A pool with no executor yet: the job waits, and `status` says why and what to run, in 80
// columns, with commands that exist (the hints test checks every such command against the CLI).
TEST(Walkthrough, WithNoExecutorStatusSaysHowToAddOne) {
  const std::string home = (fs::temp_directory_path() / absl::StrCat("minions-walk0-", getpid())).string();
  fs::remove_all(home);
  fs::create_directories(home);
  const std::string server = absl::StrCat("127.0.0.1:", PickFreePort());
  std::unique_ptr<Subprocess> up;
  std::string up_said;
  StartUp(home, server, 0, &up, &up_said);
  if (HasFatalFailure()) return;
  cli::SamplePromptOptions sample;
  sample.records = 10;
  sample.include_bad_lines = false;
  const std::string input = home + "/batch.jsonl";
  {
    std::ofstream out(input);
    for (const std::string& line : cli::SamplePromptLines(sample)) out << line << "\n";
  }
  Said submitted = Minions(home, {"submit", input, "--model", kModels + "/text.gguf", "--server", server});
  ASSERT_EQ(submitted.code, 0) << submitted.text;
  Said status = Minions(home, {"status", LastLine(submitted.text), "--server", server});
  EXPECT_EQ(status.code, 0) << status.text;
  ExpectFits80Columns("minions status (no executor)", status.text);
  EXPECT_THAT(status.text, HasSubstr("minions admin join-token")) << status.text;
  EXPECT_THAT(status.text, HasSubstr("--join-token-file")) << status.text;
  up->Signal(SIGINT);
  EXPECT_TRUE(up->Wait(absl::Seconds(60)).ok());
  fs::remove_all(home);
}

}  // namespace
}  // namespace minions::testing
