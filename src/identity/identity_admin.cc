#include "identity/identity_admin.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "identity/token.h"
#include "model/model_ref.h"
#include "model/placement.h"

namespace minions {

absl::Status IdentityAdmin::ValidateTeam(const Team& team) {
  RETURN_IF_ERROR(ValidateTeamName(team.name));
  if (team.max_priority < -1000000 || team.max_priority > 1000000) {
    return absl::InvalidArgumentError("a team's priority ceiling must be between -1000000 and 1000000");
  }
  if (team.max_active_jobs < 0 || team.requests_per_second < 0 || team.max_running_tasks < 0 ||
      team.max_file_bytes < 0 || team.max_model_bytes < 0 || team.max_result_bytes < 0) {
    return absl::InvalidArgumentError("a team's limits are 0 (none) or more");
  }
  if (team.weight < 1 || team.weight > kMaxTeamWeight) {
    return absl::InvalidArgumentError(
        absl::StrCat("a team's fair-share weight must be between 1 and ", kMaxTeamWeight));
  }
  if (team.runners.size() > kMaxClaimedRunners) {
    return absl::InvalidArgumentError(absl::StrCat("a team may be allowed ", kMaxClaimedRunners, " runners at most"));
  }
  for (const std::string& runner : team.runners) {
    if (absl::Status valid = ValidateRunnerName(runner); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("a team's runners: ", valid.message()));
    }
  }
  return ValidateVerifyFraction(team.verify_fraction);
}

absl::StatusOr<Team> IdentityAdmin::CreateTeam(Team team) {
  RETURN_IF_ERROR(ValidateTeam(team));
  // Limits on by default: a team nobody thought about cannot fill the queue or the fleet alone.
  if (team.max_active_jobs == 0) team.max_active_jobs = kDefaultMaxActiveJobs;
  if (team.requests_per_second == 0) team.requests_per_second = kDefaultRequestsPerSecond;
  if (team.max_running_tasks == 0) team.max_running_tasks = kDefaultMaxRunningTasks;
  // Nor fill the object store alone.
  if (team.max_file_bytes == 0) team.max_file_bytes = kDefaultMaxFileBytes;
  if (team.max_model_bytes == 0) team.max_model_bytes = kDefaultMaxModelBytes;
  if (team.max_result_bytes == 0) team.max_result_bytes = kDefaultMaxResultBytes;
  team.file_bytes = team.result_bytes = 0;  // the store's counts
  team.created_at = clock_->Now();
  return store_->CreateTeam(team);
}

absl::StatusOr<Team> IdentityAdmin::UpdateTeam(const Team& team) {
  RETURN_IF_ERROR(ValidateTeam(team));
  return store_->UpdateTeam(team);
}

absl::StatusOr<IssuedToken> IdentityAdmin::Issue(const IssueRequest& request, const std::string& issued_by) {
  if (request.role == Role::kExecutor) {
    return absl::InvalidArgumentError(
        "executor credentials are not issued: an executor enrols with a join token (`minions admin join-token`) "
        "and the server names it");
  }
  if (IsTeamRole(request.role)) {
    if (request.team.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("a ", std::string(RoleName(request.role)), " token belongs to a team: say --team"));
    }
    RETURN_IF_ERROR(ValidateTeamName(request.team));
  } else if (!request.team.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("a ", std::string(RoleName(request.role)), " token belongs to no team"));
  }
  RETURN_IF_ERROR(ValidatePrincipalName(request.principal));
  const ScopeSet allowed = GrantableScopes(request.role);
  if (request.scopes && (!allowed.Covers(*request.scopes) || request.scopes->bits() == 0 ||
                         (request.role == Role::kJoin && !request.scopes->Has(Scope::kEnrol)))) {
    return absl::InvalidArgumentError(absl::StrCat("a ", std::string(RoleName(request.role)), " token may hold some of: ",
                                                   ScopesToString(allowed)));
  }
  if (request.ttl && *request.ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("a token's lifetime must be positive");
  }
  if (request.ttl == absl::InfiniteDuration() && request.role == Role::kJoin) {
    return absl::InvalidArgumentError("a join token always expires: say how long it lives (--expires 24h)");
  }
  if (request.role != Role::kJoin && request.uses != 0) {
    return absl::InvalidArgumentError("only join tokens have a number of uses");
  }
  if (request.uses < 0 || request.uses > 100000) return absl::InvalidArgumentError("uses must be 1 to 100000");

  const absl::Time now = clock_->Now();
  token::Minted minted = token::Mint(request.role);
  IssuedToken issued;
  issued.text = std::move(minted.text);
  TokenRecord& record = issued.record;
  record.id = token::NewId("tok-");
  record.secret_hash = std::move(minted.secret_hash);
  record.role = request.role;
  record.team = request.team;
  record.principal = request.principal;
  record.scopes = request.scopes.value_or(DefaultScopes(request.role));  // the gang scope only when asked
  record.uses_left = request.role == Role::kJoin ? std::max<int64_t>(request.uses, 1) : -1;
  record.created_by = issued_by;
  record.created_at = now;
  if (request.ttl) {
    if (*request.ttl != absl::InfiniteDuration()) record.expires_at = now + *request.ttl;
  } else if (request.role == Role::kJoin) {
    record.expires_at = now + kDefaultJoinTtl;
  } else if (IsTeamRole(request.role) && policy_.team_token_ttl > absl::ZeroDuration()) {
    // A team's credential that nobody thought to limit does not outlive its holder's need for it.
    record.expires_at = now + policy_.team_token_ttl;
  }
  RETURN_IF_ERROR(store_->AddToken(record));
  return issued;
}

