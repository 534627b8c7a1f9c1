// The `minions` program as a person meets it: a bare `minions` lists its verbs; a verb that cannot
// reach the server says which address it tried, where that address came from, and what to do.

#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "cli/client_verbs.h"
#include "common/subprocess.h"
#include "testing/process_pool.h"
#include "testing/run_program.h"

namespace minions::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kMinions = std::string(MINIONS_TEST_BIN_DIR) + "/minions";
// Nothing listens on port 1 of the loopback address: a connection there is refused.
constexpr char kNobody[] = "127.0.0.1:1";

using Outcome = ProgramRun;

// Runs `minions args...` without MINIONS_SERVER and MINIONS_CONFIG from this process's
// environment, plus `env` ("NAME=value").
Outcome Minions(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  Subprocess::Options options;
  options.argv = {"env", "-u", "MINIONS_SERVER", "-u", "MINIONS_CONFIG"};
  options.argv.insert(options.argv.end(), env.begin(), env.end());
  options.argv.push_back(kMinions);
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  Outcome run = RunProgram(options, absl::Minutes(1));
  if (!run.started) {
    ADD_FAILURE() << run.err;
    run.err.clear();
  }
  return run;
}

TEST(MinionsCli, ABareMinionsListsItsVerbsAndWhereToStart) {
  Outcome run = Minions({});
  EXPECT_EQ(run.code, 0) << run.err;
  for (const char* verb : {"demo", "up", "submit", "jobs", "status", "watch", "results", "cancel", "models",
                           "executors", "drain", "server", "watchdog", "executor", "config", "local-run"}) {
    EXPECT_THAT(run.out, HasSubstr(absl::StrCat("\n  ", verb, " "))) << verb;
  }
  EXPECT_THAT(run.out, HasSubstr("minions demo"));
  EXPECT_THAT(run.out, HasSubstr("--help"));
  EXPECT_THAT(run.err, Not(HasSubstr("required")));
}

// One help screen: `minions --help` (and -h) is the guide a bare `minions` prints.
TEST(MinionsCli, HelpIsTheGuideABareMinionsPrints) {
  Outcome bare = Minions({});
  for (const char* flag : {"--help", "-h"}) {
    Outcome help = Minions({flag});
    EXPECT_EQ(help.code, 0) << help.err;
    EXPECT_EQ(help.out, bare.out) << flag;
  }
  // A verb's --help is still its own.
  Outcome submit = Minions({"submit", "--help"});
  EXPECT_THAT(submit.out, HasSubstr("--model"));
}

TEST(MinionsCli, ARefusedConnectionNamesTheAddressAndTheFlagItCameFrom) {
  Outcome run = Minions({"jobs", "--server", kNobody});
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.err, HasSubstr(absl::StrCat("Nothing answers at ", kNobody, " (from --server)")));
  EXPECT_THAT(run.err, HasSubstr("minions server"));
}

// A sub-verb's --server is the address dialled (`executors revoke` once dialled the default).
TEST(MinionsCli, ASubVerbDialsItsOwnServerFlag) {
  for (const char* verb : {"revoke", "release", "approve"}) {
    Outcome run = Minions({"executors", verb, "exe-0123456789ab", "--server", kNobody});
    EXPECT_EQ(run.code, 1) << verb;
    EXPECT_THAT(run.err, HasSubstr(kNobody)) << verb;
    EXPECT_THAT(run.err, Not(HasSubstr("127.0.0.1:7070"))) << verb;
  }
}

TEST(MinionsCli, ARefusedConnectionNamesTheEnvironmentVariableItCameFrom) {
  Outcome run = Minions({"status", "job-0123456789ab"}, {absl::StrCat("MINIONS_SERVER=", kNobody)});
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.err, HasSubstr(absl::StrCat("Nothing answers at ", kNobody, " (from MINIONS_SERVER)")));
}

// `minions config check` on a configuration file holding `toml` (a temporary file, removed after).
Outcome ConfigCheck(const std::string& toml) {
  static int files = 0;
  const std::string config = (std::filesystem::temp_directory_path() /
                              absl::StrCat("minions-cli-check-", getpid(), "-", files++, ".toml"))
                                 .string();
  std::ofstream(config) << toml;
  Outcome check = Minions({"config", "check", "--config", config});
  std::filesystem::remove(config);
  return check;
}

