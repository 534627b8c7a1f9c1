// The Authenticator: who a token is, what it may do, how quickly a revocation bites, and how a
// team's rate limit holds.

#include "identity/authenticator.h"

#include "identity/token.h"
#include "identity_test_util.h"

namespace minions::testing {
namespace {

using ::testing::HasSubstr;

class AuthenticatorTest : public IdentityFixture {
 protected:
  void SetUp() override {
    IdentityFixture::SetUp();
    auth_ = std::make_unique<Authenticator>(store_.get(), &clock_);
    MustCreateTeam("search");
  }
  std::unique_ptr<Authenticator> auth_;
};

TEST_F(AuthenticatorTest, AnIssuedTokenIsItsPrincipal) {
  IssuedToken alice = MustIssue(Role::kSubmitter, "search", "alice");
  absl::StatusOr<Caller> caller = auth_->Authenticate(alice.text);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->token_id, alice.record.id);
  EXPECT_EQ(caller->role, Role::kSubmitter);
  EXPECT_EQ(caller->team, "search");
  EXPECT_EQ(caller->principal, "alice");
  EXPECT_TRUE(caller->Has(Scope::kJobsWrite));
  EXPECT_FALSE(caller->IsAdmin());
  EXPECT_TRUE(caller->SeesTeam("search"));
  EXPECT_FALSE(caller->SeesTeam("ads"));
  EXPECT_EQ(caller->executor_id(), "");
  EXPECT_THAT(caller->Describe(), HasSubstr("alice@search"));
  EXPECT_THAT(caller->Describe(), ::testing::Not(HasSubstr(alice.text)));
}

TEST_F(AuthenticatorTest, NoTokenAForeignOneAndAnUnknownOneAreRefused) {
  IDENTITY_EXPECT_CODE(auth_->Authenticate(""), kUnauthenticated);
  EXPECT_THAT(MessageOf(auth_->Authenticate("")), HasSubstr("MINIONS_TOKEN"));
  IDENTITY_EXPECT_CODE(auth_->Authenticate("hunter2"), kUnauthenticated);
  // Well formed, never issued here.
  absl::StatusOr<Caller> unknown = auth_->Authenticate(token::Mint(Role::kAdmin).text);
  IDENTITY_EXPECT_CODE(unknown, kUnauthenticated);
  EXPECT_THAT(MessageOf(unknown), HasSubstr("unknown token"));
}

TEST_F(AuthenticatorTest, ARevocationHereBitesAtOnceAndOneElsewhereWithinTheCacheTtl) {
  IssuedToken viewer = MustIssue(Role::kViewer, "search", "bob");
  IssuedToken other = MustIssue(Role::kViewer, "search", "carol");
  ASSERT_TRUE(auth_->Authenticate(viewer.text).ok());
  ASSERT_TRUE(auth_->Authenticate(other.text).ok());

  // Revoked through this server (which forgets it): refused on the next call.
  ASSERT_TRUE(store_->RevokeToken(viewer.record.id, clock_.Now()).ok());
  auth_->Forget(viewer.record.id);
  absl::StatusOr<Caller> refused = auth_->Authenticate(viewer.text);
  IDENTITY_EXPECT_CODE(refused, kUnauthenticated);
  EXPECT_THAT(MessageOf(refused), HasSubstr("revoked"));

  // Revoked through another server: this one trusts its cache for at most cache_ttl.
  ASSERT_TRUE(store_->RevokeToken(other.record.id, clock_.Now()).ok());
  clock_.Advance(auth_->options().cache_ttl - absl::Milliseconds(1));
  EXPECT_TRUE(auth_->Authenticate(other.text).ok());
  clock_.Advance(absl::Milliseconds(1));
  IDENTITY_EXPECT_CODE(auth_->Authenticate(other.text), kUnauthenticated);
}

TEST_F(AuthenticatorTest, ExpiryIsCheckedOnEveryCallCachedOrNot) {
  IssuedToken brief = MustIssue(Role::kViewer, "search", "temp", absl::Minutes(10));
  ASSERT_TRUE(auth_->Authenticate(brief.text).ok());
  clock_.Advance(absl::Minutes(10) - auth_->options().cache_ttl / 2);
  ASSERT_TRUE(auth_->Authenticate(brief.text).ok());  // cached from here on
  clock_.Advance(auth_->options().cache_ttl / 2);
  absl::StatusOr<Caller> expired = auth_->Authenticate(brief.text);
  IDENTITY_EXPECT_CODE(expired, kUnauthenticated);
  EXPECT_THAT(MessageOf(expired), HasSubstr("expired"));
}

TEST_F(AuthenticatorTest, EachScopeIsCheckedAndTheRefusalSaysWhatItTakes) {
  IssuedToken viewer = MustIssue(Role::kViewer, "search", "bob");
  IssuedToken submitter = MustIssue(Role::kSubmitter, "search", "alice");
  IssuedToken admin = MustIssue(Role::kAdmin, "", "root");
  IssuedToken monitor = MustIssue(Role::kMonitor, "", "prometheus");

  absl::StatusOr<Caller> denied = auth_->Authorize(viewer.text, Scope::kJobsWrite);
  IDENTITY_EXPECT_CODE(denied, kPermissionDenied);
  EXPECT_THAT(MessageOf(denied), HasSubstr("a viewer token cannot submit or cancel jobs"));
  EXPECT_TRUE(auth_->Authorize(viewer.text, Scope::kJobsRead).ok());
  EXPECT_TRUE(auth_->Authorize(submitter.text, Scope::kJobsWrite).ok());
  IDENTITY_EXPECT_CODE(auth_->Authorize(submitter.text, Scope::kAdmin), kPermissionDenied);
  IDENTITY_EXPECT_CODE(auth_->Authorize(submitter.text, Scope::kExecutor), kPermissionDenied);
  IDENTITY_EXPECT_CODE(auth_->Authorize(admin.text, Scope::kExecutor), kPermissionDenied);
  IDENTITY_EXPECT_CODE(auth_->Authorize(monitor.text, Scope::kJobsRead), kPermissionDenied);
  EXPECT_TRUE(auth_->Authorize(monitor.text, Scope::kMetricsRead).ok());
  EXPECT_TRUE(auth_->Authorize(admin.text, Scope::kJobsWrite).ok());
}

TEST_F(AuthenticatorTest, ATeamOverItsRateIsRefusedUntilItsBucketRefills) {
  MustCreateTeam("ads", /*requests_per_second=*/2);
  IssuedToken ads = MustIssue(Role::kViewer, "ads", "eve");
  IssuedToken search = MustIssue(Role::kViewer, "search", "bob");
  IssuedToken admin = MustIssue(Role::kAdmin, "", "root");
  // A burst of twice the rate, then refused.
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(auth_->Authorize(ads.text, Scope::kJobsRead).ok()) << i;
  absl::StatusOr<Caller> limited = auth_->Authorize(ads.text, Scope::kJobsRead);
  IDENTITY_EXPECT_CODE(limited, kResourceExhausted);
  EXPECT_THAT(MessageOf(limited), HasSubstr("team ads is over its rate limit of 2"));
  // Other teams and admins are not held back.
  for (int i = 0; i < 10; ++i) {
    EXPECT_TRUE(auth_->Authorize(search.text, Scope::kJobsRead).ok());
    EXPECT_TRUE(auth_->Authorize(admin.text, Scope::kJobsRead).ok());
  }
  // A second refills two requests' worth.
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(auth_->Authorize(ads.text, Scope::kJobsRead).ok());
  EXPECT_TRUE(auth_->Authorize(ads.text, Scope::kJobsRead).ok());
  IDENTITY_EXPECT_CODE(auth_->Authorize(ads.text, Scope::kJobsRead), kResourceExhausted);
}

TEST_F(AuthenticatorTest, LastUseIsRecordedAtMostOnceAMinute) {
  IssuedToken viewer = MustIssue(Role::kViewer, "search", "bob");
  const absl::Time first = clock_.Now();
  ASSERT_TRUE(auth_->Authenticate(viewer.text).ok());
  clock_.Advance(absl::Seconds(30));
  ASSERT_TRUE(auth_->Authenticate(viewer.text).ok());
  EXPECT_EQ(store_->GetToken(viewer.record.id)->last_used_at, first);
  clock_.Advance(absl::Seconds(30));
  ASSERT_TRUE(auth_->Authenticate(viewer.text).ok());
  EXPECT_EQ(store_->GetToken(viewer.record.id)->last_used_at, clock_.Now());
}

TEST(RateLimiterTest, AZeroRateAdmitsEverythingAndALoweredRateBitesAtOnce) {
  RateLimiter limiter;
  absl::Time now = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(limiter.Admit("t", 0, now));
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(limiter.Admit("u", 10, now));
  EXPECT_FALSE(limiter.Admit("u", 10, now));
  now += absl::Seconds(10);
  // Refilled to 20, then the rate is lowered to 1: at most 2 left.
  EXPECT_TRUE(limiter.Admit("u", 1, now));
  EXPECT_TRUE(limiter.Admit("u", 1, now));
  EXPECT_FALSE(limiter.Admit("u", 1, now));
}

}  // namespace
}  // namespace minions::testing
