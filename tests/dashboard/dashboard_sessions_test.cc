// DashboardSessions (dashboard/dashboard_sessions.h): ids that name no token, ending on time, on
// sign-out, and the oldest first when the table is full.

#include "dashboard/dashboard_sessions.h"

#include <gtest/gtest.h>

#include <set>

namespace minions {
namespace {

TEST(DashboardSessions, AnIdIsRandomNamesItsTokenAndEnds) {
  DashboardSessions sessions(absl::Hours(12), 100);
  const absl::Time now = absl::FromUnixSeconds(1000000);
  std::set<std::string> ids;
  for (int i = 0; i < 50; ++i) ids.insert(sessions.Open("mnv_token", now));
  EXPECT_EQ(ids.size(), 50u);
  const std::string id = *ids.begin();
  EXPECT_EQ(id.size(), 64u);
  EXPECT_EQ(id.find("mnv_"), std::string::npos);
  EXPECT_EQ(sessions.TokenOf(id, now + absl::Hours(11)), "mnv_token");
  EXPECT_EQ(sessions.TokenOf(id, now + absl::Hours(12)), "");  // ended, and forgotten
  EXPECT_EQ(sessions.TokenOf("", now), "");
  EXPECT_EQ(sessions.TokenOf("mnv_token", now), "");
  const std::string other = sessions.Open("mnv_other", now);
  sessions.Close(other);
  EXPECT_EQ(sessions.TokenOf(other, now), "");
}

// The CSRF secret: random per session, not the id, and worth nothing once the session ends.
TEST(DashboardSessions, EachSessionHasACsrfSecretOfItsOwn) {
  DashboardSessions sessions(absl::Hours(1), 100);
  const absl::Time now = absl::FromUnixSeconds(1000000);
  const std::string a = sessions.Open("mnv_a", now);
  const std::string b = sessions.Open("mnv_a", now);
  const std::string csrf = sessions.CsrfOf(a, now);
  EXPECT_EQ(csrf.size(), 64u);
  EXPECT_NE(csrf, a);
  EXPECT_NE(csrf, sessions.CsrfOf(b, now));
  EXPECT_TRUE(sessions.CsrfMatches(a, csrf, now));
  EXPECT_FALSE(sessions.CsrfMatches(b, csrf, now));
  EXPECT_FALSE(sessions.CsrfMatches(a, "", now));
  EXPECT_FALSE(sessions.CsrfMatches(a, csrf.substr(1), now));
  EXPECT_FALSE(sessions.CsrfMatches("", "", now));
  EXPECT_FALSE(sessions.CsrfMatches(a, csrf, now + absl::Hours(1)));  // ended
  EXPECT_EQ(sessions.CsrfOf(a, now), "");
  sessions.Close(b);
  EXPECT_EQ(sessions.CsrfOf(b, now), "");
}

TEST(DashboardSessions, AFullTableDropsTheOldestSession) {
  DashboardSessions sessions(absl::Hours(1), 3);
  const absl::Time now = absl::FromUnixSeconds(1000000);
  const std::string first = sessions.Open("a", now);
  const std::string second = sessions.Open("b", now + absl::Seconds(1));
  const std::string third = sessions.Open("c", now + absl::Seconds(2));
  const std::string fourth = sessions.Open("d", now + absl::Seconds(3));
  EXPECT_EQ(sessions.size(), 3u);
  EXPECT_EQ(sessions.TokenOf(first, now + absl::Seconds(4)), "");
  EXPECT_EQ(sessions.TokenOf(second, now + absl::Seconds(4)), "b");
  EXPECT_EQ(sessions.TokenOf(fourth, now + absl::Seconds(4)), "d");
  (void)third;
}

}  // namespace
}  // namespace minions
