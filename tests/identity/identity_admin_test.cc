// IdentityAdmin: what can be issued, to whom, and the trade of a join token for an executor.

#include "identity/identity_admin.h"

#include <cmath>
#include <limits>

#include "identity/authenticator.h"
#include "identity/token.h"
#include "identity_test_util.h"

namespace minions::testing {
namespace {

using ::testing::HasSubstr;

class IdentityAdminTest : public IdentityFixture {};

IssueRequest Request(Role role, const std::string& team, const std::string& principal) {
  return testing::TokenRequest(role, team, principal);
}

TEST_F(IdentityAdminTest, OnlyWellFormedCredentialsAreIssued) {
  MustCreateTeam("search");
  IDENTITY_EXPECT_CODE(admin_->Issue(Request(Role::kExecutor, "", "x"), "local"), kInvalidArgument);
  EXPECT_THAT(MessageOf(admin_->Issue(Request(Role::kExecutor, "", "x"), "local")), HasSubstr("join token"));
  IDENTITY_EXPECT_CODE(admin_->Issue(Request(Role::kSubmitter, "", "alice"), "local"), kInvalidArgument);
  IDENTITY_EXPECT_CODE(admin_->Issue(Request(Role::kAdmin, "search", "root"), "local"), kInvalidArgument);
  IDENTITY_EXPECT_CODE(admin_->Issue(Request(Role::kViewer, "search", "a b"), "local"), kInvalidArgument);
  IDENTITY_EXPECT_CODE(admin_->Issue(Request(Role::kViewer, "search", "../../etc"), "local"), kInvalidArgument);
  IDENTITY_EXPECT_CODE(admin_->Issue(Request(Role::kViewer, "search", "x\nFAKE log line"), "local"), kInvalidArgument);
  IDENTITY_EXPECT_CODE(admin_->Issue(Request(Role::kViewer, "nobody", "bob"), "local"), kNotFound);
  IssueRequest wider = Request(Role::kViewer, "search", "bob");
  wider.scopes = ScopeSet{Scope::kJobsRead, Scope::kJobsWrite};
  IDENTITY_EXPECT_CODE(admin_->Issue(wider, "local"), kInvalidArgument);
  IssueRequest uses = Request(Role::kViewer, "search", "bob");
  uses.uses = 3;
  IDENTITY_EXPECT_CODE(admin_->Issue(uses, "local"), kInvalidArgument);
  IssueRequest negative = Request(Role::kViewer, "search", "bob");
  negative.ttl = -absl::Hours(1);
  IDENTITY_EXPECT_CODE(admin_->Issue(negative, "local"), kInvalidArgument);
  // Nothing was stored by any refusal.
  EXPECT_TRUE(store_->ListTokens({})->empty());
}

TEST_F(IdentityAdminTest, TheStoreKeepsOnlyTheHashAndTheRecordSaysWhoIssuedIt) {
  MustCreateTeam("search");
  IssueRequest narrow = Request(Role::kSubmitter, "search", "ci");
  narrow.scopes = ScopeSet{Scope::kJobsRead};
  absl::StatusOr<IssuedToken> issued = admin_->Issue(narrow, "tok-0123456789ab");
  ASSERT_TRUE(issued.ok()) << issued.status();
  absl::StatusOr<TokenRecord> stored = store_->GetToken(issued->record.id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->secret_hash, token::Hash(issued->text));
  EXPECT_EQ(stored->created_by, "tok-0123456789ab");
  EXPECT_EQ(stored->scopes, ScopeSet{Scope::kJobsRead});
  EXPECT_EQ(stored->expires_at, clock_.Now() + IdentityPolicy().team_token_ttl);
  absl::StatusOr<std::vector<TokenRecord>> tokens = store_->ListTokens({});  // held: the loop reads into it
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  for (const TokenRecord& record : *tokens) {
    EXPECT_EQ(record.secret_hash.find(issued->text), std::string::npos);
    EXPECT_NE(record.principal, issued->text);
  }
  Authenticator auth(store_.get(), &clock_);
  IDENTITY_EXPECT_CODE(auth.Authorize(issued->text, Scope::kJobsWrite), kPermissionDenied);
}

TEST_F(IdentityAdminTest, AJoinTokenExpiresInADayAndEnrolsAsManyExecutorsAsItsUses) {
  IssueRequest join = Request(Role::kJoin, "", "rack-7");
  join.uses = 2;
  absl::StatusOr<IssuedToken> issued = admin_->Issue(join, "local");
  ASSERT_TRUE(issued.ok()) << issued.status();
  EXPECT_EQ(issued->record.expires_at, clock_.Now() + IdentityAdmin::kDefaultJoinTtl);
  EXPECT_EQ(issued->record.uses_left, 2);

  ExecutorInfo info;
  info.name = "mac-1";
  absl::StatusOr<Enrolment> first = admin_->Enrol(issued->text, info);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<Enrolment> second = admin_->Enrol(issued->text, info);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(first->executor.id, second->executor.id);
  // Each credential is bound to its own executor.
  Authenticator auth(store_.get(), &clock_);
  absl::StatusOr<Caller> caller = auth.Authorize(first->credential.text, Scope::kExecutor);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->executor_id(), first->executor.id);
  EXPECT_EQ(auth.Authenticate(second->credential.text)->executor_id(), second->executor.id);
  // Used up.
  IDENTITY_EXPECT_CODE(admin_->Enrol(issued->text, info), kUnauthenticated);
  // Another kind of token, or no token at all, cannot enrol.
  IssuedToken admin = MustIssue(Role::kAdmin, "", "root");
  IDENTITY_EXPECT_CODE(admin_->Enrol(admin.text, info), kUnauthenticated);
  IDENTITY_EXPECT_CODE(admin_->Enrol("", info), kUnauthenticated);
  EXPECT_EQ(store_->ListExecutors()->size(), 2u);
}

TEST_F(IdentityAdminTest, AnExpiredJoinTokenEnrolsNobody) {
  IssueRequest join = Request(Role::kJoin, "", "rack-7");
  join.ttl = absl::Minutes(5);
  absl::StatusOr<IssuedToken> issued = admin_->Issue(join, "local");
  ASSERT_TRUE(issued.ok());
  clock_.Advance(absl::Minutes(5));
  absl::StatusOr<Enrolment> late = admin_->Enrol(issued->text, ExecutorInfo{});
  IDENTITY_EXPECT_CODE(late, kUnauthenticated);
  EXPECT_THAT(MessageOf(late), HasSubstr("expired"));
  EXPECT_TRUE(store_->ListExecutors()->empty());
}

// 40.3 / 40.7i: a team's token issued without a lifetime expires after the policy's default; one
// that never expires must be asked for, and a join token cannot be one.
TEST_F(IdentityAdminTest, TeamTokensExpireByDefaultAndNeverOnlyWhenAskedFor) {
  MustCreateTeam("search");
  IssuedToken plain = MustIssue(Role::kViewer, "search", "bob");
  EXPECT_EQ(plain.record.expires_at, clock_.Now() + absl::Hours(24 * 90));
  IssueRequest forever = Request(Role::kSubmitter, "search", "ci");
  forever.ttl = absl::InfiniteDuration();
  absl::StatusOr<IssuedToken> issued = admin_->Issue(forever, "local");
  ASSERT_TRUE(issued.ok()) << issued.status();
  EXPECT_FALSE(store_->GetToken(issued->record.id)->expires_at.has_value());
  IssueRequest join_forever = Request(Role::kJoin, "", "rack");
  join_forever.ttl = absl::InfiniteDuration();
  IDENTITY_EXPECT_CODE(admin_->Issue(join_forever, "local"), kInvalidArgument);
  // The admin's default, and none at all (0).
  IdentityPolicy week;
  week.team_token_ttl = absl::Hours(24 * 7);
  IdentityAdmin weekly(store_.get(), &clock_, week);
  EXPECT_EQ(weekly.Issue(Request(Role::kViewer, "search", "carol"), "local")->record.expires_at,
            clock_.Now() + absl::Hours(24 * 7));
  IdentityPolicy none;
  none.team_token_ttl = absl::ZeroDuration();
  IdentityAdmin lasting(store_.get(), &clock_, none);
  EXPECT_FALSE(lasting.Issue(Request(Role::kViewer, "search", "dan"), "local")->record.expires_at.has_value());
  // Admin and monitor tokens are not a team's: they keep no default lifetime.
  EXPECT_FALSE(MustIssue(Role::kMonitor, "", "prometheus").record.expires_at.has_value());
  clock_.Advance(absl::Hours(24 * 90));
  Authenticator auth(store_.get(), &clock_);
  absl::StatusOr<Caller> expired = auth.Authenticate(plain.text);
  IDENTITY_EXPECT_CODE(expired, kUnauthenticated);
  EXPECT_THAT(MessageOf(expired), HasSubstr("expired"));
}

// 40.3: an executor credential has a lifetime; it is exchanged, while still usable, for a new one
// of the same executor and scopes, and the old one then ends after the grace.
TEST_F(IdentityAdminTest, AnExecutorCredentialIsExchangedOnlyWhileUsableAndTheOldOneEndsAfterTheGrace) {
  IdentityPolicy policy;
  policy.executor_credential_ttl = absl::Hours(24);
  policy.rotation_grace = absl::Minutes(10);
  IdentityAdmin admin(store_.get(), &clock_, policy);
  IssueRequest join = Request(Role::kJoin, "", "rack");
  join.scopes = ScopeSet{Scope::kEnrol, Scope::kGang};
  absl::StatusOr<IssuedToken> join_token = admin.Issue(join, "local");
  ASSERT_TRUE(join_token.ok()) << join_token.status();
  ExecutorInfo info;
  info.name = "mac-1";
  absl::StatusOr<Enrolment> enrolled = admin.Enrol(join_token->text, info);
  ASSERT_TRUE(enrolled.ok()) << enrolled.status();
  const TokenRecord& first = enrolled->credential.record;
  EXPECT_EQ(first.expires_at, clock_.Now() + absl::Hours(24));
  EXPECT_EQ(admin.RotateAt(first.created_at, first.expires_at), clock_.Now() + absl::Hours(12));

  clock_.Advance(absl::Hours(12));
  absl::StatusOr<IssuedToken> second = admin.RotateExecutorCredential(enrolled->executor.id, first.id);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->record.principal, enrolled->executor.id);
  EXPECT_EQ(second->record.scopes, first.scopes);  // the gang scope kept, nothing gained
  EXPECT_EQ(second->record.created_by, first.id);
  EXPECT_EQ(second->record.expires_at, clock_.Now() + absl::Hours(24));
  EXPECT_EQ(store_->GetToken(first.id)->expires_at, clock_.Now() + absl::Minutes(10));
  Authenticator auth(store_.get(), &clock_);
  EXPECT_TRUE(auth.Authenticate(enrolled->credential.text).ok());  // within the grace
  ASSERT_TRUE(auth.Authenticate(second->text).ok());
  EXPECT_EQ(auth.Authenticate(second->text)->executor_id(), enrolled->executor.id);

