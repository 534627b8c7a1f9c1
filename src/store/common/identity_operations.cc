#include "store/common/identity_operations.h"

#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "store/common/job_settler.h"
#include "store/common/row_access.h"
#include "store/common/store_rules.h"

namespace minions {
namespace {

namespace rules = store_rules;

constexpr TransactionKind kRead = TransactionKind::kRead;
constexpr TransactionKind kWrite = TransactionKind::kWrite;

absl::Status NoTeam(const std::string& name) { return absl::NotFoundError(absl::StrCat("no team ", name)); }

}  // namespace

// --- teams ---

absl::StatusOr<Team> IdentityOperations::CreateTeam(const Team& team) {
  RETURN_IF_ERROR(ValidateTeamName(team.name));
  return RunTransaction(store_, kWrite, [&](RowTransaction& t) -> absl::StatusOr<Team> {
    absl::Status inserted = t.Insert(RowWrites{.teams = {team}});
    if (absl::IsAlreadyExists(inserted)) return absl::AlreadyExistsError(absl::StrCat("team ", team.name, " exists"));
    RETURN_IF_ERROR(inserted);
    return team;
  });
}

absl::StatusOr<Team> IdentityOperations::UpdateTeam(const Team& team) {
  return RunTransaction(store_, kWrite, [&](RowTransaction& t) -> absl::StatusOr<Team> {
    ASSIGN_OR_RETURN(std::optional<Team> existing, row_access::FindTeam(t, team.name));
    if (!existing) return NoTeam(team.name);
    Team updated = team;
    updated.created_at = existing->created_at;
    // The counts are the store's (ChargeTeamBytes), never an admin's.
    updated.file_bytes = existing->file_bytes;
    updated.result_bytes = existing->result_bytes;
    RETURN_IF_ERROR(t.Update(RowWrites{.teams = {updated}}, /*last=*/true));
    return updated;
  });
}

absl::StatusOr<Team> IdentityOperations::GetTeam(const std::string& name) {
  return RunTransaction(store_, kRead, [&](RowTransaction& t) -> absl::StatusOr<Team> {
    ASSIGN_OR_RETURN(std::optional<Team> team, row_access::FindTeam(t, name));
    if (!team) return NoTeam(name);
    return *std::move(team);
  });
}

absl::StatusOr<std::vector<Team>> IdentityOperations::ListTeams() {
  return RunTransaction(store_, kRead, [&](RowTransaction& t) { return t.ListTeams(); });
}

absl::StatusOr<Team> IdentityOperations::ChargeTeamBytes(const std::string& name, TeamBytes kind, int64_t delta,
                                                         bool enforce) {
  return RunTransaction(store_, kWrite, [&](RowTransaction& t) -> absl::StatusOr<Team> {
    // Locked: two charges of the team at once are counted one after the other.
    ASSIGN_OR_RETURN(std::optional<Team> team, row_access::FindTeam(t, name));
    if (!team) return NoTeam(name);
    RETURN_IF_ERROR(rules::ChargeTeamBytes(*team, kind, delta, enforce));
    RETURN_IF_ERROR(t.Update(RowWrites{.teams = {*team}}, /*last=*/true));
    return *std::move(team);
  });
}

// --- credentials ---

absl::Status IdentityOperations::AddToken(const TokenRecord& token) {
  RETURN_IF_ERROR(rules::CheckNewToken(token));
  return RunTransaction(store_, kWrite, [&](RowTransaction& t) -> absl::Status {
    if (!token.team.empty()) {
      // Locked: the team cannot vanish under the new credential.
      ASSIGN_OR_RETURN(std::optional<Team> team, row_access::FindTeam(t, token.team));
      if (!team) return NoTeam(token.team);
    }
    absl::Status inserted = t.Insert(RowWrites{.tokens = {token}});
    if (absl::IsAlreadyExists(inserted)) {
      return absl::AlreadyExistsError(absl::StrCat("token ", token.id, " (or its hash) exists"));
    }
    return inserted;
  });
}

absl::StatusOr<TokenRecord> IdentityOperations::FindToken(const std::string& secret_hash) {
  return RunTransaction(store_, kRead, [&](RowTransaction& t) { return row_access::LoadTokenByHash(t, secret_hash); });
}

absl::StatusOr<TokenRecord> IdentityOperations::GetToken(const std::string& token_id) {
  return RunTransaction(store_, kRead, [&](RowTransaction& t) { return row_access::LoadToken(t, token_id); });
}

absl::StatusOr<std::vector<TokenRecord>> IdentityOperations::ListTokens(const TokenFilter& filter) {
  return RunTransaction(store_, kRead, [&](RowTransaction& t) { return t.ListTokens(filter); });
}

absl::StatusOr<TokenRecord> IdentityOperations::RevokeToken(const std::string& token_id, absl::Time now) {
  return RunTransaction(store_, kWrite, [&](RowTransaction& t) -> absl::StatusOr<TokenRecord> {
    ASSIGN_OR_RETURN(TokenRecord token, row_access::LoadToken(t, token_id));
    rules::RevokeToken(token, now);
    RETURN_IF_ERROR(t.Update(RowWrites{.tokens = {token}}, /*last=*/true));
    return token;
  });
}

absl::Status IdentityOperations::RecordTokenUse(const std::vector<std::string>& token_ids, absl::Time at) {
  if (token_ids.empty()) return absl::OkStatus();
  return RunTransaction(store_, kWrite, [&](RowTransaction& t) { return t.RecordTokenUse(token_ids, at); });
}

absl::StatusOr<std::vector<std::string>> IdentityOperations::RevokedTokensSince(absl::Time since) {
  return RunTransaction(store_, kRead, [&](RowTransaction& t) { return t.RevokedTokensSince(since); });
}

// --- executors ---

absl::StatusOr<Executor> IdentityOperations::EnrolExecutor(const std::string& join_secret_hash,
                                                           TokenRecord& credential, const ExecutorInfo& info,
                                                           absl::Time now, bool await_approval) {
  TokenRecord stored;
  absl::StatusOr<Executor> enrolled = RunTransaction(store_, kWrite, [&](RowTransaction& t) -> absl::StatusOr<Executor> {
    // The join token's row, locked: two enrolments at once cannot both take its last use.
    absl::StatusOr<TokenRecord> join = row_access::LoadTokenByHash(t, join_secret_hash);
    if (absl::IsNotFound(join.status())) {
      return absl::UnauthenticatedError("unknown join token: ask an admin for a new one");
    }
    if (!join.ok()) return join.status();
    RETURN_IF_ERROR(rules::TakeJoinUse(*join, now));
    RETURN_IF_ERROR(t.Update(RowWrites{.tokens = {*join}}));
    Executor executor;
    rules::RegisterExecutor(executor, /*exists=*/false, info, now);
    if (await_approval) rules::AwaitApproval(executor);
    executor.owner = ExecutorOwner(*join);
    RETURN_IF_ERROR(row_access::InsertWithFreshId(t, ids_, executor));
    stored = credential;
    stored.principal = executor.id;
    stored.created_by = join->id;
    RETURN_IF_ERROR(rules::CheckNewToken(stored));
    if (stored.role != Role::kExecutor) return absl::InvalidArgumentError("an enrolment issues an executor credential");
    RETURN_IF_ERROR(t.Insert(RowWrites{.tokens = {stored}}));
    return executor;
  });
  // The caller's record is completed only once it is stored.
  if (enrolled.ok()) credential = stored;
  return enrolled;
}

absl::StatusOr<Executor> IdentityOperations::ApproveExecutor(const std::string& executor_id, absl::Time now) {
  (void)now;
  return RunTransaction(store_, kWrite, [&](RowTransaction& t) -> absl::StatusOr<Executor> {
    ASSIGN_OR_RETURN(Executor executor, row_access::LoadExecutor(t, executor_id));
    RETURN_IF_ERROR(rules::ApproveExecutor(executor));
    RETURN_IF_ERROR(t.Update(RowWrites{.executors = {executor}}, /*last=*/true));
    return executor;
  });
}

absl::Status IdentityOperations::RotateCredential(const std::string& token_id, TokenRecord& fresh, absl::Time now,
                                                  absl::Time old_expires_by) {
  TokenRecord stored;
  absl::Status rotated = RunTransaction(store_, kWrite, [&](RowTransaction& t) -> absl::Status {
    // Lock order: the executor, then its credentials.
    ASSIGN_OR_RETURN(Executor executor, row_access::LoadExecutor(t, fresh.principal));
    ASSIGN_OR_RETURN(TokenRecord old, row_access::LoadToken(t, token_id));
    if (old.role != Role::kExecutor || old.principal != executor.id) {
      return absl::FailedPreconditionError(
          absl::StrCat("token ", token_id, " is not a credential of executor ", executor.id));
    }
    RETURN_IF_ERROR(CheckUsable(old, now));
    if (executor.state == ExecutorState::kRevoked) {
      return absl::UnauthenticatedError(absl::StrCat("executor ", executor.id, " was revoked"));
    }
    stored = fresh;
    stored.role = Role::kExecutor;
    stored.principal = old.principal;
    stored.scopes = old.scopes;  // never more than it had: the gang scope stays only where it was
    stored.created_by = old.id;
    RETURN_IF_ERROR(rules::CheckNewToken(stored));
    RETURN_IF_ERROR(t.Insert(RowWrites{.tokens = {stored}}));
    if (!old.expires_at || *old.expires_at > old_expires_by) old.expires_at = old_expires_by;
    return t.Update(RowWrites{.tokens = {old}}, /*last=*/true);
  });
  if (rotated.ok()) fresh = stored;
  return rotated;
}

absl::StatusOr<Executor> IdentityOperations::RevokeExecutor(const std::string& executor_id, absl::Time now) {
  return RunTransaction(store_, kWrite, [&](RowTransaction& t) -> absl::StatusOr<Executor> {
    // Lock order: its tasks, the executor, its credentials.
    ASSIGN_OR_RETURN(std::vector<Task> tasks, t.TasksHeldBy(executor_id));
    ASSIGN_OR_RETURN(Executor executor, row_access::LoadExecutor(t, executor_id));
    rules::RevokeExecutor(executor);
    RowWrites revoked{.executors = {executor}};
    ASSIGN_OR_RETURN(revoked.tokens, t.LiveExecutorTokens(executor_id));
    for (TokenRecord& token : revoked.tokens) rules::RevokeToken(token, now);
    RETURN_IF_ERROR(t.Update(revoked));
    // Handed back: preempted attempts (pending at once, not counted), dropped shadows. Neither
    // ends a task, so no job's counts change; the attempts stopped are charged the time they ran
    // (to their teams and jobs, as any ended attempt; a dropped shadow adds nothing after its
    // backup request: store_rules EndedAttemptTime).
    std::map<std::string, Job> jobs;  // read, not locked: handing a task back changes nothing of its job
    AttemptWrites writes;
    // Its queued tasks with the one it ran: one span in all (store_rules ChargedUntil), moved on
    // its row, which this transaction holds.
    ASSIGN_OR_RETURN(rules::ChargedUntil charged, row_access::ChargedUntilOfHolders(t, tasks));
    for (Task& task : tasks) {
      auto job = jobs.find(task.job_id);
      if (job == jobs.end()) {
        ASSIGN_OR_RETURN(Job loaded, row_access::LoadJob(t, task.job_id, Locking::kNone));
        job = jobs.emplace(task.job_id, std::move(loaded)).first;
      }
      const Task before = task;
      if (rules::HandBack(task, executor_id, job->second.spec.max_attempts, options_.retry, now)) {
        writes.charges[task.job_id] += rules::EndedAttemptTime(before, task, now, &charged);
        writes.tasks.push_back(std::move(task));
      }
    }
    if (auto moved = charged.find(executor_id); moved != charged.end()) writes.charged_until[executor_id] = moved->second;
    RETURN_IF_ERROR(JobSettler::EndOnly(t, writes, now));  // nothing ended: nothing to settle
    return executor;
  });
}

}  // namespace minions
