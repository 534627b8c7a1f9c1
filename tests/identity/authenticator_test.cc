// The Authenticator: who a token is, what it may do, how quickly a revocation bites, and how a
// team's rate limit holds.

#include "identity/authenticator.h"

#include "absl/strings/str_cat.h"

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

// The store as another server sees it, counting what the Authenticator asks of it; its batched
// revocation check can be made to fail.
class CountingIdentityStore : public IdentityStore {
 public:
  explicit CountingIdentityStore(IdentityStore* inner) : inner_(inner) {}
  absl::StatusOr<Team> CreateTeam(const Team& team) override { return inner_->CreateTeam(team); }
  absl::StatusOr<Team> UpdateTeam(const Team& team) override { return inner_->UpdateTeam(team); }
  absl::StatusOr<Team> GetTeam(const std::string& name) override {
    ++team_reads;
    return inner_->GetTeam(name);
  }
  absl::StatusOr<std::vector<Team>> ListTeams() override { return inner_->ListTeams(); }
  absl::StatusOr<Team> ChargeTeamBytes(const std::string& team, TeamBytes kind, int64_t delta,
                                       bool enforce) override {
    return inner_->ChargeTeamBytes(team, kind, delta, enforce);
  }
  absl::Status AddToken(const TokenRecord& token) override { return inner_->AddToken(token); }
  absl::StatusOr<TokenRecord> FindToken(const std::string& secret_hash) override {
    ++token_reads;
    return inner_->FindToken(secret_hash);
  }
  absl::StatusOr<TokenRecord> GetToken(const std::string& token_id) override { return inner_->GetToken(token_id); }
  absl::StatusOr<std::vector<TokenRecord>> ListTokens(const TokenFilter& filter) override {
    return inner_->ListTokens(filter);
  }
  absl::StatusOr<TokenRecord> RevokeToken(const std::string& token_id, absl::Time now) override {
    return inner_->RevokeToken(token_id, now);
  }
  absl::Status RecordTokenUse(const std::vector<std::string>& token_ids, absl::Time at) override {
    ++use_writes;
    return inner_->RecordTokenUse(token_ids, at);
  }
  absl::StatusOr<std::vector<std::string>> RevokedTokensSince(absl::Time since) override {
    ++revocation_reads;
    if (revocations_unavailable) return absl::UnavailableError("the database is restarting");
    return inner_->RevokedTokensSince(since);
  }
  absl::StatusOr<Executor> EnrolExecutor(const std::string& join_secret_hash, TokenRecord& credential,
                                         const ExecutorInfo& info, absl::Time now, bool await_approval) override {
    return inner_->EnrolExecutor(join_secret_hash, credential, info, now, await_approval);
  }
  absl::StatusOr<Executor> RevokeExecutor(const std::string& executor_id, absl::Time now) override {
    return inner_->RevokeExecutor(executor_id, now);
  }

  int64_t token_reads = 0, team_reads = 0, use_writes = 0, revocation_reads = 0;
  bool revocations_unavailable = false;

 private:
  IdentityStore* inner_;
};

class BatchedCredentialsTest : public IdentityFixture {
 protected:
  void SetUp() override {
    IdentityFixture::SetUp();
    counting_ = std::make_unique<CountingIdentityStore>(store_.get());
    auth_ = std::make_unique<Authenticator>(counting_.get(), &clock_);
    MustCreateTeam("search");
  }
  std::unique_ptr<CountingIdentityStore> counting_;
  std::unique_ptr<Authenticator> auth_;
};

