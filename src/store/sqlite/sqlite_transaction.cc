#include "store/sqlite/sqlite_transaction.h"

#include <algorithm>
#include <utility>
#include <variant>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "model/fair_share.h"
#include "store/common/gang_rows.h"
#include "store/common/store_rows.h"
#include "store/common/store_rules.h"
#include "store/sqlite/sqlite_statements.h"

namespace minions::sqlite_store {
namespace {

namespace rows = store_rows;

// The key a row's first value holds, for a message.
std::string KeyText(const rows::Values& values) {
  if (values.empty()) return "";
  if (const std::string* text = std::get_if<std::string>(&values[0])) return *text;
  if (const int64_t* number = std::get_if<int64_t>(&values[0])) return absl::StrCat(*number);
  return "";
}

// A LIMIT: none (-1) unless positive.
int64_t Limit(int limit) { return limit > 0 ? limit : -1; }

// Every row of `query`, each read by `read` (a function of the statement's current row that
// returns a T or a StatusOr<T>).
template <typename T, typename Read>
absl::StatusOr<std::vector<T>> Collect(Statement& query, Read read) {
  std::vector<T> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, query.Step());
    if (!row) return out;
    absl::StatusOr<T> value = read(query);
    RETURN_IF_ERROR(value.status());
    out.push_back(*std::move(value));
  }
}

// The readers of store/common/store_rows.h, for Collect.
absl::StatusOr<Job> JobRow(const Statement& row) { return rows::ReadJob(row); }
absl::StatusOr<Task> TaskRow(const Statement& row) { return rows::ReadTask(row); }
absl::StatusOr<Executor> ExecutorRow(const Statement& row) { return rows::ReadExecutor(row); }
absl::StatusOr<TokenRecord> TokenRow(const Statement& row) { return rows::ReadToken(row); }
absl::StatusOr<ModelRecord> ModelRow(const Statement& row) { return rows::ReadModel(row); }
absl::StatusOr<Team> TeamRow(const Statement& row) { return rows::ReadTeam(row); }
absl::StatusOr<std::string> TextRow(const Statement& row) { return row.Text(0); }
absl::StatusOr<PendingGangTask> PendingGangTaskRow(const Statement& row) { return gang_rows::ReadPendingGangTask(row); }
absl::StatusOr<TaskId> KeyRow(const Statement& row) { return TaskId{row.Text(0), row.Int(1)}; }
absl::StatusOr<FleetHistoryRow> FleetHistoryRowOf(const Statement& row) {
  return FleetHistoryRow{row.Time(0), row.Text(1)};
}
absl::StatusOr<FleetTokensRow> FleetTokensRowOf(const Statement& row) {
  return FleetTokensRow{row.Time(0), row.Text(1), TokenUsage{row.Int(2), row.Int(3)}};
}

// The dashboard's tables (fleet_history, fleet_tokens): their rows from `since` on, and the
// deletion of those before `keep_after`.
template <typename T>
absl::StatusOr<std::vector<T>> RowsSince(Connection& c, const char* sql, absl::Time since,
                                         absl::StatusOr<T> (*read)(const Statement&)) {
  ASSIGN_OR_RETURN(Statement query, c.Prepare(sql));
  query.BindTime(":since", since);
  return Collect<T>(query, read);
}
absl::Status PruneBefore(Connection& c, const char* sql, absl::Time keep_after) {
  ASSIGN_OR_RETURN(Statement prune, c.Prepare(sql));
  return prune.BindTime(":keep_after", keep_after).Run();
}

// The one integer a query answers (0 when it answers no row).
absl::StatusOr<int64_t> Count(Statement& query) {
  ASSIGN_OR_RETURN(bool row, query.Step());
  return row ? query.Int(0) : 0;
}

// Folds seat rows into gangs (store/common/gang_rows.h).
absl::StatusOr<std::vector<GangLease>> Gangs(Statement& query) {
  std::vector<GangLease> gangs;
  while (true) {
    ASSIGN_OR_RETURN(bool row, query.Step());
    if (!row) return gangs;
    gang_rows::AddSeat(query, gangs);
  }
}

std::optional<GangLease> First(std::vector<GangLease> gangs) {
  if (gangs.empty()) return std::nullopt;
  return std::move(gangs.front());
}

}  // namespace

// --- keyed rows ---