  // Another executor's credential, or another role's, is not exchanged for this executor.
  IssuedToken viewer = MustIssue(Role::kMonitor, "", "prometheus");
  IDENTITY_EXPECT_CODE(admin.RotateExecutorCredential(enrolled->executor.id, viewer.record.id), kFailedPrecondition);
  clock_.Advance(absl::Minutes(10));
  // After the grace the old one is refused, and cannot be exchanged again.
  absl::StatusOr<Caller> old = auth.Authenticate(enrolled->credential.text);
  IDENTITY_EXPECT_CODE(old, kUnauthenticated);
  EXPECT_THAT(MessageOf(old), HasSubstr("expired"));
  IDENTITY_EXPECT_CODE(admin.RotateExecutorCredential(enrolled->executor.id, first.id), kUnauthenticated);
  // An expired credential is refused, saying what to do.
  clock_.Advance(absl::Hours(24));
  absl::StatusOr<Caller> late = auth.Authenticate(second->text);
  IDENTITY_EXPECT_CODE(late, kUnauthenticated);
  EXPECT_THAT(MessageOf(late), HasSubstr("enrols again"));
  IDENTITY_EXPECT_CODE(admin.RotateExecutorCredential(enrolled->executor.id, second->record.id), kUnauthenticated);
  TokenFilter executors;
  executors.role = Role::kExecutor;
  executors.include_revoked = true;
  EXPECT_EQ(store_->ListTokens(executors)->size(), 2u);  // no refusal stored anything
}

