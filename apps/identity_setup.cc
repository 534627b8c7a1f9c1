#include "identity_setup.h"

#include "absl/strings/str_cat.h"
#include "cli/credentials.h"
#include "common/logging.h"
#include "identity/authenticator.h"
#include "identity/identity_admin.h"
#include "server/admin_service.h"
#include "server/proto_convert.h"

namespace minions::apps {
namespace {

class LocalAdminBackend : public cli::AdminBackend {
 public:
  LocalAdminBackend(MetadataStore* store, Clock* clock) : store_(store), clock_(clock), identities_(store, clock) {}

  absl::StatusOr<v1::Team> CreateTeam(const v1::Team& team) override {
    auto created = identities_.CreateTeam(FromProto(team));
    if (!created.ok()) return created.status();
    return ToProto(*created);
  }
  absl::StatusOr<v1::Team> UpdateTeam(const v1::Team& team) override {
    auto updated = identities_.UpdateTeam(FromProto(team));
    if (!updated.ok()) return updated.status();
    return ToProto(*updated);
  }
  absl::StatusOr<std::vector<v1::Team>> ListTeams() override {
    return TeamsWithStanding(*store_, clock_->Now());
  }
  absl::StatusOr<v1::IssuedToken> IssueToken(const v1::IssueTokenRequest& request) override {
    auto issued = minions::IssueToken(identities_, request, "local");
    if (!issued.ok()) return issued.status();
    return ToProto(*issued);
  }
  absl::StatusOr<std::vector<v1::TokenInfo>> ListTokens(const v1::ListTokensRequest& request) override {
    return minions::ListTokens(*store_, request);
  }
  absl::StatusOr<v1::TokenInfo> RevokeToken(const std::string& token_id) override {
    auto token = store_->RevokeToken(token_id, clock_->Now());
    if (!token.ok()) return token.status();
    return ToProto(*token);
  }
  absl::StatusOr<v1::Executor> RevokeExecutor(const std::string& executor_id) override {
    return Apply(ExecutorVerb::kRevoke, executor_id);
  }
  absl::StatusOr<v1::Executor> ReleaseExecutor(const std::string& executor_id) override {
    return Apply(ExecutorVerb::kRelease, executor_id);
  }
  absl::StatusOr<v1::Executor> ApproveExecutor(const std::string& executor_id) override {
    return Apply(ExecutorVerb::kApprove, executor_id);
  }
  absl::StatusOr<v1::TokenInfo> WhoAmI() override {
    return absl::FailedPreconditionError("on the server's own data there is no token: you are its operator");
  }

 private:
  absl::StatusOr<v1::Executor> Apply(ExecutorVerb verb, const std::string& executor_id) {
    auto executor = ApplyToExecutor(*store_, verb, executor_id, clock_->Now());
    if (!executor.ok()) return executor.status();
    return ToProto(*executor);
  }

  MetadataStore* store_;
  Clock* clock_;
  IdentityAdmin identities_;
};

}  // namespace

absl::StatusOr<std::string> EnsureAdminToken(MetadataStore* store, Clock* clock, const std::string& path) {
  Authenticator auth(store, clock);
  if (absl::StatusOr<std::string> existing = cli::ReadTokenFile(path); existing.ok()) {
    absl::StatusOr<Caller> caller = auth.Authenticate(*existing);
    if (caller.ok() && caller->IsAdmin()) return *existing;
  }
  TokenFilter admins;
  admins.role = Role::kAdmin;
  absl::StatusOr<std::vector<TokenRecord>> tokens = store->ListTokens(admins);
  if (!tokens.ok()) return tokens.status();
  for (const TokenRecord& token : *tokens) {
    if (CheckUsable(token, clock->Now()).ok()) {
      return absl::NotFoundError(absl::StrCat("the pool has admin tokens already; none is in ", path));
    }
  }
  IdentityAdmin identities(store, clock);
  IssueRequest request;
  request.role = Role::kAdmin;
  request.principal = "bootstrap";
  absl::StatusOr<IssuedToken> issued = identities.Issue(request, "local");
  if (!issued.ok()) return issued.status();
  if (absl::Status written = cli::WriteTokenFile(path, issued->text); !written.ok()) {
    (void)store->RevokeToken(issued->record.id, clock->Now());  // nobody could ever use it
    return written;
  }
  MINIONS_LOG(Info) << "the pool had no admin token: token=" << issued->record.id << " written to " << path
                    << " (mode 0600)";
  return issued->text;
}

std::unique_ptr<cli::AdminBackend> LocalAdmin(MetadataStore* store, Clock* clock) {
  return std::make_unique<LocalAdminBackend>(store, clock);
}

}  // namespace minions::apps