absl::StatusOr<Rows> SqliteTransaction::Read(const RowKeys& keys, Locking) {
  Rows out;
  ASSIGN_OR_RETURN(std::vector<Task> tasks, TasksByKey(keys.tasks));
  for (Task& task : tasks) out.tasks.emplace(TaskId{task.job_id, task.index}, std::move(task));
  for (const std::string& id : keys.executors) {
    ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kSelectExecutor));
    query.BindText(":id", id);
    ASSIGN_OR_RETURN(std::vector<Executor> found, Collect<Executor>(query, ExecutorRow));
    for (Executor& executor : found) out.executors.emplace(id, std::move(executor));
  }
  for (const std::string& id : keys.jobs) {
    ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kSelectJob));
    query.BindText(":id", id);
    ASSIGN_OR_RETURN(std::vector<Job> found, Collect<Job>(query, JobRow));
    for (Job& job : found) out.jobs.emplace(id, std::move(job));
  }
  for (const std::string& name : keys.teams) {
    ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kSelectTeam));
    query.BindText(":name", name);
    ASSIGN_OR_RETURN(std::vector<Team> found, Collect<Team>(query, TeamRow));
    for (Team& team : found) out.teams.emplace(name, std::move(team));
  }
  for (const auto& [statement, key_list] :
       {std::pair{sql::kTokenById, &keys.tokens}, std::pair{sql::kTokenByHash, &keys.token_hashes}}) {
    for (const std::string& key : *key_list) {
      ASSIGN_OR_RETURN(Statement query, c_.Prepare(statement));
      query.BindText(":key", key);
      ASSIGN_OR_RETURN(std::vector<TokenRecord> found, Collect<TokenRecord>(query, TokenRow));
      for (TokenRecord& token : found) out.tokens.emplace(token.id, std::move(token));
    }
  }
  return out;
}

absl::StatusOr<std::vector<Task>> SqliteTransaction::TasksByKey(const std::vector<TaskId>& keys) {
  std::vector<TaskId> sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::vector<Task> tasks;
  for (const auto& [job_id, index] : sorted) {
    ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kSelectTask));
    query.BindText(":job_id", job_id).BindInt(":idx", index);
    ASSIGN_OR_RETURN(std::vector<Task> found, Collect<Task>(query, TaskRow));
    for (Task& task : found) tasks.push_back(std::move(task));
  }
  return tasks;
}

absl::Status SqliteTransaction::WriteRow(const char* sql, const rows::Values& values, const char* what) {
  ASSIGN_OR_RETURN(Statement statement, c_.Prepare(sql));
  RETURN_IF_ERROR(statement.BindValues(values).Run());
  if (statement.Changes() != 1) {
    return absl::NotFoundError(absl::StrCat("no ", what, " ", KeyText(values)));
  }
  return absl::OkStatus();
}

absl::Status SqliteTransaction::WriteRows(const RowWrites& rows, const RowStatements& sql) {
  for (const Job& job : rows.jobs) RETURN_IF_ERROR(WriteRow(sql.job, sql.job_values(job), "job"));
  for (const Task& task : rows.tasks) RETURN_IF_ERROR(WriteRow(sql.task, rows::TaskValues(task), "task"));
  for (const Executor& executor : rows.executors) {
    RETURN_IF_ERROR(WriteRow(sql.executor, rows::ExecutorValues(executor), "executor"));
  }
  for (const Team& team : rows.teams) RETURN_IF_ERROR(WriteRow(sql.team, rows::TeamValues(team), "team"));
  for (const TokenRecord& token : rows.tokens) RETURN_IF_ERROR(WriteRow(sql.token, rows::TokenValues(token), "token"));
  if (!rows.models.empty() && sql.model == nullptr) return absl::InternalError("models are inserted, never updated");
  for (const ModelRecord& model : rows.models) RETURN_IF_ERROR(WriteRow(sql.model, rows::ModelValues(model), "model"));
  return absl::OkStatus();
}

absl::Status SqliteTransaction::Insert(const RowWrites& rows) {
  // A new job's counts, zeros, with it.
  static constexpr RowStatements kInserts{
      sql::kInsertJob,
      sql::kInsertTask,
      sql::kInsertExecutor,
      sql::kInsertTeam,
      sql::kInsertToken,
      sql::kInsertModel,
      [](const Job& job) {
        rows::Values values = rows::JobValues(job);
        const rows::Values counts = rows::JobCountValues(job);
        values.insert(values.end(), counts.begin(), counts.end());
        return values;
      }};
  return WriteRows(rows, kInserts);
}

absl::Status SqliteTransaction::Update(const RowWrites& rows, bool) {
  static constexpr RowStatements kUpdates{sql::kUpdateJob,   sql::kUpdateTask,  sql::kUpdateExecutor,
                                          sql::kUpdateTeam,  sql::kUpdateToken, /*model=*/nullptr,
                                          &rows::JobValues};
  return WriteRows(rows, kUpdates);
}