// A revoked executor exchanges nothing, even with a credential that has not expired.
TEST_F(IdentityAdminTest, ARevokedExecutorCannotExchangeItsCredential) {
  IssuedToken join = MustIssue(Role::kJoin, "", "rack");
  absl::StatusOr<Enrolment> enrolled = admin_->Enrol(join.text, ExecutorInfo{});
  ASSERT_TRUE(enrolled.ok()) << enrolled.status();
  ASSERT_TRUE(store_->RevokeExecutor(enrolled->executor.id, clock_.Now()).ok());
  IDENTITY_EXPECT_CODE(admin_->RotateExecutorCredential(enrolled->executor.id, enrolled->credential.record.id),
                       kUnauthenticated);
  IDENTITY_EXPECT_CODE(admin_->RotateExecutorCredential("exe-nobody", enrolled->credential.record.id), kNotFound);
}

// 40.5b: a team created without limits gets safe ones; an admin may set others, or none (0).
TEST_F(IdentityAdminTest, ANewTeamGetsSafeDefaultLimits) {
  Team plain;
  plain.name = "plain";
  absl::StatusOr<Team> created = admin_->CreateTeam(plain);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->max_active_jobs, IdentityAdmin::kDefaultMaxActiveJobs);
  EXPECT_EQ(created->requests_per_second, IdentityAdmin::kDefaultRequestsPerSecond);
  EXPECT_EQ(created->max_running_tasks, IdentityAdmin::kDefaultMaxRunningTasks);
  EXPECT_EQ(created->max_file_bytes, IdentityAdmin::kDefaultMaxFileBytes);
  EXPECT_EQ(created->max_model_bytes, IdentityAdmin::kDefaultMaxModelBytes);
  EXPECT_EQ(created->max_result_bytes, IdentityAdmin::kDefaultMaxResultBytes);
  EXPECT_EQ(store_->GetTeam("plain")->max_active_jobs, IdentityAdmin::kDefaultMaxActiveJobs);
  EXPECT_EQ(store_->GetTeam("plain")->max_file_bytes, IdentityAdmin::kDefaultMaxFileBytes);
  Team chosen;
  chosen.name = "chosen";
  chosen.max_active_jobs = 7;
  created = admin_->CreateTeam(chosen);
  ASSERT_TRUE(created.ok());
  EXPECT_EQ(created->max_active_jobs, 7);
  // An admin lifts a limit on purpose.
  Team lifted = *created;
  lifted.max_running_tasks = 0;
  lifted.max_model_bytes = 0;
  ASSERT_TRUE(admin_->UpdateTeam(lifted).ok());
  EXPECT_EQ(store_->GetTeam("chosen")->max_running_tasks, 0);
  EXPECT_EQ(store_->GetTeam("chosen")->max_model_bytes, 0);
  Team negative;
  negative.name = "negative";
  negative.max_result_bytes = -1;
  EXPECT_FALSE(admin_->CreateTeam(negative).ok());
}

