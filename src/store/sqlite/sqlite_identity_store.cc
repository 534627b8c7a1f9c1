// The IdentityStore half of SqliteMetadataStore: teams and credentials (see identity_store.h).

#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "store/common/store_rows.h"
#include "store/common/store_rules.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "store/sqlite/sqlite_statement.h"

namespace minions {
namespace {

using sqlite_store::Statement;
namespace rows = store_rows;
namespace rules = store_rules;

constexpr char kSelectTeam[] = "SELECT " MINIONS_STORE_TEAM_COLUMNS " FROM teams WHERE name = :name";
constexpr char kListTeams[] = "SELECT " MINIONS_STORE_TEAM_COLUMNS " FROM teams ORDER BY name";
constexpr char kInsertTeam[] = "INSERT INTO teams (" MINIONS_STORE_TEAM_COLUMNS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
constexpr char kUpdateTeam[] =
    "UPDATE teams SET max_priority = ?2, max_active_jobs = ?3, requests_per_second = ?4, created_at = ?5, "
    "weight = ?6, max_running_tasks = ?7 "
    "WHERE name = ?1";

constexpr char kTokenById[] = "SELECT " MINIONS_STORE_TOKEN_COLUMNS " FROM tokens WHERE id = :id";
constexpr char kTokenByHash[] = "SELECT " MINIONS_STORE_TOKEN_COLUMNS " FROM tokens WHERE secret_hash = :id";
constexpr char kListTokens[] =
    "SELECT " MINIONS_STORE_TOKEN_COLUMNS " FROM tokens WHERE (:team = '' OR team = :team) "
    "AND (:role = '' OR role = :role) AND (:principal = '' OR principal = :principal) "
    "AND (:include_revoked = 1 OR revoked_at IS NULL) ORDER BY created_at DESC, id DESC";
constexpr char kInsertToken[] =
    "INSERT INTO tokens (" MINIONS_STORE_TOKEN_COLUMNS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";
constexpr char kUpdateToken[] =
    "UPDATE tokens SET secret_hash = ?2, role = ?3, team = ?4, principal = ?5, scopes = ?6, uses_left = ?7, "
    "created_by = ?8, created_at = ?9, expires_at = ?10, last_used_at = ?11, revoked_at = ?12 WHERE id = ?1";
constexpr char kRecordUse[] =
    "UPDATE tokens SET last_used_at = :at WHERE id = :id AND (last_used_at IS NULL OR last_used_at < :at)";
constexpr char kExecutorTokens[] =
    "SELECT id FROM tokens WHERE principal = :principal AND role = 'executor' AND revoked_at IS NULL";
// Tasks an executor holds: running attempts and shadows. Shadows are JSON; the LIKE narrows the
// scan, HandBack decides.
constexpr char kTasksOfExecutor[] =
    "SELECT job_id, idx FROM tasks WHERE (state = 'running' AND executor_id = :executor) "
    "OR (shadow IS NOT NULL AND shadow LIKE :shadow) ORDER BY job_id, idx";

}  // namespace

absl::StatusOr<std::optional<Team>> SqliteMetadataStore::LoadTeam(const std::string& name) {
  ASSIGN_OR_RETURN(Statement query, Prepare(kSelectTeam));
  query.BindText(":name", name);
  ASSIGN_OR_RETURN(bool row, query.Step());
  if (!row) return std::optional<Team>();
  return std::optional<Team>(rows::ReadTeam(query));
}

absl::StatusOr<TokenRecord> SqliteMetadataStore::LoadToken(const char* sql, const char* parameter,
                                                           const std::string& value) {
  ASSIGN_OR_RETURN(Statement query, Prepare(sql));
  query.BindText(parameter, value);
  ASSIGN_OR_RETURN(bool row, query.Step());
  // The hash is never repeated in a message: it identifies a credential as well as its text does
  // for lookups.
  if (!row) return absl::NotFoundError(sql == kTokenById ? absl::StrCat("no token ", value) : "no such token");
  return rows::ReadToken(query);
}

absl::Status SqliteMetadataStore::SaveToken(const TokenRecord& token, bool insert) {
  ASSIGN_OR_RETURN(Statement statement, Prepare(insert ? kInsertToken : kUpdateToken));
  statement.BindValues(rows::TokenValues(token));
  RETURN_IF_ERROR(statement.Run());
  if (statement.Changes() != 1) return absl::NotFoundError(absl::StrCat("no token ", token.id));
  return absl::OkStatus();
}

// --- teams ---

absl::StatusOr<Team> SqliteMetadataStore::CreateTeam(const Team& team) {
  RETURN_IF_ERROR(ValidateTeamName(team.name));
  return InTransaction(true, [&]() -> absl::StatusOr<Team> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(std::optional<Team> existing, LoadTeam(team.name));
    if (existing) return absl::AlreadyExistsError(absl::StrCat("team ", team.name, " exists"));
    ASSIGN_OR_RETURN(Statement insert, Prepare(kInsertTeam));
    RETURN_IF_ERROR(insert.BindValues(rows::TeamValues(team)).Run());
    return team;
  });
}