// `config check` names each server setting out of its range, with the range to use.
TEST(MinionsCli, ConfigCheckNamesEachServerSettingOutOfRangeAndWhatToUse) {
  Outcome check = ConfigCheck(
      "[server]\nheartbeat_batch = 0\nheartbeat_linger_us = 500000\nhistory_step_s = 0\nverify_wait_s = -1\n");
  EXPECT_NE(check.code, 0);
  EXPECT_THAT(check.out + check.err, HasSubstr("server.history_step_s is 0; use between 1 and 3600"));
  EXPECT_THAT(check.out + check.err, HasSubstr("server.heartbeat_batch is 0; use between 1"));
  EXPECT_THAT(check.out + check.err, HasSubstr("server.verify_wait_s is -1; use between 0 and 86400"));
  EXPECT_THAT(check.out + check.err, HasSubstr("server.heartbeat_linger_us is 500000; use between 0"));
  Outcome fine = ConfigCheck("[server]\nheartbeat_linger_us = 0\n");
  EXPECT_THAT(fine.out + fine.err, Not(HasSubstr("heartbeat_linger_us")));
}

// `config check` checks the files its configuration names: a TLS certificate, a CA, a join token.
TEST(MinionsCli, ConfigCheckNamesEachFileItNamesThatIsNotThere) {
  Outcome check = ConfigCheck(
      "[server]\ntls_cert = \"/nonexistent/server.crt\"\ntls_key = \"/nonexistent/server.key\"\n"
      "[executor]\nca = \"/nonexistent/ca.crt\"\njoin_token_file = \"/nonexistent/join.txt\"\n");
  EXPECT_NE(check.code, 0);
  for (const char* problem : {"server.tls_cert names /nonexistent/server.crt, which does not exist",
                              "server.tls_key names /nonexistent/server.key, which does not exist",
                              "executor.ca names /nonexistent/ca.crt, which does not exist",
                              "executor.join_token_file names /nonexistent/join.txt, which does not exist"}) {
    EXPECT_THAT(check.out + check.err, HasSubstr(problem));
  }
  EXPECT_THAT(check.out, Not(HasSubstr("\nok")));
}

TEST(MinionsCli, ARefusedConnectionNamesTheConfigFileItCameFrom) {
  const std::string config =
      (std::filesystem::temp_directory_path() / absl::StrCat("minions-cli-", getpid(), ".toml")).string();
  std::ofstream(config) << "[executor]\nserver = \"" << kNobody << "\"\n";
  for (const std::vector<std::string>& env : {std::vector<std::string>{"MINIONS_CONFIG=" + config},
                                              std::vector<std::string>{}}) {
    std::vector<std::string> args = {"executors"};
    if (env.empty()) args = {"executors", "--config", config};
    Outcome run = Minions(args, env);
    EXPECT_EQ(run.code, 1);
    EXPECT_THAT(run.err, HasSubstr(absl::StrCat("Nothing answers at ", kNobody, " (from [executor] server in ", config,
                                                ")")));
  }
  std::filesystem::remove(config);
}

// The default address (which another pool on this machine may be using): the words only.
TEST(MinionsCli, TheDefaultAddressComesWithHowToStartAPool) {
  cli::Connection connection;
  std::string hint = cli::UnreachableHint(connection);
  EXPECT_THAT(hint, HasSubstr("127.0.0.1:7070, the default address"));
  EXPECT_THAT(hint, HasSubstr("minions up"));
  EXPECT_THAT(hint, HasSubstr("--server"));
  EXPECT_THAT(hint, HasSubstr("MINIONS_SERVER"));
}

// --server pointed at a server's HTTP port: something answers there, and the hint says what it is
// and where the CLI's port is, not "nothing answers".
TEST(MinionsCli, TheHttpPortIsRecognisedAndNamed) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("minions-cli-http-", getpid())).string();
  std::filesystem::remove_all(dir);
  ProcessPool pool(kMinions, dir, 5000);
  ASSERT_TRUE(pool.StartServer().ok()) << "see " << dir << "/logs";
  Outcome run = Minions({"jobs", "--server", pool.http_address()});
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.err, HasSubstr(absl::StrCat("Something answers at ", pool.http_address(), " (from --server)")));
  EXPECT_THAT(run.err, HasSubstr("that is a server's HTTP port"));
  EXPECT_THAT(run.err, HasSubstr("gRPC port"));
  EXPECT_THAT(run.err, Not(HasSubstr("Nothing answers")));
  pool.StopServer(SIGTERM).IgnoreError();
  std::filesystem::remove_all(dir);
}

