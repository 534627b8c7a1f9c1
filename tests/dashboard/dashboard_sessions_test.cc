// DashboardSessions (dashboard/dashboard_sessions.h): ids that name no token, ending on time, on
// sign-out, and the oldest first when the table is full.

#include "dashboard/dashboard_sessions.h"

#include <gtest/gtest.h>

#include <set>

namespace minions {
namespace {

// When every test's sessions open.
const absl::Time kNow = absl::FromUnixSeconds(1000000);

TEST(DashboardSessions, AnIdIsRandomNamesItsTokenAndEnds) {
  DashboardSessions sessions(absl::Hours(12), 100);
  std::set<std::string> ids;
  for (int i = 0; i < 50; ++i) ids.insert(sessions.Open("mnv_token", kNow));
  EXPECT_EQ(ids.size(), 50u);
  const std::string id = *ids.begin();
  EXPECT_EQ(id.size(), 64u);
  EXPECT_EQ(id.find("mnv_"), std::string::npos);
  EXPECT_EQ(sessions.TokenOf(id, kNow + absl::Hours(11)), "mnv_token");
  EXPECT_EQ(sessions.TokenOf(id, kNow + absl::Hours(12)), "");  // ended, and forgotten
  EXPECT_EQ(sessions.TokenOf("", kNow), "");
  EXPECT_EQ(sessions.TokenOf("mnv_token", kNow), "");
  const std::string other = sessions.Open("mnv_other", kNow);
  sessions.Close(other);
  EXPECT_EQ(sessions.TokenOf(other, kNow), "");
}

// The CSRF secret: random per session, not the id, and worth nothing once the session ends.
TEST(DashboardSessions, EachSessionHasACsrfSecretOfItsOwn) {
  DashboardSessions sessions(absl::Hours(1), 100);
  const std::string a = sessions.Open("mnv_a", kNow);
  const std::string b = sessions.Open("mnv_a", kNow);
  const std::string csrf = sessions.CsrfOf(a, kNow);
  EXPECT_EQ(csrf.size(), 64u);
  EXPECT_NE(csrf, a);
  EXPECT_NE(csrf, sessions.CsrfOf(b, kNow));
  EXPECT_TRUE(sessions.CsrfMatches(a, csrf, kNow));
  EXPECT_FALSE(sessions.CsrfMatches(b, csrf, kNow));
  EXPECT_FALSE(sessions.CsrfMatches(a, "", kNow));
  EXPECT_FALSE(sessions.CsrfMatches(a, csrf.substr(1), kNow));
  EXPECT_FALSE(sessions.CsrfMatches("", "", kNow));
  EXPECT_FALSE(sessions.CsrfMatches(a, csrf, kNow + absl::Hours(1)));  // ended
  EXPECT_EQ(sessions.CsrfOf(a, kNow), "");
  sessions.Close(b);
  EXPECT_EQ(sessions.CsrfOf(b, kNow), "");
}

TEST(DashboardSessions, AFullTableDropsTheOldestSession) {
  DashboardSessions sessions(absl::Hours(1), 3);
  const std::string first = sessions.Open("a", kNow);
  const std::string second = sessions.Open("b", kNow + absl::Seconds(1));
  const std::string third = sessions.Open("c", kNow + absl::Seconds(2));
  const std::string fourth = sessions.Open("d", kNow + absl::Seconds(3));
  EXPECT_EQ(sessions.size(), 3u);
  EXPECT_EQ(sessions.TokenOf(first, kNow + absl::Seconds(4)), "");
  EXPECT_EQ(sessions.TokenOf(second, kNow + absl::Seconds(4)), "b");
  EXPECT_EQ(sessions.TokenOf(fourth, kNow + absl::Seconds(4)), "d");
  (void)third;
}

}  // namespace
}  // namespace minions
