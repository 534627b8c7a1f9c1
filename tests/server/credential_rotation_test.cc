// Executor credentials that expire, and their rotation without an operator (issue 40, point 3;
// docs/security.md, "Credential lifetimes"): the gRPC service (Executors.RotateCredential and what
// Enrol and Register say of the lifetime), each refusal, and the executor's gRPC client exchanging
// its credential on its own and writing it to its state folder. The server runs on the fake clock.

#include "common/private_files.h"
#include "executor/control_plane_client.h"
#include "grpc_service_fixture.h"

namespace minions::testing {
namespace {

class CredentialRotationTest : public GrpcServiceTest {
 protected:
  grpc::Status Rotate(const std::string& credential, v1::RotateCredentialResponse* reply,
                      const std::string& executor_id = "") {
    v1::RotateCredentialRequest request;
    request.set_executor_id(executor_id);
    return executors_->RotateCredential(Context(&credential).get(), request, reply);
  }
  grpc::Status Beat(const std::string& credential) {
    v1::HeartbeatRequest beat;
    beat.set_state("available");
    v1::HeartbeatResponse reply;
    return executors_->Heartbeat(Context(&credential).get(), beat, &reply);
  }
  size_t ExecutorTokens() {
    TokenFilter filter;
    filter.role = Role::kExecutor;
    filter.include_revoked = true;
    absl::StatusOr<std::vector<TokenRecord>> tokens = store_->ListTokens(filter);
    EXPECT_TRUE(tokens.ok()) << tokens.status();
    return tokens.ok() ? tokens->size() : 0;
  }
};

TEST_F(CredentialRotationTest, EnrolmentSaysWhenTheCredentialExpiresAndRegistrationWhenToExchangeIt) {
  StartServer();
  v1::EnrolRequest enrol;
  enrol.mutable_capabilities()->set_name("e");
  v1::EnrolResponse enrolled;
  ASSERT_GRPC_OK(executors_->Enrol(Context(&join_token_).get(), enrol, &enrolled));
  EXPECT_EQ(enrolled.credential_expires_at_ms(), absl::ToUnixMillis(fake_clock_.Now() + absl::Hours(24 * 30)));
  fake_clock_.Advance(absl::Hours(1));
  v1::RegisterRequest registration;
  registration.mutable_capabilities()->set_name("e");
  v1::RegisterResponse registered;
  ASSERT_GRPC_OK(executors_->Register(Context(&enrolled.credential()).get(), registration, &registered));
  EXPECT_TRUE(registered.credential_rotates());
  EXPECT_EQ(registered.credential_rotate_in_ms(), absl::ToInt64Milliseconds(absl::Hours(24 * 15 - 1)));
}

TEST_F(CredentialRotationTest, TheNewCredentialWorksAtOnceAndTheOldOneUntilItsGraceEnds) {
  StartServer();
  const std::string executor = RegisterExecutor("e");
  const std::string old = credentials_[executor];
  const TokenRecord old_record = *store_->FindToken(token::Hash(old));
  v1::RotateCredentialResponse rotated;
  ASSERT_GRPC_OK(Rotate(old, &rotated, executor));
  const std::string renewed = rotated.credential();
  ASSERT_FALSE(renewed.empty());
  EXPECT_NE(renewed, old);
  EXPECT_EQ(rotated.expires_at_ms(), absl::ToUnixMillis(fake_clock_.Now() + absl::Hours(24 * 30)));
  EXPECT_TRUE(rotated.rotates());
  EXPECT_EQ(rotated.rotate_in_ms(), absl::ToInt64Milliseconds(absl::Hours(24 * 15)));
  EXPECT_EQ(rotated.old_expires_at_ms(), absl::ToUnixMillis(fake_clock_.Now() + absl::Minutes(10)));
  absl::StatusOr<TokenRecord> fresh = store_->FindToken(token::Hash(rotated.credential()));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->principal, executor);
  EXPECT_EQ(fresh->scopes, old_record.scopes);
  EXPECT_EQ(fresh->created_by, old_record.id);
  ASSERT_GRPC_OK(Beat(rotated.credential()));
  ASSERT_GRPC_OK(Beat(old));  // calls and streams opened with it go on during the grace
  fake_clock_.Advance(absl::Minutes(10));
  EXPECT_GRPC_ERROR(Beat(old), UNAUTHENTICATED, "expired");
  // Nor is it exchanged again once its grace has ended.
  EXPECT_GRPC_ERROR(Rotate(old, &rotated), UNAUTHENTICATED, "expired");
  ASSERT_GRPC_OK(Beat(renewed));
  EXPECT_EQ(ExecutorTokens(), 2u);
}

TEST_F(CredentialRotationTest, AnExpiredCredentialIsRefusedSayingWhatToDoAndIsNotExchanged) {
  StartServer();
  const std::string executor = RegisterExecutor("e");
  fake_clock_.Advance(absl::Hours(24 * 30));
  EXPECT_GRPC_ERROR(Beat(credentials_[executor]), UNAUTHENTICATED, "expired");
  EXPECT_GRPC_ERROR(Beat(credentials_[executor]), UNAUTHENTICATED, "enrols again with a new join token");
  v1::RotateCredentialResponse rotated;
  EXPECT_GRPC_ERROR(Rotate(credentials_[executor], &rotated), UNAUTHENTICATED, "expired");
  EXPECT_TRUE(rotated.credential().empty());
  EXPECT_EQ(ExecutorTokens(), 1u);
}

TEST_F(CredentialRotationTest, OnlyAnExecutorsOwnUsableCredentialIsExchanged) {
  StartServer();
  const std::string executor = RegisterExecutor("e");
  const std::string other = RegisterExecutor("other");
  v1::RotateCredentialResponse rotated;
  // No credential, a made-up one, an admin's, a join token: nothing to exchange.
  EXPECT_GRPC_ERROR(Rotate("", &rotated), UNAUTHENTICATED, "");
  EXPECT_GRPC_ERROR(Rotate(token::Mint(Role::kExecutor).text, &rotated), UNAUTHENTICATED, "");
  EXPECT_GRPC_ERROR(Rotate(token_, &rotated), PERMISSION_DENIED, "");
  EXPECT_GRPC_ERROR(Rotate(join_token_, &rotated), PERMISSION_DENIED, "");
  // One executor's credential naming another executor.
  EXPECT_GRPC_ERROR(Rotate(credentials_[executor], &rotated, other), PERMISSION_DENIED, "belongs to executor");
  // A revoked executor's.
  ASSERT_TRUE(store_->RevokeExecutor(other, fake_clock_.Now()).ok());
  EXPECT_GRPC_ERROR(Rotate(credentials_[other], &rotated), UNAUTHENTICATED, "revoked");
  EXPECT_TRUE(rotated.credential().empty());
  EXPECT_EQ(ExecutorTokens(), 2u);
}

// An executor enrolled while credentials never expired (or before lifetimes existed) is told to
// exchange its credential at once when the server gives them a lifetime; the executor's gRPC
// client then does so on its own, writes the new one to its state folder and goes on with it.
TEST_F(CredentialRotationTest, TheExecutorsClientExchangesItsCredentialWithoutAnOperator) {
  ServerOptions lasting = Options();
  lasting.executor_credential_ttl = absl::ZeroDuration();
  StartServer(&fake_clock_, lasting);
  const std::string executor = RegisterExecutor("e");
  const std::string old = credentials_[executor];
  EXPECT_FALSE(store_->FindToken(token::Hash(old))->expires_at.has_value());
  v1::RegisterResponse registered;
  v1::RegisterRequest registration;
  registration.mutable_capabilities()->set_name("e");
  ASSERT_GRPC_OK(executors_->Register(Context(&old).get(), registration, &registered));
  EXPECT_FALSE(registered.credential_rotates());

  server_->Shutdown();
  StartServer();  // lifetimes on (30 days)
  const std::string file = dir_.File("state/credential");
  ASSERT_TRUE(WritePrivateFile(file, old + "\n").ok());
  std::unique_ptr<ControlPlaneClient> client =
      MakeGrpcControlPlaneClient(rpc::MakeChannel(server_->address()), ExecutorCredentials{file, ""});
  ASSERT_OK_AND_ASSIGN(registered, client->Register(registration));
  EXPECT_TRUE(registered.credential_rotates());
  EXPECT_EQ(registered.credential_rotate_in_ms(), 0);
  v1::HeartbeatRequest beat;
  beat.set_state("available");
  ASSERT_OK(client->Heartbeat(beat).status());
  const std::string fresh = ReadFile(file).substr(0, ReadFile(file).find('\n'));
  ASSERT_NE(fresh, old);
  absl::StatusOr<TokenRecord> record = store_->FindToken(token::Hash(fresh));
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->principal, executor);
  EXPECT_EQ(record->expires_at, fake_clock_.Now() + absl::Hours(24 * 30));
  EXPECT_EQ(store_->FindToken(token::Hash(old))->expires_at, fake_clock_.Now() + absl::Minutes(10));
  // Past the grace, the old credential is refused; the client goes on with the new one, on a
  // heartbeat stream opened with it, and exchanges it no more until it is told to.
  fake_clock_.Advance(absl::Minutes(10));
  EXPECT_GRPC_ERROR(Beat(old), UNAUTHENTICATED, "expired");
  for (int i = 0; i < 3; ++i) ASSERT_OK(client->Heartbeat(beat).status());
  ASSERT_OK(client->CredentialRefused());
  EXPECT_EQ(ExecutorTokens(), 2u);
}

