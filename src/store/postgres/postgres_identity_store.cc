// The IdentityStore half of PostgresMetadataStore: teams and credentials (see identity_store.h).
// Lock order, extending the store's (postgres_metadata_store.h): tasks -> executor -> tokens;
// a job's creation locks its team's row first.

#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "store/common/store_rows.h"
#include "store/common/store_rules.h"
#include "store/postgres/pg_connection.h"
#include "store/postgres/postgres_metadata_store.h"
#include "store/postgres/postgres_statements.h"

namespace minions {
namespace {

using postgres_store::Params;
using postgres_store::PgResult;
using postgres_store::Row;
namespace sql = postgres_store::sql;
namespace rows = store_rows;
namespace rules = store_rules;

absl::StatusOr<std::vector<TokenRecord>> ReadTokens(const PgResult& result) {
  std::vector<TokenRecord> tokens;
  for (int i = 0; i < result.Rows(); ++i) {
    ASSIGN_OR_RETURN(TokenRecord token, rows::ReadToken(Row{result, i}));
    tokens.push_back(std::move(token));
  }
  return tokens;
}

}  // namespace

absl::StatusOr<std::optional<Team>> PostgresMetadataStore::LoadTeam(Connection& c, const std::string& name) {
  ASSIGN_OR_RETURN(PgResult result, c.Exec(c.for_update() ? sql::kSelectTeamForUpdate : sql::kSelectTeam,
                                           Params().Text(name)));
  if (result.Rows() == 0) return std::optional<Team>();
  return std::optional<Team>(rows::ReadTeam(Row{result, 0}));
}

absl::StatusOr<TokenRecord> PostgresMetadataStore::LoadToken(Connection& c, const std::string& key, bool by_hash) {
  const char* query = by_hash ? (c.for_update() ? sql::kTokenByHashForUpdate : sql::kTokenByHash)
                              : (c.for_update() ? sql::kTokenByIdForUpdate : sql::kTokenById);
  ASSIGN_OR_RETURN(PgResult result, c.Exec(query, Params().Text(key)));
  // A hash is never repeated in a message: for a lookup it is as good as the token's text.
  if (result.Rows() == 0) return absl::NotFoundError(by_hash ? "no such token" : absl::StrCat("no token ", key));
  return rows::ReadToken(Row{result, 0});
}

absl::Status PostgresMetadataStore::SaveToken(Connection& c, const TokenRecord& token, bool insert) {
  ASSIGN_OR_RETURN(PgResult result, c.Exec(insert ? sql::kInsertToken : sql::kUpdateToken,
                                           Params().Values(rows::TokenValues(token))));
  if (result.Affected() != 1) {
    if (insert) return absl::AlreadyExistsError(absl::StrCat("token ", token.id, " (or its hash) exists"));
    return absl::NotFoundError(absl::StrCat("no token ", token.id));
  }
  return absl::OkStatus();
}

// --- teams ---

absl::StatusOr<Team> PostgresMetadataStore::CreateTeam(const Team& team) {
  RETURN_IF_ERROR(ValidateTeamName(team.name));
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Team> {
    ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kInsertTeam, Params().Values(rows::TeamValues(team))));
    if (result.Affected() != 1) return absl::AlreadyExistsError(absl::StrCat("team ", team.name, " exists"));
    return team;
  });
}

absl::StatusOr<Team> PostgresMetadataStore::UpdateTeam(const Team& team) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Team> {
    ASSIGN_OR_RETURN(std::optional<Team> existing, LoadTeam(c, team.name));
    if (!existing) return absl::NotFoundError(absl::StrCat("no team ", team.name));
    Team updated = team;
    updated.created_at = existing->created_at;
    RETURN_IF_ERROR(c.Exec(sql::kUpdateTeam, Params().Values(rows::TeamValues(updated))).status());
    return updated;
  });
}

absl::StatusOr<Team> PostgresMetadataStore::GetTeam(const std::string& name) {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<Team> {
    ASSIGN_OR_RETURN(std::optional<Team> team, LoadTeam(c, name));
    if (!team) return absl::NotFoundError(absl::StrCat("no team ", name));
    return *team;
  });
}

absl::StatusOr<std::vector<Team>> PostgresMetadataStore::ListTeams() {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::vector<Team>> {
    ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kListTeams));
    std::vector<Team> teams;
    for (int i = 0; i < result.Rows(); ++i) teams.push_back(rows::ReadTeam(Row{result, i}));
    return teams;
  });
}

// --- credentials ---

absl::Status PostgresMetadataStore::AddToken(const TokenRecord& token) {
  RETURN_IF_ERROR(rules::CheckNewToken(token));
  return InTransaction(true, [&](Connection& c) -> absl::Status {
    if (!token.team.empty()) {
      // Locked: the team cannot vanish under the new credential.
      ASSIGN_OR_RETURN(std::optional<Team> team, LoadTeam(c, token.team));
      if (!team) return absl::NotFoundError(absl::StrCat("no team ", token.team));
    }
    return SaveToken(c, token, /*insert=*/true);
  });
}

absl::StatusOr<TokenRecord> PostgresMetadataStore::FindToken(const std::string& secret_hash) {
  return InTransaction(false, [&](Connection& c) { return LoadToken(c, secret_hash, /*by_hash=*/true); });
}

absl::StatusOr<TokenRecord> PostgresMetadataStore::GetToken(const std::string& token_id) {
  return InTransaction(false, [&](Connection& c) { return LoadToken(c, token_id, /*by_hash=*/false); });
}