// Issue 38: a team's spot-check fraction is the fleet's (0) or 0.01 to 1. Nothing switches its
// checks off: a team without them is where a forging executor would forge.
TEST_F(IdentityAdminTest, ATeamsVerifyFractionIsTheFleetsOrWithinItsBounds) {
  Team team;
  team.name = "checked";
  absl::StatusOr<Team> created = admin_->CreateTeam(team);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->verify_fraction, 0);  // the fleet's
  for (double fraction : {0.01, 0.5, 1.0, 0.0}) {
    Team set = *created;
    set.verify_fraction = fraction;
    ASSERT_TRUE(admin_->UpdateTeam(set).ok()) << fraction;
    EXPECT_EQ(store_->GetTeam("checked")->verify_fraction, fraction);
  }
  for (double fraction : {0.009, 1e-9, -0.5, 1.01, std::nan(""), std::numeric_limits<double>::infinity()}) {
    Team set = *created;
    set.verify_fraction = fraction;
    IDENTITY_EXPECT_CODE(admin_->UpdateTeam(set), kInvalidArgument);
    set.name = "other";
    IDENTITY_EXPECT_CODE(admin_->CreateTeam(set), kInvalidArgument);
  }
  EXPECT_EQ(store_->GetTeam("checked")->verify_fraction, 0);
}

TEST_F(IdentityAdminTest, TeamsAreValidated) {
  Team bad;
  bad.name = "Search Team";
  IDENTITY_EXPECT_CODE(admin_->CreateTeam(bad), kInvalidArgument);
  Team negative;
  negative.name = "search";
  negative.max_active_jobs = -1;
  IDENTITY_EXPECT_CODE(admin_->CreateTeam(negative), kInvalidArgument);
  Team team = MustCreateTeam("search", 5, 3);
  team.requests_per_second = 9;
  absl::StatusOr<Team> updated = admin_->UpdateTeam(team);
  ASSERT_TRUE(updated.ok());
  EXPECT_EQ(updated->requests_per_second, 9);
  EXPECT_EQ(updated->max_priority, 3);
}

}  // namespace
}  // namespace minions::testing