// --- jobs ---

absl::StatusOr<std::vector<Job>> SqliteTransaction::ListJobs(const JobFilter& filter) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kListJobs));
  if (filter.state) {
    query.BindText(":state", std::string(JobStateName(*filter.state)));
  } else {
    query.BindNull(":state");
  }
  query.BindText(":team", filter.team).BindInt(":limit", Limit(filter.limit));
  return Collect<Job>(query, JobRow);
}

absl::StatusOr<std::vector<Job>> SqliteTransaction::JobsInState(JobState state, int limit) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kJobsInState));
  query.BindText(":state", std::string(JobStateName(state))).BindInt(":limit", Limit(limit));
  return Collect<Job>(query, JobRow);
}

absl::StatusOr<std::vector<std::string>> SqliteTransaction::UnsettledJobs() {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kUnsettledJobs));
  return Collect<std::string>(query, TextRow);
}

absl::StatusOr<int64_t> SqliteTransaction::CountActiveJobs(const std::string& team) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kCountActiveJobs));
  query.BindText(":team", team);
  return Count(query);
}

absl::StatusOr<std::vector<Job>> SqliteTransaction::ActiveJobsNeedingModel(const std::string& team,
                                                                           const std::string& digest) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kJobsNeedingDigest));
  query.BindText(":team", team).BindText(":digest", digest);
  return Collect<Job>(query, JobRow);
}

absl::StatusOr<std::string> SqliteTransaction::LastFailure(const std::string& job_id) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kLastFailure));
  query.BindText(":job_id", job_id);
  ASSIGN_OR_RETURN(std::vector<std::string> errors, Collect<std::string>(query, TextRow));
  return errors.empty() ? "" : errors.front();
}

absl::Status SqliteTransaction::SetJobTokens(const std::string& job_id, const TokenUsage& tokens) {
  ASSIGN_OR_RETURN(Statement statement, c_.Prepare(sql::kSetJobTokens));
  return statement.BindInt(":prompt", tokens.prompt_tokens)
      .BindInt(":completion", tokens.completion_tokens)
      .BindInt(":reasoning", tokens.reasoning_tokens)
      .BindText(":id", job_id)
      .Run();
}

// --- tasks ---

absl::StatusOr<std::vector<Task>> SqliteTransaction::TasksOfJob(const std::string& job_id) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kSelectTasksOfJob));
  query.BindText(":job_id", job_id);
  return Collect<Task>(query, TaskRow);
}

absl::StatusOr<std::vector<Task>> SqliteTransaction::RunningTasks() {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kRunningTasks));
  return Collect<Task>(query, TaskRow);
}

absl::StatusOr<TaskStateCounts> SqliteTransaction::CountTasks(const std::string& job_id) {
  TaskStateCounts counts;
  {
    ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kCountPending));
    query.BindText(":job_id", job_id);
    ASSIGN_OR_RETURN(counts.pending, Count(query));
  }
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kCountRunning));
  query.BindText(":job_id", job_id);
  ASSIGN_OR_RETURN(bool row, query.Step());
  if (row) {
    counts.running = query.Int(0);
    counts.executors = query.Int(1);
    counts.records_in_flight = query.Int(2);
  }
  return counts;
}

absl::StatusOr<bool> SqliteTransaction::AnyTaskPending() {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kAnyPending));
  ASSIGN_OR_RETURN(int64_t any, Count(query));
  return any != 0;
}

absl::StatusOr<std::vector<Task>> SqliteTransaction::ExpiredLeases(absl::Time now, int limit) {
  std::vector<TaskId> keys;
  {
    ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kExpiredLeases));
    query.BindTime(":now", now).BindInt(":limit", Limit(limit));
    ASSIGN_OR_RETURN(keys, Collect<TaskId>(query, KeyRow));
  }
  // In expiry order (TasksByKey answers in key order).
  ASSIGN_OR_RETURN(std::vector<Task> found, TasksByKey(keys));
  std::map<TaskId, Task> by_key;
  for (Task& task : found) by_key.emplace(TaskId{task.job_id, task.index}, std::move(task));
  std::vector<Task> tasks;
  for (const TaskId& key : keys) {
    if (auto it = by_key.find(key); it != by_key.end()) tasks.push_back(std::move(it->second));
  }
  return tasks;
}