absl::StatusOr<Team> SqliteMetadataStore::UpdateTeam(const Team& team) {
  return InTransaction(true, [&]() -> absl::StatusOr<Team> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(std::optional<Team> existing, LoadTeam(team.name));
    if (!existing) return absl::NotFoundError(absl::StrCat("no team ", team.name));
    Team updated = team;
    updated.created_at = existing->created_at;
    ASSIGN_OR_RETURN(Statement update, Prepare(kUpdateTeam));
    RETURN_IF_ERROR(update.BindValues(rows::TeamValues(updated)).Run());
    return updated;
  });
}

absl::StatusOr<Team> SqliteMetadataStore::GetTeam(const std::string& name) {
  return InTransaction(false, [&]() -> absl::StatusOr<Team> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(std::optional<Team> team, LoadTeam(name));
    if (!team) return absl::NotFoundError(absl::StrCat("no team ", name));
    return *team;
  });
}

absl::StatusOr<std::vector<Team>> SqliteMetadataStore::ListTeams() {
  return InTransaction(false, [&]() -> absl::StatusOr<std::vector<Team>> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Statement query, Prepare(kListTeams));
    std::vector<Team> teams;
    while (true) {
      ASSIGN_OR_RETURN(bool row, query.Step());
      if (!row) break;
      teams.push_back(rows::ReadTeam(query));
    }
    return teams;
  });
}

// --- credentials ---

absl::Status SqliteMetadataStore::AddToken(const TokenRecord& token) {
  RETURN_IF_ERROR(rules::CheckNewToken(token));
  return InTransaction(true, [&]() -> absl::Status {
    mu_.AssertHeld();
    if (!token.team.empty()) {
      ASSIGN_OR_RETURN(std::optional<Team> team, LoadTeam(token.team));
      if (!team) return absl::NotFoundError(absl::StrCat("no team ", token.team));
    }
    return SaveToken(token, /*insert=*/true);
  });
}

absl::StatusOr<TokenRecord> SqliteMetadataStore::FindToken(const std::string& secret_hash) {
  return InTransaction(false, [&] {
    mu_.AssertHeld();
    return LoadToken(kTokenByHash, ":id", secret_hash);
  });
}

absl::StatusOr<TokenRecord> SqliteMetadataStore::GetToken(const std::string& token_id) {
  return InTransaction(false, [&] {
    mu_.AssertHeld();
    return LoadToken(kTokenById, ":id", token_id);
  });
}

absl::StatusOr<std::vector<TokenRecord>> SqliteMetadataStore::ListTokens(const TokenFilter& filter) {
  return InTransaction(false, [&]() -> absl::StatusOr<std::vector<TokenRecord>> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Statement query, Prepare(kListTokens));
    query.BindText(":team", filter.team)
        .BindText(":role", filter.role ? std::string(RoleName(*filter.role)) : "")
        .BindText(":principal", filter.principal)
        .BindInt(":include_revoked", filter.include_revoked ? 1 : 0);
    std::vector<TokenRecord> tokens;
    while (true) {
      ASSIGN_OR_RETURN(bool row, query.Step());
      if (!row) break;
      ASSIGN_OR_RETURN(TokenRecord token, rows::ReadToken(query));
      tokens.push_back(std::move(token));
    }
    return tokens;
  });
}

absl::StatusOr<TokenRecord> SqliteMetadataStore::RevokeToken(const std::string& token_id, absl::Time now) {
  return InTransaction(true, [&]() -> absl::StatusOr<TokenRecord> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(TokenRecord token, LoadToken(kTokenById, ":id", token_id));
    rules::RevokeToken(token, now);
    RETURN_IF_ERROR(SaveToken(token));
    return token;
  });
}