// Over the Admin service: a team's token issued without a lifetime gets the server's default
// (here a week); `no_expiry` asks for none, never for a join token nor together with a lifetime.
TEST_F(CredentialRotationTest, TeamTokensGetTheServersDefaultLifetimeAndNeverOnlyWhenAskedFor) {
  ServerOptions options = Options();
  options.team_token_ttl = absl::Hours(24 * 7);
  StartServer(&fake_clock_, options);
  Team team;
  team.name = "search";
  ASSERT_OK(server_->identities().CreateTeam(team).status());
  std::unique_ptr<v1::Admin::Stub> admin = v1::Admin::NewStub(rpc::MakeChannel(server_->address()));
  v1::IssueTokenRequest issue;
  issue.set_role("viewer");
  issue.set_team("search");
  issue.set_principal("bob");
  v1::IssuedToken issued;
  ASSERT_GRPC_OK(admin->IssueToken(Context().get(), issue, &issued));
  EXPECT_EQ(issued.info().expires_at_ms(), absl::ToUnixMillis(fake_clock_.Now() + absl::Hours(24 * 7)));
  issue.set_no_expiry(true);
  ASSERT_GRPC_OK(admin->IssueToken(Context().get(), issue, &issued));
  EXPECT_EQ(issued.info().expires_at_ms(), 0);
  issue.set_ttl_ms(60000);
  EXPECT_GRPC_ERROR(admin->IssueToken(Context().get(), issue, &issued), INVALID_ARGUMENT, "not both");
  v1::IssueTokenRequest join;
  join.set_role("join");
  join.set_principal("rack");
  join.set_no_expiry(true);
  EXPECT_GRPC_ERROR(admin->IssueToken(Context().get(), join, &issued), INVALID_ARGUMENT, "always expires");
  TokenFilter viewers;
  viewers.role = Role::kViewer;
  EXPECT_EQ(store_->ListTokens(viewers)->size(), 2u);
}

}  // namespace
}  // namespace minions::testing