absl::StatusOr<std::vector<Task>> SqliteTransaction::TasksHeldBy(const std::string& executor_id) {
  std::vector<TaskId> keys;
  {
    ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kTasksOfExecutor));
    query.BindText(":executor", executor_id).BindText(":shadow", absl::StrCat("%\"", executor_id, "\"%"));
    ASSIGN_OR_RETURN(keys, Collect<TaskId>(query, KeyRow));
  }
  return TasksByKey(keys);
}

absl::StatusOr<std::map<std::string, absl::Time>> SqliteTransaction::ChargedUntil(
    const std::vector<std::string>& executor_ids) {
  std::map<std::string, absl::Time> charged;
  for (const std::string& id : executor_ids) {
    ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kChargedUntil));
    query.BindText(":id", id);
    ASSIGN_OR_RETURN(bool row, query.Step());
    if (!row) continue;
    if (std::optional<absl::Time> at = query.OptTime(0)) charged[id] = *at;
  }
  return charged;
}

absl::StatusOr<std::vector<LeaseCandidate>> SqliteTransaction::LeaseCandidates(const LeaseQuery& lease,
                                                                               std::map<std::string, Job>& jobs) {
  struct Found {
    TaskId key;
    std::string team;
  };
  std::vector<Found> found;
  {
    ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kLeaseCandidates));
    query.BindTime(":now", lease.now)
        .BindInt(":memory_bytes", lease.memory_bytes)
        .BindText(":runners", DumpJson(Json(lease.runners)))
        .BindText(":ranks", lease.fair_share_ranks)
        .BindText(":loaded", lease.loaded_model)
        .BindText(":cached", DumpJson(Json(lease.cached_models)))
        .BindTime(":cold_before", lease.cold_before)
        .BindInt(":affinity", lease.model_affinity ? 1 : 0)
        .BindInt(":confined", lease.confined ? 1 : 0)
        .BindInt(":limit", lease.limit);
    ASSIGN_OR_RETURN(found, Collect<Found>(query, [](const Statement& row) -> absl::StatusOr<Found> {
                       return Found{{row.Text(0), row.Int(1)}, row.Text(2)};
                     }));
  }
  std::vector<LeaseCandidate> candidates;
  for (Found& candidate : found) {
    if (!jobs.contains(candidate.key.first)) {
      ASSIGN_OR_RETURN(Rows rows, Read(RowKeys{.jobs = {candidate.key.first}}, Locking::kNone));
      for (auto& [id, job] : rows.jobs) jobs.emplace(id, std::move(job));
    }
    ASSIGN_OR_RETURN(std::vector<Task> task, TasksByKey({candidate.key}));
    if (task.empty()) continue;
    candidates.push_back(LeaseCandidate{std::move(task.front()), std::move(candidate.team)});
  }
  return candidates;
}

absl::StatusOr<std::vector<PendingGangTask>> SqliteTransaction::PendingGangTasks(absl::Time now, int limit) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kGangCandidates));
  query.BindTime(":now", now).BindInt(":limit", limit);
  return Collect<PendingGangTask>(query, PendingGangTaskRow);
}

// --- executors ---

absl::StatusOr<std::vector<Executor>> SqliteTransaction::ListExecutors() {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kListExecutors));
  return Collect<Executor>(query, ExecutorRow);
}

absl::StatusOr<std::vector<Executor>> SqliteTransaction::SilentExecutors(absl::Time cutoff) {
  std::vector<std::string> ids;
  {
    ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kSilentExecutors));
    query.BindTime(":cutoff", cutoff);
    ASSIGN_OR_RETURN(ids, Collect<std::string>(query, TextRow));
  }
  ASSIGN_OR_RETURN(Rows rows, Read(RowKeys{.executors = ids}, Locking::kLock));
  std::vector<Executor> silent;
  for (const std::string& id : ids) {
    if (auto it = rows.executors.find(id); it != rows.executors.end()) silent.push_back(std::move(it->second));
  }
  return silent;
}

// --- fair share ---

absl::StatusOr<std::vector<TeamUsage>> SqliteTransaction::TeamStandings(absl::Time now) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kTeamUsage));
  query.BindTime(":now", now);
  const absl::Duration half_life = options_.fair_share_half_life;
  return Collect<TeamUsage>(query, [&](const Statement& row) -> absl::StatusOr<TeamUsage> {
    return rows::ReadTeamUsage(row, now, half_life);
  });
}

absl::StatusOr<std::map<std::string, int64_t>> SqliteTransaction::LockTeamUsage(const std::set<std::string>&) {
  return std::map<std::string, int64_t>{};  // one writer: nothing to lock, nothing changed since read
}