// Servers on one database share one object store: the first server records its own; a second
// server configured with another refuses to start, saying which the database has, and `config
// check --connect` says the same.
// `minions admin team set --verify-fraction` (issue 38): a team's share of records spot-checked,
// 0.01 to 1, or 0 for the fleet's; anything else is refused, so checks are never off for a team.
TEST(MinionsCli, AdminTeamSetVerifyFractionTakesOnlyAShareWithinItsBounds) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("minions-cli-verify-", getpid())).string();
  std::filesystem::remove_all(dir);
  auto admin = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"admin", "--data-dir", dir});
    return Minions(args);
  };
  Outcome created = admin({"team", "create", "search"});
  ASSERT_EQ(created.code, 0) << created.err;
  EXPECT_THAT(created.out, HasSubstr("spot checks fleet's"));
  Outcome set = admin({"team", "set", "search", "--verify-fraction", "0.25"});
  EXPECT_EQ(set.code, 0) << set.err;
  EXPECT_THAT(set.out, HasSubstr("spot checks 25.0%"));
  for (const char* refused : {"0.001", "1.5", "-1"}) {
    Outcome run = admin({"team", "set", "search", absl::StrCat("--verify-fraction=", refused)});
    EXPECT_NE(run.code, 0) << refused;
    EXPECT_THAT(run.err, HasSubstr("never off")) << refused;
  }
  Outcome teams = admin({"teams"});
  EXPECT_EQ(teams.code, 0) << teams.err;
  EXPECT_THAT(teams.out, HasSubstr("VERIFY"));
  EXPECT_THAT(teams.out, HasSubstr("25.0%"));
  Outcome fleets = admin({"team", "set", "search", "--verify-fraction", "0"});
  EXPECT_EQ(fleets.code, 0) << fleets.err;
  EXPECT_THAT(fleets.out, HasSubstr("spot checks fleet's"));
  std::filesystem::remove_all(dir);
}

TEST(MinionsCli, AServerWithAnotherObjectStoreThanTheDatabasesRefusesToStart) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("minions-cli-objects-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string database = absl::StrCat("sqlite:", (dir / "minions.db").string());
  const std::string ours = (dir / "objects-a").string();
  const std::string theirs = (dir / "objects-b").string();

  // The first server: it records its object store before it mints the admin token.
  Subprocess::Options first;
  first.argv = {kMinions, "server", "--listen", "127.0.0.1:0", "--http-listen", "off", "--data-dir",
                (dir / "first").string(), "--database", database, "--objects", ours};
  first.stderr_path = (dir / "first.log").string();
  auto server = Subprocess::Start(first);
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->CloseStdin();
  for (int i = 0; i < 600 && !std::filesystem::exists(dir / "first" / "admin-token"); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(std::filesystem::exists(dir / "first" / "admin-token")) << "the first server did not start; see "
                                                                       << first.stderr_path;

  Outcome refused = Minions({"server", "--listen", "127.0.0.1:0", "--http-listen", "off", "--data-dir",
                             (dir / "second").string(), "--database", database, "--objects", theirs});
  EXPECT_EQ(refused.code, 1);
  EXPECT_THAT(refused.err, HasSubstr("keep their objects in file:" + ours));
  EXPECT_THAT(refused.err, HasSubstr("configured with file:" + theirs));
  EXPECT_FALSE(std::filesystem::exists(dir / "second" / "admin-token")) << "the second server went on";

  Outcome check = Minions({"config", "check", "--connect", "--database", database, "--objects", theirs},
                          {absl::StrCat("HOME=", dir.string())});
  EXPECT_NE(check.code, 0);
  EXPECT_THAT(check.out + check.err, HasSubstr("keep their objects in file:" + ours));
  // The same object store, named another way (a relative path through a symlink-free parent), agrees.
  Outcome agreed = Minions({"config", "check", "--connect", "--database", database, "--objects",
                            (dir / "objects-b" / ".." / "objects-a").string()},
                           {absl::StrCat("HOME=", dir.string())});
  EXPECT_EQ(agreed.code, 0) << agreed.out << agreed.err;

  (*server)->Signal(SIGKILL);
  (void)(*server)->Wait(absl::Seconds(30));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace minions::testing