absl::Status SqliteMetadataStore::RecordTokenUse(const std::vector<std::string>& token_ids, absl::Time at) {
  if (token_ids.empty()) return absl::OkStatus();
  return InTransaction(true, [&]() -> absl::Status {
    mu_.AssertHeld();
    for (const std::string& id : token_ids) {
      ASSIGN_OR_RETURN(Statement update, Prepare(kRecordUse));
      RETURN_IF_ERROR(update.BindText(":id", id).BindTime(":at", at).Run());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<std::string>> SqliteMetadataStore::RevokedTokensSince(absl::Time since) {
  return InTransaction(false, [&]() -> absl::StatusOr<std::vector<std::string>> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Statement query, Prepare("SELECT id FROM tokens WHERE revoked_at >= :since"));
    query.BindTime(":since", since);
    std::vector<std::string> ids;
    while (true) {
      ASSIGN_OR_RETURN(bool row, query.Step());
      if (!row) break;
      ids.push_back(query.Text(0));
    }
    return ids;
  });
}

// --- executors ---

absl::StatusOr<Executor> SqliteMetadataStore::EnrolExecutor(const std::string& join_secret_hash,
                                                            TokenRecord& credential, const ExecutorInfo& info,
                                                            absl::Time now) {
  return InTransaction(true, [&]() -> absl::StatusOr<Executor> {
    mu_.AssertHeld();
    absl::StatusOr<TokenRecord> join = LoadToken(kTokenByHash, ":id", join_secret_hash);
    if (absl::IsNotFound(join.status())) {
      return absl::UnauthenticatedError("unknown join token: ask an admin for a new one");
    }
    if (!join.ok()) return join.status();
    RETURN_IF_ERROR(rules::TakeJoinUse(*join, now));
    RETURN_IF_ERROR(SaveToken(*join));
    Executor executor;
    rules::RegisterExecutor(executor, /*exists=*/false, info, now);
    for (int tries = 0;; ++tries) {
      executor.id = NewId("exe-");
      absl::Status inserted = SaveExecutor(executor, /*insert=*/true);
      if (inserted.ok()) break;
      if (!absl::IsAlreadyExists(inserted) || tries == 3) return inserted;
    }
    credential.principal = executor.id;
    credential.created_by = join->id;
    RETURN_IF_ERROR(rules::CheckNewToken(credential));
    if (credential.role != Role::kExecutor) return absl::InvalidArgumentError("an enrolment issues an executor credential");
    RETURN_IF_ERROR(SaveToken(credential, /*insert=*/true));
    return executor;
  });
}

absl::StatusOr<Executor> SqliteMetadataStore::RevokeExecutor(const std::string& executor_id, absl::Time now) {
  return InTransaction(true, [&]() -> absl::StatusOr<Executor> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Executor executor, LoadExecutor(executor_id));
    rules::RevokeExecutor(executor);
    RETURN_IF_ERROR(SaveExecutor(executor));
    std::vector<std::string> token_ids;
    {
      ASSIGN_OR_RETURN(Statement query, Prepare(kExecutorTokens));
      query.BindText(":principal", executor_id);
      while (true) {
        ASSIGN_OR_RETURN(bool row, query.Step());
        if (!row) break;
        token_ids.push_back(query.Text(0));
      }
    }
    for (const std::string& id : token_ids) {
      ASSIGN_OR_RETURN(TokenRecord token, LoadToken(kTokenById, ":id", id));
      rules::RevokeToken(token, now);
      RETURN_IF_ERROR(SaveToken(token));
    }
    std::vector<std::pair<std::string, int64_t>> held;
    {
      ASSIGN_OR_RETURN(Statement query, Prepare(kTasksOfExecutor));
      query.BindText(":executor", executor_id).BindText(":shadow", absl::StrCat("%\"", executor_id, "\"%"));
      while (true) {
        ASSIGN_OR_RETURN(bool row, query.Step());
        if (!row) break;
        held.emplace_back(query.Text(0), query.Int(1));
      }
    }
    // The attempts stopped are charged the time they ran (to their teams and jobs; a dropped
    // shadow adds nothing after its backup request: store_rules EndedAttemptTime).
    std::map<std::string, Job> jobs;
    std::map<std::string, absl::Duration> charges;
    for (const auto& [job_id, index] : held) {
      auto job = jobs.find(job_id);
      if (job == jobs.end()) {
        ASSIGN_OR_RETURN(Job loaded, LoadJob(job_id));
        job = jobs.emplace(job_id, std::move(loaded)).first;
      }
      ASSIGN_OR_RETURN(Task task, LoadTask(job_id, index));
      const Task before = task;
      if (rules::HandBack(task, executor_id, job->second.spec.max_attempts, options_.retry, now)) {
        RETURN_IF_ERROR(SaveTask(task));
        charges[job_id] += rules::EndedAttemptTime(before, task, now);
      }
    }
    RETURN_IF_ERROR(ChargeUsage(charges, now));
    return executor;
  });
}

}  // namespace minions