// --- teams and credentials ---

absl::StatusOr<std::vector<Team>> SqliteTransaction::ListTeams() {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kListTeams));
  return Collect<Team>(query, TeamRow);
}

absl::StatusOr<std::vector<TokenRecord>> SqliteTransaction::ListTokens(const TokenFilter& filter) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kListTokens));
  query.BindText(":team", filter.team)
      .BindText(":role", filter.role ? std::string(RoleName(*filter.role)) : "")
      .BindText(":principal", filter.principal)
      .BindInt(":include_revoked", filter.include_revoked ? 1 : 0);
  return Collect<TokenRecord>(query, TokenRow);
}

absl::StatusOr<std::vector<TokenRecord>> SqliteTransaction::LiveExecutorTokens(const std::string& executor_id) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kLiveExecutorTokens));
  query.BindText(":principal", executor_id);
  return Collect<TokenRecord>(query, TokenRow);
}

absl::Status SqliteTransaction::RecordTokenUse(const std::vector<std::string>& token_ids, absl::Time at) {
  for (const std::string& id : token_ids) {
    ASSIGN_OR_RETURN(Statement update, c_.Prepare(sql::kRecordUse));
    RETURN_IF_ERROR(update.BindText(":id", id).BindTime(":at", at).Run());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> SqliteTransaction::RevokedTokensSince(absl::Time since) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kRevokedTokensSince));
  query.BindTime(":since", since);
  return Collect<std::string>(query, TextRow);
}

// --- models ---

absl::StatusOr<std::vector<ModelRecord>> SqliteTransaction::ModelsNamed(const std::string& team,
                                                                        const std::string& name,
                                                                        const std::string& digest, Locking) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kModelsNamed));
  query.BindText(":team", team).BindText(":name", name).BindText(":digest", digest);
  return Collect<ModelRecord>(query, ModelRow);
}

absl::StatusOr<std::optional<ModelRecord>> SqliteTransaction::ModelWithDigest(const std::string& team,
                                                                              const std::string& digest) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kModelByDigest));
  query.BindText(":team", team).BindText(":digest", digest);
  ASSIGN_OR_RETURN(std::vector<ModelRecord> found, Collect<ModelRecord>(query, ModelRow));
  if (found.empty()) return std::optional<ModelRecord>();
  return std::optional<ModelRecord>(std::move(found.front()));
}

absl::StatusOr<std::vector<ModelRecord>> SqliteTransaction::ListModels(const std::string& team) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kListModels));
  query.BindText(":team", team);
  return Collect<ModelRecord>(query, ModelRow);
}

absl::Status SqliteTransaction::DeleteModel(const ModelRecord& model) {
  ASSIGN_OR_RETURN(Statement remove, c_.Prepare(sql::kDeleteModel));
  return remove.BindText(":team", model.team).BindText(":name", model.name).BindText(":digest", model.digest).Run();
}

absl::StatusOr<int64_t> SqliteTransaction::CountModelsWithDigest(const std::string& team, const std::string& digest) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kDigestNamed));
  query.BindText(":team", team).BindText(":digest", digest);
  return Count(query);
}

// --- gangs ---

absl::StatusOr<std::optional<GangLease>> SqliteTransaction::SeatOf(const std::string& executor_id) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kSeatOf));
  query.BindText(":executor", executor_id);
  ASSIGN_OR_RETURN(std::vector<GangLease> gangs, Gangs(query));
  return First(std::move(gangs));
}

absl::StatusOr<std::optional<GangLease>> SqliteTransaction::GangOfAttempt(const std::string& job_id,
                                                                         int64_t task_index, int attempt) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kSeatsOfAttempt));
  query.BindText(":job", job_id).BindInt(":index", task_index).BindInt(":attempt", attempt);
  ASSIGN_OR_RETURN(std::vector<GangLease> gangs, Gangs(query));
  return First(std::move(gangs));
}

absl::StatusOr<std::vector<GangLease>> SqliteTransaction::ListGangs() {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kAllSeats));
  return Gangs(query);
}

absl::StatusOr<bool> SqliteTransaction::InsertGang(const GangLease& gang) {
  for (const rows::Values& values : gang_rows::SeatValues(gang)) {
    ASSIGN_OR_RETURN(Statement insert, c_.Prepare(sql::kInsertSeat));
    RETURN_IF_ERROR(insert.BindValues(values).Run());
    if (insert.Changes() != 1) return false;
  }
  return true;
}