absl::StatusOr<std::vector<TokenRecord>> PostgresMetadataStore::ListTokens(const TokenFilter& filter) {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::vector<TokenRecord>> {
    ASSIGN_OR_RETURN(PgResult result,
                     c.Exec(sql::kListTokens, Params()
                                                  .Text(filter.team)
                                                  .Text(filter.role ? std::string(RoleName(*filter.role)) : "")
                                                  .Text(filter.principal)
                                                  .Bool(filter.include_revoked)));
    return ReadTokens(result);
  });
}

absl::StatusOr<TokenRecord> PostgresMetadataStore::RevokeToken(const std::string& token_id, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<TokenRecord> {
    ASSIGN_OR_RETURN(TokenRecord token, LoadToken(c, token_id, /*by_hash=*/false));
    rules::RevokeToken(token, now);
    RETURN_IF_ERROR(SaveToken(c, token));
    return token;
  });
}

absl::Status PostgresMetadataStore::RecordTokenUse(const std::vector<std::string>& token_ids, absl::Time at) {
  if (token_ids.empty()) return absl::OkStatus();
  std::vector<rows::Values> ids;
  for (const std::string& id : token_ids) ids.push_back({id});
  return InTransaction(true, [&](Connection& c) -> absl::Status {
    return c.Exec(sql::kRecordTokenUse, std::move(Params().Columns(ids, 1).Time(at))).status();
  });
}

absl::StatusOr<std::vector<std::string>> PostgresMetadataStore::RevokedTokensSince(absl::Time since) {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::vector<std::string>> {
    ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kRevokedTokensSince, Params().Time(since)));
    std::vector<std::string> ids;
    for (int row = 0; row < result.Rows(); ++row) ids.push_back(result.Text(row, 0));
    return ids;
  });
}

// --- executors ---

absl::StatusOr<Executor> PostgresMetadataStore::EnrolExecutor(const std::string& join_secret_hash,
                                                              TokenRecord& credential, const ExecutorInfo& info,
                                                              absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Executor> {
    // The join token's row, locked: two enrolments at once cannot both take its last use.
    absl::StatusOr<TokenRecord> join = LoadToken(c, join_secret_hash, /*by_hash=*/true);
    if (absl::IsNotFound(join.status())) {
      return absl::UnauthenticatedError("unknown join token: ask an admin for a new one");
    }
    if (!join.ok()) return join.status();
    RETURN_IF_ERROR(rules::TakeJoinUse(*join, now));
    RETURN_IF_ERROR(SaveToken(c, *join));
    Executor executor;
    rules::RegisterExecutor(executor, /*exists=*/false, info, now);
    for (int tries = 0;; ++tries) {
      executor.id = NewId("exe-");
      absl::Status inserted = SaveExecutor(c, executor, /*insert=*/true);
      if (inserted.ok()) break;
      if (!absl::IsAlreadyExists(inserted) || tries == 3) return inserted;
    }
    TokenRecord stored = credential;
    stored.principal = executor.id;
    stored.created_by = join->id;
    RETURN_IF_ERROR(rules::CheckNewToken(stored));
    if (stored.role != Role::kExecutor) return absl::InvalidArgumentError("an enrolment issues an executor credential");
    RETURN_IF_ERROR(SaveToken(c, stored, /*insert=*/true));
    // The caller's record is completed only once it is stored (a retried transaction starts over).
    credential = stored;
    return executor;
  });
}

absl::StatusOr<Executor> PostgresMetadataStore::RevokeExecutor(const std::string& executor_id, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Executor> {
    // Lock order: its tasks, the executor, its credentials.
    ASSIGN_OR_RETURN(PgResult held, c.Exec(sql::kTasksOfExecutorForUpdate, Params().Text(executor_id)));
    std::vector<Task> tasks;
    for (int i = 0; i < held.Rows(); ++i) {
      ASSIGN_OR_RETURN(Task task, rows::ReadTask(Row{held, i}));
      tasks.push_back(std::move(task));
    }
    ASSIGN_OR_RETURN(Executor executor, LoadExecutor(c, executor_id));
    rules::RevokeExecutor(executor);
    RETURN_IF_ERROR(SaveExecutor(c, executor));
    ASSIGN_OR_RETURN(PgResult credentials, c.Exec(sql::kExecutorTokensForUpdate, Params().Text(executor_id)));
    ASSIGN_OR_RETURN(std::vector<TokenRecord> tokens, ReadTokens(credentials));
    for (TokenRecord& token : tokens) {
      rules::RevokeToken(token, now);
      RETURN_IF_ERROR(SaveToken(c, token));
    }
    // Handed back: preempted attempts (pending at once, not counted), dropped shadows. Neither
    // ends a task, so no job's counts change; the attempts stopped are charged the time they ran
    // (to their teams and jobs, as any ended attempt; a dropped shadow adds nothing after its
    // backup request: store_rules EndedAttemptTime).
    std::map<std::string, Job> jobs;
    AttemptWrites writes;
    for (Task& task : tasks) {
      auto job = jobs.find(task.job_id);
      if (job == jobs.end()) {
        // Read, not locked: handing a task back changes nothing of its job.
        ASSIGN_OR_RETURN(PgResult row, c.Exec(sql::kSelectJob, Params().Text(task.job_id)));
        if (row.Rows() == 0) return absl::NotFoundError(absl::StrCat("no job ", task.job_id));
        ASSIGN_OR_RETURN(Job loaded, rows::ReadJob(Row{row, 0}));
        job = jobs.emplace(task.job_id, std::move(loaded)).first;
      }
      const Task before = task;
      if (rules::HandBack(task, executor_id, job->second.spec.max_attempts, options_.retry, now)) {
        writes.charges[task.job_id] += rules::EndedAttemptTime(before, task, now);
        writes.tasks.push_back(std::move(task));
      }
    }
    RETURN_IF_ERROR(WriteAttempts(c, writes, now, /*settle_later=*/nullptr));  // nothing ended: nothing to settle
    return executor;
  });
}

}  // namespace minions
