// Where a client finds its credential (cli/credentials.h, cli::Open) and the private CA's files
// (identity/pki.h).

#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/client_verbs.h"
#include "cli/credentials.h"
#include "identity/pki.h"
#include "testing/temp_dir.h"

namespace minions {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class CredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("minions-cred");
  }
  void TearDown() override { fs::remove_all(dir_); }
  static int Mode(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 0777) : -1;
  }
  std::string dir_;
};

TEST_F(CredentialsTest, ATokenFileIsWrittenPrivateAndRefusedWhenOthersCanReadIt) {
  const mode_t old = umask(0);  // even a careless umask gets 0600
  ASSERT_TRUE(cli::WriteTokenFile(dir_ + "/sub/token", "mns_secret").ok());
  umask(old);
  EXPECT_EQ(Mode(dir_ + "/sub/token"), 0600);
  EXPECT_EQ(*cli::ReadTokenFile(dir_ + "/sub/token"), "mns_secret");
  chmod((dir_ + "/sub/token").c_str(), 0644);
  absl::StatusOr<std::string> exposed = cli::ReadTokenFile(dir_ + "/sub/token");
  EXPECT_EQ(exposed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(exposed.status().message()), HasSubstr("chmod 600"));
  std::ofstream(dir_ + "/empty") << "\n";
  chmod((dir_ + "/empty").c_str(), 0600);
  EXPECT_EQ(cli::ReadTokenFile(dir_ + "/empty").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cli::ReadTokenFile(dir_ + "/missing").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CredentialsTest, AClientFindsItsTokenInOrderAndALocalPoolsOnlyForALocalServer) {
  setenv("MINIONS_HOME", dir_.c_str(), 1);
  ASSERT_TRUE(cli::WriteTokenFile(dir_ + "/pool/admin-token", "mna_pool").ok());
  ASSERT_TRUE(cli::WriteTokenServer(dir_ + "/pool/admin-token", "127.0.0.1:7070", getpid()).ok());
  ASSERT_TRUE(cli::WriteTokenFile(dir_ + "/mine", "mns_file").ok());
  cli::Connection connection;
  connection.server = "127.0.0.1:7070";
  EXPECT_EQ(cli::Open(connection)->token, "mna_pool");  // nothing else given: the local pool's
  connection.token = "mns_flag";
  EXPECT_EQ(cli::Open(connection)->token, "mns_flag");
  connection.token_file = dir_ + "/mine";
  EXPECT_EQ(cli::Open(connection)->token, "mns_file");
  // A local pool's token exposed to others is an error, not silently used.
  chmod((dir_ + "/pool/admin-token").c_str(), 0640);
  cli::Connection bare;
  bare.server = "127.0.0.1:7070";
  EXPECT_EQ(cli::Open(bare).status().code(), absl::StatusCode::kFailedPrecondition);
  unsetenv("MINIONS_HOME");
}

// 40.7c: the local admin token goes only to the server that minted it: the same port, while
// that process runs. Another loopback listener (any local user may open one) gets nothing.
TEST_F(CredentialsTest, ALocalAdminTokenGoesOnlyToTheServerThatMintedIt) {
  setenv("MINIONS_HOME", dir_.c_str(), 1);
  const std::string token = dir_ + "/pool/admin-token";
  ASSERT_TRUE(cli::WriteTokenFile(token, "mna_pool").ok());
  cli::Connection connection;
  connection.server = "127.0.0.1:7070";
  // No record beside it (a pool of an older version): not sent.
  EXPECT_EQ(cli::Open(connection)->token, "");
  ASSERT_TRUE(cli::WriteTokenServer(token, "127.0.0.1:7070", getpid()).ok());
  EXPECT_EQ(Mode(token + ".server"), 0600);
  EXPECT_EQ(cli::Open(connection)->token, "mna_pool");
  // Another port, or another loopback address on the same port: a socket anyone may open.
  for (const char* other : {"127.0.0.1:7071", "127.0.0.2:7070", "[::1]:7070", "localhost:7070"}) {
    connection.server = other;
    EXPECT_EQ(cli::Open(connection)->token, "") << other;
  }
  connection.server = "127.evil.example:7070";
  EXPECT_FALSE(cli::TokenBelongsTo(token, connection.server));
  // The server that minted it has ended: whoever opens its port now is not it.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(cli::WriteTokenServer(token, "127.0.0.1:7070", child).ok());
  connection.server = "127.0.0.1:7070";
  EXPECT_EQ(cli::Open(connection)->token, "");
  // A server on every interface serves loopback too.
  ASSERT_TRUE(cli::WriteTokenServer(token, "0.0.0.0:7070", getpid()).ok());
  EXPECT_EQ(cli::Open(connection)->token, "mna_pool");
  connection.server = "127.0.0.2:7070";
  EXPECT_EQ(cli::Open(connection)->token, "mna_pool");
  connection.server = "[::1]:7070";
  EXPECT_EQ(cli::Open(connection)->token, "");
  unsetenv("MINIONS_HOME");
}

TEST_F(CredentialsTest, PkiInitKeepsItsCaAndIssuesAFreshServerCertificate) {
  pki::InitOptions options;
  options.dir = dir_ + "/tls";
  options.hosts = {"minions.internal", "10.1.2.3"};
  absl::StatusOr<pki::Files> first = pki::Init(options, absl::Now());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->ca_created);
  EXPECT_EQ(Mode(first->ca_key), 0600);
  EXPECT_EQ(Mode(first->server_key), 0600);
  EXPECT_EQ(Mode(options.dir), 0700);
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string ca = read(first->ca_cert), server = read(first->server_cert);
  absl::StatusOr<pki::Files> again = pki::Init(options, absl::Now());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->ca_created);
  EXPECT_EQ(read(again->ca_cert), ca);
  EXPECT_NE(read(again->server_cert), server);
  EXPECT_THAT(pki::ServerNames(options.hosts), ::testing::IsSupersetOf({"minions.internal", "10.1.2.3", "localhost",
                                                                       "127.0.0.1", "::1"}));
  options.hosts = {"bad host;"};
  EXPECT_EQ(pki::Init(options, absl::Now()).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace minions