absl::StatusOr<int64_t> SqliteTransaction::DeleteGang(const std::string& job_id, int64_t task_index, int attempt) {
  ASSIGN_OR_RETURN(Statement remove, c_.Prepare(sql::kDeleteAttempt));
  RETURN_IF_ERROR(remove.BindText(":job", job_id).BindInt(":index", task_index).BindInt(":attempt", attempt).Run());
  return remove.Changes();
}

// --- settings and task sizes ---

absl::Status SqliteTransaction::InsertSettingIfAbsent(const std::string& name, const std::string& value,
                                                      absl::Time at) {
  ASSIGN_OR_RETURN(Statement insert, c_.Prepare(sql::kInsertSetting));
  return insert.BindText(":name", name).BindText(":value", value).BindTime(":at", at).Run();
}

absl::StatusOr<std::string> SqliteTransaction::Setting(const std::string& name) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kSelectSetting));
  query.BindText(":name", name);
  ASSIGN_OR_RETURN(std::vector<std::string> values, Collect<std::string>(query, TextRow));
  return values.empty() ? "" : values.front();
}

absl::Status SqliteTransaction::AddThroughputSample(const ThroughputKey& key, const ThroughputSample& sample,
                                                    absl::Time now) {
  ASSIGN_OR_RETURN(Statement upsert, c_.Prepare(sql::kRecordThroughput));
  return upsert.BindText(":model", key.model)
      .BindText(":runner", key.runner)
      .BindText(":records", absl::StrCat(sample.records))
      .BindText(":seconds", absl::StrFormat("%.9g", absl::ToDoubleSeconds(sample.took)))
      .BindText(":keep", absl::StrFormat("%.9g", kThroughputMemory))
      .BindTime(":at", now)
      .Run();
}

absl::StatusOr<std::optional<Throughput>> SqliteTransaction::GetThroughput(const ThroughputKey& key) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kSelectThroughput));
  query.BindText(":model", key.model).BindText(":runner", key.runner);
  ASSIGN_OR_RETURN(bool row, query.Step());
  if (!row) return std::optional<Throughput>();
  Throughput throughput;
  if (!absl::SimpleAtod(query.Text(0), &throughput.records) || !absl::SimpleAtod(query.Text(1), &throughput.seconds)) {
    return absl::DataLossError(absl::StrCat("task_throughput of ", key.model, " holds no number"));
  }
  throughput.samples = query.Int(2);
  throughput.updated_at = query.Time(3);
  return std::optional<Throughput>(throughput);
}

// --- the dashboard's history ---

absl::Status SqliteTransaction::InsertFleetHistory(const FleetHistoryRow& row, absl::Time keep_after) {
  ASSIGN_OR_RETURN(Statement insert, c_.Prepare(sql::kInsertFleetHistory));
  RETURN_IF_ERROR(insert.BindTime(":at", row.at).BindText(":point", row.point).Run());
  return PruneBefore(c_, sql::kPruneFleetHistory, keep_after);
}

absl::StatusOr<std::vector<FleetHistoryRow>> SqliteTransaction::ListFleetHistory(absl::Time since) {
  return RowsSince(c_, sql::kSelectFleetHistory, since, FleetHistoryRowOf);
}

absl::Status SqliteTransaction::AddFleetTokens(absl::Time at, const std::string& team, const TokenUsage& tokens) {
  ASSIGN_OR_RETURN(Statement add, c_.Prepare(sql::kAddFleetTokens));
  return add.BindTime(":at", at)
      .BindText(":team", team)
      .BindInt(":prompt", tokens.prompt_tokens)
      .BindInt(":completion", tokens.completion_tokens)
      .Run();
}

absl::Status SqliteTransaction::PruneFleetTokens(absl::Time keep_after) {
  return PruneBefore(c_, sql::kPruneFleetTokens, keep_after);
}

absl::StatusOr<std::vector<FleetTokensRow>> SqliteTransaction::ListFleetTokens(absl::Time since) {
  return RowsSince(c_, sql::kSelectFleetTokens, since, FleetTokensRowOf);
}

// --- verification ---

