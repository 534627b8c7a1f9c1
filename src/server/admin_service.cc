#include "server/admin_service.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/call_auth.h"
#include "server/model_registry.h"
#include "server/proto_convert.h"

namespace minions {
namespace {

#define ADMIN_OR_RETURN(context)                                                       \
  absl::StatusOr<Caller> caller_or = AuthorizeCall(context, *auth_, Scope::kAdmin);    \
  if (!caller_or.ok()) return ToGrpc(caller_or.status());                              \
  const Caller& caller = *caller_or;                                                   \
  (void)caller /* a verb that logs no caller */

}  // namespace

absl::StatusOr<IssueRequest> FromProto(const v1::IssueTokenRequest& p) {
  IssueRequest request;
  std::optional<Role> role = ParseRole(p.role());
  if (!role) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown role '", p.role(), "': admin, submitter, viewer, monitor or join"));
  }
  request.role = *role;
  request.team = p.team();
  request.principal = p.principal();
  if (p.ttl_ms() < 0) return absl::InvalidArgumentError("a token's lifetime must be positive");
  if (p.ttl_ms() > 0) request.ttl = absl::Milliseconds(p.ttl_ms());
  if (p.no_expiry()) {
    if (p.ttl_ms() != 0) return absl::InvalidArgumentError("a token has a lifetime or none, not both");
    request.ttl = absl::InfiniteDuration();
  }
  request.uses = p.uses();
  if (!p.scopes().empty()) {
    ScopeSet scopes;
    if (absl::Status parsed = ParseScopes(p.scopes(), &scopes); !parsed.ok()) return parsed;
    request.scopes = scopes;
  }
  return request;
}

absl::StatusOr<TokenFilter> FromProto(const v1::ListTokensRequest& request) {
  TokenFilter filter;
  filter.team = request.team();
  if (!request.role().empty()) {
    filter.role = ParseRole(request.role());
    if (!filter.role) return absl::InvalidArgumentError(absl::StrCat("unknown role '", request.role(), "'"));
  }
  filter.principal = request.principal();
  filter.include_revoked = request.include_revoked();
  return filter;
}

absl::StatusOr<IssuedToken> IssueToken(IdentityAdmin& identities, const v1::IssueTokenRequest& request,
                                       const std::string& issuer) {
  absl::StatusOr<IssueRequest> issue = FromProto(request);
  if (!issue.ok()) return issue.status();
  return identities.Issue(*issue, issuer);
}

v1::IssuedToken ToProto(const IssuedToken& issued) {
  v1::IssuedToken out;
  *out.mutable_info() = ToProto(issued.record);
  out.set_token(issued.text);
  return out;
}

absl::StatusOr<std::vector<v1::TokenInfo>> ListTokens(MetadataStore& store, const v1::ListTokensRequest& request) {
  absl::StatusOr<TokenFilter> filter = FromProto(request);
  if (!filter.ok()) return filter.status();
  absl::StatusOr<std::vector<TokenRecord>> tokens = store.ListTokens(*filter);
  if (!tokens.ok()) return tokens.status();
  std::vector<v1::TokenInfo> out;
  for (const TokenRecord& token : *tokens) out.push_back(ToProto(token));
  return out;
}

absl::StatusOr<Executor> ApplyToExecutor(MetadataStore& store, ExecutorVerb verb, const std::string& executor_id,
                                         absl::Time now) {
  switch (verb) {
    case ExecutorVerb::kRevoke:
      return store.RevokeExecutor(executor_id, now);
    case ExecutorVerb::kRelease:
      return store.ReleaseExecutor(executor_id, now);
    case ExecutorVerb::kApprove:
      return store.ApproveExecutor(executor_id, now);
  }
  return absl::InvalidArgumentError("unknown executor verb");
}

absl::StatusOr<std::vector<v1::Team>> TeamsWithStanding(MetadataStore& store, absl::Time now) {
  absl::StatusOr<std::vector<Team>> teams = store.ListTeams();
  if (!teams.ok()) return teams.status();
  absl::StatusOr<std::vector<TeamUsage>> usage = store.ListTeamUsage(now);
  if (!usage.ok()) return usage.status();
  absl::StatusOr<std::vector<ModelRecord>> models = store.ListModels("");
  if (!models.ok()) return models.status();
  const std::map<std::string, int64_t> model_bytes = ModelBytesByTeam(*models);
  const std::map<std::string, double> targets = TargetShares(*usage);
  double total = 0;
  for (const TeamUsage& u : *usage) total += absl::ToDoubleSeconds(u.usage);
  std::vector<v1::Team> out;
  for (const Team& team : *teams) {
    v1::Team& p = out.emplace_back(ToProto(team));
    if (auto it = model_bytes.find(team.name); it != model_bytes.end()) p.set_model_bytes(it->second);
    for (const TeamUsage& u : *usage) {
      if (u.team != team.name) continue;
      v1::TeamUsage* standing = p.mutable_usage();
      standing->set_usage_device_seconds(absl::ToDoubleSeconds(u.usage));
      standing->set_running_tasks(u.running);
      standing->set_target_share(targets.at(u.team));
      standing->set_usage_share(total > 0 ? absl::ToDoubleSeconds(u.usage) / total : 0);
      standing->set_device_seconds(absl::ToDoubleSeconds(u.device_time));
    }
  }
  return out;
}

grpc::Status AdminService::CreateTeam(grpc::ServerContext* context, const v1::CreateTeamRequest* request,
                                      v1::Team* reply) {
  ADMIN_OR_RETURN(context);
  absl::StatusOr<Team> team = identities_->CreateTeam(minions::FromProto(request->team()));
  if (!team.ok()) return ToGrpc(team.status());
  MINIONS_LOG(Info) << "team " << team->name << " created by " << caller.Describe();
  *reply = ToProto(*team);
  return grpc::Status::OK;
}

