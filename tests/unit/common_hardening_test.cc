// Secrets and files (issue 17): log lines that cannot be forged, passwords hidden wherever a
// connection string is printed, data created for its owner only.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/logging.h"
#include "common/private_files.h"
#include "common/redact.h"

namespace minions {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(Logging, ControlCharactersCannotForgeALine) {
  // An executor named "a\nI 00:00:00.000 server job_service.cc:1] job=x cancelled" would write a
  // second, forged line; escaped, it is one line that shows what was sent.
  std::string name = "laptop\nI 12:00:00.000 server job_service.cc:1] job=job-1 cancelled\x1b[2K\r\t\x7f";
  std::string escaped = EscapeControlCharacters(name);
  EXPECT_EQ(escaped.find('\n'), std::string::npos);
  EXPECT_EQ(escaped.find('\r'), std::string::npos);
  EXPECT_EQ(escaped.find('\x1b'), std::string::npos);
  EXPECT_EQ(escaped, "laptop\\nI 12:00:00.000 server job_service.cc:1] job=job-1 cancelled\\x1b[2K\\r\\t\\x7f");
  // Printable text and UTF-8 are left alone.
  EXPECT_EQ(EscapeControlCharacters("caf\xc3\xa9 ok"), "caf\xc3\xa9 ok");
}

TEST(Logging, AMessageIsWrittenAsOneLine) {
  // Capture stderr through a pipe while one message with newlines is logged.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  int saved = dup(STDERR_FILENO);
  dup2(fds[1], STDERR_FILENO);
  MINIONS_LOG(Warning) << "executor=" << "evil\nE 00:00:00.000 forged";
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(fds[1]);
  char buf[4096];
  ssize_t n = read(fds[0], buf, sizeof(buf));
  close(fds[0]);
  ASSERT_GT(n, 0);
  std::string written(buf, static_cast<size_t>(n));
  EXPECT_EQ(std::count(written.begin(), written.end(), '\n'), 1) << written;
  EXPECT_THAT(written, HasSubstr("executor=evil\\nE 00:00:00.000 forged\n"));
}

TEST(Redact, PasswordsInConnectionStringsAreHidden) {
  EXPECT_EQ(RedactSecrets("postgresql://minions:s3cret@db.corp:5432/minions?sslmode=verify-full"),
            "postgresql://minions:****@db.corp:5432/minions?sslmode=verify-full");
  EXPECT_EQ(RedactSecrets("postgresql://db.corp/minions?user=m&password=s3cret&sslmode=require"),
            "postgresql://db.corp/minions?user=m&password=****&sslmode=require");
  EXPECT_EQ(RedactSecrets("host=db.corp user=m password=s3cret dbname=minions"),
            "host=db.corp user=m password=**** dbname=minions");
  EXPECT_EQ(RedactSecrets(R"(host=db.corp password='it\'s secret' dbname=x)"), "host=db.corp password=**** dbname=x");
  EXPECT_EQ(RedactSecrets("https://bucket.s3/key?X-Amz-Credential=AKIA%2F&X-Amz-Signature=abcd&X-Amz-Expires=60"),
            "https://bucket.s3/key?X-Amz-Credential=****&X-Amz-Signature=****&X-Amz-Expires=60");
  // Nothing to hide: unchanged.
  EXPECT_EQ(RedactSecrets("postgresql://m@127.0.0.1:5432/minions"), "postgresql://m@127.0.0.1:5432/minions");
  EXPECT_EQ(RedactSecrets("sqlite:/var/lib/minions/minions.db"), "sqlite:/var/lib/minions/minions.db");
  for (const char* text : {"postgresql://u:p@h/d", "password=p", "x?token=p"}) {
    EXPECT_THAT(RedactSecrets(text), Not(HasSubstr("=p"))) << text;
    EXPECT_THAT(RedactSecrets(text), Not(HasSubstr(":p@"))) << text;
  }
}

class PrivateFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("minions-private-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    // A permissive umask, as a careless service manager might leave it: the modes must not depend on it.
    old_umask_ = umask(0);
  }
  void TearDown() override {
    umask(old_umask_);
    std::filesystem::remove_all(dir_);
  }
  static unsigned Mode(const std::filesystem::path& path) {
    struct stat st;
    EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
    return st.st_mode & 0777;
  }
  std::filesystem::path dir_;
  mode_t old_umask_ = 0;
};

TEST_F(PrivateFilesTest, FoldersAre0700AndFiles0600WhateverTheUmask) {
  ASSERT_TRUE(MakePrivateDirectories((dir_ / "a/b/c").string()).ok());
  EXPECT_EQ(Mode(dir_), 0700u);
  EXPECT_EQ(Mode(dir_ / "a"), 0700u);
  EXPECT_EQ(Mode(dir_ / "a/b/c"), 0700u);
  ASSERT_TRUE(WritePrivateFile((dir_ / "d/e/executor-id").string(), "exe-1\n").ok());
  EXPECT_EQ(Mode(dir_ / "d/e"), 0700u);
  EXPECT_EQ(Mode(dir_ / "d/e/executor-id"), 0600u);
  std::ifstream in(dir_ / "d/e/executor-id");
  std::string id;
  std::getline(in, id);
  EXPECT_EQ(id, "exe-1");
  // Rewriting keeps it private, and leaves no temporary file behind.
  ASSERT_TRUE(WritePrivateFile((dir_ / "d/e/executor-id").string(), "exe-2\n").ok());
  EXPECT_EQ(Mode(dir_ / "d/e/executor-id"), 0600u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_ / "d/e"), std::filesystem::directory_iterator()), 1);
}

TEST_F(PrivateFilesTest, ExistingFoldersAreLeftAloneAndAFileInTheWayIsAnError) {
  std::filesystem::create_directories(dir_);
  std::filesystem::permissions(dir_, std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                                         std::filesystem::perms::group_exec);
  ASSERT_TRUE(MakePrivateDirectories(dir_.string()).ok());
  EXPECT_EQ(Mode(dir_), 0750u);  // not ours to change (it may be /tmp or a home)
  std::ofstream(dir_ / "file") << "x";
  auto s = MakePrivateDirectories((dir_ / "file/sub").string());
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("is not a folder"));
}

}  // namespace
}  // namespace minions