absl::Status SqliteTransaction::InsertVerification(const Verification& v) {
  ASSIGN_OR_RETURN(Statement insert, c_.Prepare(sql::kInsertVerification));
  RETURN_IF_ERROR(insert.BindText(":job", v.job_id)
                      .BindInt(":task", v.task_index)
                      .BindText(":record", v.custom_id)
                      .BindText(":producer", v.producer_id)
                      .BindText(":verifier", v.verifier_id)
                      .BindInt(":passed", v.passed ? 1 : 0)
                      .BindText(":reason", v.reason)
                      .BindTime(":at", v.at)
                      .Run());
  if (insert.Changes() != 1) {
    return absl::AlreadyExistsError(absl::StrCat("verifier ", v.verifier_id, " already judged record ", v.custom_id,
                                                 " of job ", v.job_id));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Verification>> SqliteTransaction::VerificationsOfJob(const std::string& job_id) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kVerificationsOfJob));
  query.BindText(":job", job_id);
  return Collect<Verification>(query, [](const Statement& row) -> absl::StatusOr<Verification> {
    return Verification{row.Text(0), row.Int(1), row.Text(2), row.Text(3), row.Text(4),
                        row.Int(5) != 0, row.Text(6), row.Time(7)};
  });
}

// --- spot checks ---

namespace {

absl::StatusOr<VerificationTask> VerificationTaskRow(const Statement& row) {
  VerificationTask task{row.Text(0), row.Int(1), static_cast<int>(row.Int(2)), static_cast<int>(row.Int(3)),
                        row.Text(4)};
  ASSIGN_OR_RETURN(task.records, DecodeRecords(row.Text(5)));
  task.verifier_id = row.Text(6);
  task.lease_expires_at = row.OptTime(7);
  task.created_at = row.Time(8);
  task.disputed_verifier = row.Text(9);
  task.chunk_begin = row.Int(10);
  task.chunk_end = row.Int(11);
  return task;
}

Statement& BindVerificationKey(Statement& statement, const VerificationTask& task) {
  return statement.BindText(":job", task.job_id)
      .BindInt(":task", task.task_index)
      .BindInt(":attempt", task.attempt)
      .BindInt(":seq", task.seq);
}

}  // namespace

absl::Status SqliteTransaction::InsertVerificationTasks(const std::vector<VerificationTask>& tasks) {
  for (const VerificationTask& task : tasks) {
    ASSIGN_OR_RETURN(Statement insert, c_.Prepare(sql::kInsertVerificationTask));
    RETURN_IF_ERROR(BindVerificationKey(insert, task)
                        .BindText(":producer", task.producer_id)
                        .BindText(":records", EncodeRecords(task.records))
                        .BindText(":verifier", task.verifier_id)
                        .BindTime(":expires", task.lease_expires_at)
                        .BindTime(":created", task.created_at)
                        .BindText(":disputed", task.disputed_verifier)
                        .BindInt(":begin", task.chunk_begin)
                        .BindInt(":end", task.chunk_end)
                        .Run());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<VerificationTask>> SqliteTransaction::LeasableVerificationTasks(
    const std::string& executor_id, absl::Time now, int64_t limit) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kLeasableVerificationTasks));
  query.BindText(":executor", executor_id).BindTime(":now", now).BindInt(":limit", limit);
  return Collect<VerificationTask>(query, VerificationTaskRow);
}

absl::StatusOr<std::optional<VerificationTask>> SqliteTransaction::GetVerificationTask(const std::string& job_id,
                                                                                       int64_t task_index,
                                                                                       int attempt, int seq) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kSelectVerificationTask));
  BindVerificationKey(query, VerificationTask{job_id, task_index, attempt, seq});
  ASSIGN_OR_RETURN(std::vector<VerificationTask> found, Collect<VerificationTask>(query, VerificationTaskRow));
  if (found.empty()) return std::optional<VerificationTask>();
  return std::optional<VerificationTask>(std::move(found.front()));
}

absl::Status SqliteTransaction::UpdateVerificationTask(const VerificationTask& task) {
  ASSIGN_OR_RETURN(Statement update, c_.Prepare(sql::kUpdateVerificationTask));
  RETURN_IF_ERROR(BindVerificationKey(update, task)
                      .BindText(":verifier", task.verifier_id)
                      .BindTime(":expires", task.lease_expires_at)
                      .Run());
  if (update.Changes() != 1) return absl::NotFoundError("the verification task is gone");
  return absl::OkStatus();
}

absl::Status SqliteTransaction::DeleteVerificationTask(const VerificationTask& task) {
  ASSIGN_OR_RETURN(Statement remove, c_.Prepare(sql::kDeleteVerificationTask));
  return BindVerificationKey(remove, task).Run();
}

absl::StatusOr<int64_t> SqliteTransaction::CountVerificationTasks(const std::string& job_id) {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kCountVerificationTasks));
  query.BindText(":job", job_id);
  return Count(query);
}

// --- ending attempts ---