TEST_F(BatchedCredentialsTest, AnIdleFleetCostsAFewBatchedReadsNotOneEachPerCredential) {
  // 200 executors' credentials, each presented every 3 s (a heartbeat) for ten minutes.
  std::vector<IssuedToken> fleet;
  for (int i = 0; i < 200; ++i) fleet.push_back(MustIssue(Role::kViewer, "search", absl::StrCat("exe-", i)));
  const absl::Time start = clock_.Now();
  for (int tick = 0; tick < 200; ++tick) {
    for (const IssuedToken& token : fleet) ASSERT_TRUE(auth_->Authenticate(token.text).ok());
    clock_.Advance(absl::Seconds(3));
  }
  // Each credential read when first seen and once per refresh_ttl (5 min); not every cache_ttl,
  // which would be 200 reads of each.
  EXPECT_LE(counting_->token_reads, 200 * 3);
  EXPECT_LE(counting_->team_reads, 200 * 3);
  // Revocations read at most once per cache_ttl: once per tick here.
  EXPECT_LE(counting_->revocation_reads, 200);
  // Uses written together: a few writes a minute for the whole fleet.
  EXPECT_LE(counting_->use_writes, 10 * 4);
  for (const IssuedToken& token : {fleet.front(), fleet.back()}) {
    absl::StatusOr<TokenRecord> record = store_->GetToken(token.record.id);
    ASSERT_TRUE(record.ok()) << record.status();
    ASSERT_TRUE(record->last_used_at.has_value());
    EXPECT_GE(*record->last_used_at, start + absl::Minutes(9));
    EXPECT_LE(*record->last_used_at, clock_.Now());
  }
}

TEST_F(BatchedCredentialsTest, ACredentialRevokedOnAnotherServerIsRefusedWithinTheCacheTtlHoweverLongItWasCached) {
  IssuedToken viewer = MustIssue(Role::kViewer, "search", "bob");
  // Presented every second for four minutes: read from the store once.
  for (int i = 0; i < 240; ++i) {
    ASSERT_TRUE(auth_->Authenticate(viewer.text).ok());
    clock_.Advance(absl::Seconds(1));
  }
  EXPECT_EQ(counting_->token_reads, 1);
  // Revoked through another server (straight in the store: this one is not told).
  ASSERT_TRUE(store_->RevokeToken(viewer.record.id, clock_.Now()).ok());
  clock_.Advance(auth_->options().cache_ttl);
  absl::StatusOr<Caller> refused = auth_->Authenticate(viewer.text);
  IDENTITY_EXPECT_CODE(refused, kUnauthenticated);
  EXPECT_THAT(MessageOf(refused), HasSubstr("revoked"));
  // And stays refused.
  clock_.Advance(absl::Seconds(30));
  IDENTITY_EXPECT_CODE(auth_->Authenticate(viewer.text), kUnauthenticated);
}

TEST_F(BatchedCredentialsTest, ARevocationStampedByAServerWhoseClockIsBehindIsStillSeen) {
  IssuedToken viewer = MustIssue(Role::kViewer, "search", "bob");
  ASSERT_TRUE(auth_->Authenticate(viewer.text).ok());
  clock_.Advance(absl::Seconds(10));
  ASSERT_TRUE(auth_->Authenticate(viewer.text).ok());  // a check at +10 s
  // The revoking server's clock is 20 s behind this one's: its revocation says +0 s.
  ASSERT_TRUE(store_->RevokeToken(viewer.record.id, clock_.Now() - absl::Seconds(20)).ok());
  clock_.Advance(auth_->options().cache_ttl);
  IDENTITY_EXPECT_CODE(auth_->Authenticate(viewer.text), kUnauthenticated);
}

TEST_F(BatchedCredentialsTest, WhenRevocationsCannotBeReadEachCredentialIsReadAgainOnItsOwn) {
  IssuedToken viewer = MustIssue(Role::kViewer, "search", "bob");
  ASSERT_TRUE(auth_->Authenticate(viewer.text).ok());
  counting_->revocations_unavailable = true;
  ASSERT_TRUE(store_->RevokeToken(viewer.record.id, clock_.Now()).ok());
  clock_.Advance(auth_->options().cache_ttl);
  IDENTITY_EXPECT_CODE(auth_->Authenticate(viewer.text), kUnauthenticated);
  EXPECT_EQ(counting_->token_reads, 2);
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