absl::StatusOr<Enrolment> IdentityAdmin::Enrol(const std::string& join_text, const ExecutorInfo& info) {
  absl::StatusOr<Role> role = token::Parse(join_text);
  if (!role.ok()) return absl::UnauthenticatedError(role.status().message());
  if (*role != Role::kJoin) {
    return absl::UnauthenticatedError("enrolment needs a join token (mnj_...): ask an admin for one");
  }
  if (auto s = ValidateExecutorName(info.name); !s.ok()) return s;
  const absl::Time now = clock_->Now();
  token::Minted minted = token::Mint(Role::kExecutor);
  Enrolment enrolment;
  enrolment.credential.text = std::move(minted.text);
  TokenRecord& record = enrolment.credential.record;
  record.id = token::NewId("tok-");
  record.secret_hash = std::move(minted.secret_hash);
  record.role = Role::kExecutor;
  record.scopes = DefaultScopes(Role::kExecutor);
  record.created_at = now;
  if (policy_.executor_credential_ttl > absl::ZeroDuration()) record.expires_at = now + policy_.executor_credential_ttl;
  // Gangs only for an executor whose join token an admin issued for gangs (`--gang`): its
  // credential carries the scope, and any other's gang address is dropped (it joins no gang).
  // The store checks the join token again when it trades it; its scopes never change.
  ExecutorInfo kept = info;
  absl::StatusOr<TokenRecord> join = store_->FindToken(token::Hash(join_text));
  if (join.ok() && join->role == Role::kJoin && join->scopes.Has(Scope::kGang)) {
    record.scopes = ScopeSet(record.scopes.bits() | static_cast<uint32_t>(Scope::kGang));
  } else {
    kept.gang_address.clear();
  }
  ASSIGN_OR_RETURN(enrolment.executor, store_->EnrolExecutor(token::Hash(join_text), record, kept, now, policy_.require_approval));
  return enrolment;
}

absl::StatusOr<IssuedToken> IdentityAdmin::RotateExecutorCredential(const std::string& executor_id,
                                                                    const std::string& token_id) {
  const absl::Time now = clock_->Now();
  token::Minted minted = token::Mint(Role::kExecutor);
  IssuedToken issued;
  issued.text = std::move(minted.text);
  TokenRecord& record = issued.record;
  record.id = token::NewId("tok-");
  record.secret_hash = std::move(minted.secret_hash);
  record.role = Role::kExecutor;
  record.principal = executor_id;
  record.created_at = now;
  if (policy_.executor_credential_ttl > absl::ZeroDuration()) record.expires_at = now + policy_.executor_credential_ttl;
  RETURN_IF_ERROR(store_->RotateCredential(token_id, record, now, now + policy_.rotation_grace));
  return issued;
}

absl::Time IdentityAdmin::RotateAt(absl::Time issued_at, std::optional<absl::Time> expires_at) const {
  if (expires_at) return issued_at + (*expires_at - issued_at) / 2;
  if (policy_.executor_credential_ttl > absl::ZeroDuration()) return clock_->Now();
  return absl::InfiniteFuture();
}

}  // namespace minions