grpc::Status AdminService::UpdateTeam(grpc::ServerContext* context, const v1::UpdateTeamRequest* request,
                                      v1::Team* reply) {
  ADMIN_OR_RETURN(context);
  absl::StatusOr<Team> team = identities_->UpdateTeam(minions::FromProto(request->team()));
  if (!team.ok()) return ToGrpc(team.status());
  MINIONS_LOG(Info) << "team " << team->name << " updated by " << caller.Describe();
  *reply = ToProto(*team);
  return grpc::Status::OK;
}

grpc::Status AdminService::ListTeams(grpc::ServerContext* context, const v1::ListTeamsRequest*,
                                     v1::ListTeamsResponse* reply) {
  ADMIN_OR_RETURN(context);
  absl::StatusOr<std::vector<v1::Team>> teams = TeamsWithStanding(*store_, clock_->Now());
  if (!teams.ok()) return ToGrpc(teams.status());
  for (v1::Team& team : *teams) *reply->add_teams() = std::move(team);
  return grpc::Status::OK;
}

grpc::Status AdminService::IssueToken(grpc::ServerContext* context, const v1::IssueTokenRequest* request,
                                      v1::IssuedToken* reply) {
  ADMIN_OR_RETURN(context);
  absl::StatusOr<IssuedToken> issued = minions::IssueToken(*identities_, *request, caller.token_id);
  if (!issued.ok()) return ToGrpc(issued.status());
  MINIONS_LOG(Info) << "token=" << issued->record.id << " (" << RoleName(issued->record.role) << " "
                    << issued->record.principal << (issued->record.team.empty() ? "" : "@" + issued->record.team)
                    << ") issued by " << caller.Describe();
  *reply = ToProto(*issued);
  return grpc::Status::OK;
}

grpc::Status AdminService::ListTokens(grpc::ServerContext* context, const v1::ListTokensRequest* request,
                                      v1::ListTokensResponse* reply) {
  ADMIN_OR_RETURN(context);
  absl::StatusOr<std::vector<v1::TokenInfo>> tokens = minions::ListTokens(*store_, *request);
  if (!tokens.ok()) return ToGrpc(tokens.status());
  for (v1::TokenInfo& token : *tokens) *reply->add_tokens() = std::move(token);
  return grpc::Status::OK;
}

grpc::Status AdminService::RevokeToken(grpc::ServerContext* context, const v1::RevokeTokenRequest* request,
                                       v1::TokenInfo* reply) {
  ADMIN_OR_RETURN(context);
  absl::StatusOr<TokenRecord> token = store_->RevokeToken(request->token_id(), clock_->Now());
  if (!token.ok()) return ToGrpc(token.status());
  auth_->Forget(token->id);
  MINIONS_LOG(Info) << "token=" << token->id << " revoked by " << caller.Describe();
  *reply = ToProto(*token);
  return grpc::Status::OK;
}

grpc::Status AdminService::RevokeExecutor(grpc::ServerContext* context, const v1::RevokeExecutorRequest* request,
                                          v1::Executor* reply) {
  return ApplyToExecutor(context, ExecutorVerb::kRevoke, request->executor_id(), reply);
}

grpc::Status AdminService::ReleaseExecutor(grpc::ServerContext* context, const v1::ReleaseExecutorRequest* request,
                                           v1::Executor* reply) {
  return ApplyToExecutor(context, ExecutorVerb::kRelease, request->executor_id(), reply);
}

grpc::Status AdminService::ApproveExecutor(grpc::ServerContext* context, const v1::ApproveExecutorRequest* request,
                                           v1::Executor* reply) {
  return ApplyToExecutor(context, ExecutorVerb::kApprove, request->executor_id(), reply);
}

grpc::Status AdminService::ApplyToExecutor(grpc::ServerContext* context, ExecutorVerb verb,
                                           const std::string& executor_id, v1::Executor* reply) {
  ADMIN_OR_RETURN(context);
  absl::StatusOr<Executor> executor = minions::ApplyToExecutor(*store_, verb, executor_id, clock_->Now());
  if (!executor.ok()) return ToGrpc(executor.status());
  // A revoked executor's credentials stop working here at once; its tasks are leasable again. A
  // released or approved one may lease again. Either way: wake the waiting polls.
  if (verb == ExecutorVerb::kRevoke) auth_->ForgetExecutor(executor->id);
  if (work_added_) work_added_();
  switch (verb) {
    case ExecutorVerb::kRevoke:
      MINIONS_LOG(Info) << "executor=" << executor->id << " revoked by " << caller.Describe();
      break;
    case ExecutorVerb::kRelease:
      MINIONS_LOG(Info) << "executor=" << executor->id << " released from quarantine by " << caller.Describe();
      break;
    case ExecutorVerb::kApprove:
      MINIONS_LOG(Info) << "executor=" << executor->id << " (" << executor->info.name << ") approved by "
                        << caller.Describe();
      break;
  }
  *reply = ToProto(*executor);
  return grpc::Status::OK;
}

grpc::Status AdminService::WhoAmI(grpc::ServerContext* context, const v1::WhoAmIRequest*, v1::TokenInfo* reply) {
  absl::StatusOr<Caller> caller = auth_->Authenticate(BearerToken(context));
  if (!caller.ok()) return ToGrpc(caller.status());
  absl::StatusOr<TokenRecord> token = store_->GetToken(caller->token_id);
  if (!token.ok()) return ToGrpc(token.status());
  *reply = ToProto(*token);
  return grpc::Status::OK;
}

}  // namespace minions
