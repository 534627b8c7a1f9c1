#include "common/subprocess.h"

#include <signal.h>

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace minions