absl::Status SqliteTransaction::EndAttempts(const AttemptWrites& writes, absl::Time now,
                                            std::set<std::string>* finished) {
  for (const Task& task : writes.tasks) RETURN_IF_ERROR(WriteRow(sql::kUpdateTask, rows::TaskValues(task), "task"));
  for (const auto& [job_id, added] : writes.counts) {
    ASSIGN_OR_RETURN(Statement add, c_.Prepare(sql::kAddJobCounts));
    RETURN_IF_ERROR(add.BindInt(":completed", added.counts.completed)
                        .BindInt(":failed", added.counts.failed)
                        .BindInt(":done", added.tasks_done)
                        .BindInt(":succeeded", added.tasks_succeeded)
                        .BindTime(":now", now)
                        .BindText(":id", job_id)
                        .Run());
  }
  for (const auto& [executor_id, records] : writes.records) {
    ASSIGN_OR_RETURN(Statement add, c_.Prepare(sql::kAddExecutorRecords));
    RETURN_IF_ERROR(add.BindInt(":records", records).BindText(":id", executor_id).Run());
  }
  for (const auto& [executor_id, at] : writes.charged_until) {
    ASSIGN_OR_RETURN(Statement move, c_.Prepare(sql::kMoveChargedUntil));
    RETURN_IF_ERROR(move.BindTime(":at", at).BindText(":id", executor_id).Run());
  }
  RETURN_IF_ERROR(ChargeUsage(writes.charges, now));
  if (finished == nullptr) return absl::OkStatus();
  for (const auto& [job_id, added] : writes.counts) {
    ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kJobFinished));
    query.BindText(":id", job_id);
    ASSIGN_OR_RETURN(int64_t done, Count(query));
    if (done > 0) finished->insert(job_id);
  }
  return absl::OkStatus();
}

absl::Status SqliteTransaction::ChargeUsage(const std::map<std::string, absl::Duration>& by_job, absl::Time now) {
  std::map<std::string, absl::Duration> by_team;
  for (const auto& [job_id, time] : by_job) {
    if (time <= absl::ZeroDuration()) continue;
    ASSIGN_OR_RETURN(Rows rows, Read(RowKeys{.jobs = {job_id}}, Locking::kNone));
    auto job = rows.jobs.find(job_id);
    if (job == rows.jobs.end()) return absl::NotFoundError(absl::StrCat("no job ", job_id));
    const absl::Duration device_time = store_rules::DeviceTime(time, job->second.spec);
    by_team[job->second.spec.team] += device_time;
    ASSIGN_OR_RETURN(Statement charge, c_.Prepare(sql::kChargeJobDevice));
    RETURN_IF_ERROR(charge.BindInt(":us", absl::ToInt64Microseconds(device_time)).BindText(":id", job_id).Run());
  }
  for (const auto& [team, time] : by_team) {
    absl::Duration usage;
    absl::Time at = now;
    {
      ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kTeamUsageOf));
      query.BindText(":team", team);
      ASSIGN_OR_RETURN(bool row, query.Step());
      if (row) {
        usage = absl::Microseconds(query.Int(0));
        at = absl::FromUnixMicros(query.Int(1));
      }
    }
    usage = DecayUsage(usage, at, now, options_.fair_share_half_life) + time;
    ASSIGN_OR_RETURN(Statement upsert, c_.Prepare(sql::kChargeUsage));
    RETURN_IF_ERROR(upsert.BindText(":team", team)
                        .BindInt(":usage_us", absl::ToInt64Microseconds(usage))
                        .BindInt(":charge_us", absl::ToInt64Microseconds(time))
                        .BindTime(":usage_at", std::max(at, now))
                        .Run());
  }
  return absl::OkStatus();
}

// --- the schema ---

absl::Status SqliteTransaction::LockSchema() {
  // The transaction holds the database's write lock (BEGIN IMMEDIATE): that serialises migrating.
  return c_.Exec(sql::kCreateMigrationsTable);
}

absl::StatusOr<SchemaState> SqliteTransaction::SchemaVersion() {
  ASSIGN_OR_RETURN(Statement query, c_.Prepare(sql::kSchemaVersion));
  ASSIGN_OR_RETURN(int64_t version, Count(query));
  return SchemaState{static_cast<int>(version), where_};
}

absl::Status SqliteTransaction::ApplyMigration(const store_common::Migration& migration) {
  RETURN_IF_ERROR(c_.Exec(migration.sql));
  ASSIGN_OR_RETURN(Statement record, c_.Prepare(sql::kRecordMigration));
  return record.BindInt(":version", migration.version).Run();
}

}  // namespace minions::sqlite_store
