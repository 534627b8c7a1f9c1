#include "store/postgres/postgres_transaction.h"

#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "model/json_codec.h"
#include "model/state_machines.h"
#include "store/common/gang_rows.h"
#include "store/common/store_rows.h"
#include "store/postgres/postgres_statements.h"

namespace minions::postgres_store {
namespace {

namespace rows = store_rows;

// Counter shards per job: a completion adds to one at random, so that completers of one job
// rarely wait on each other (16: several times the connections one server pool has).
constexpr int kCounterShards = 16;

int RandomShard() {
  static thread_local std::mt19937 random(std::random_device{}());
  return std::uniform_int_distribution<int>(0, kCounterShards - 1)(random);
}

std::string Name(std::string_view name) { return std::string(name); }

// Every row of `result`, each read by `read` (a function of a Row that returns a T or a
// StatusOr<T>), from row `first` on.
template <typename T, typename Read>
absl::StatusOr<std::vector<T>> Collect(const PgResult& result, Read read) {
  std::vector<T> out;
  out.reserve(result.Rows());
  for (int i = 0; i < result.Rows(); ++i) {
    absl::StatusOr<T> value = read(Row{result, i});
    RETURN_IF_ERROR(value.status());
    out.push_back(*std::move(value));
  }
  return out;
}

absl::StatusOr<Job> JobRow(const Row& row) { return rows::ReadJob(row); }
absl::StatusOr<Task> TaskRow(const Row& row) { return rows::ReadTask(row); }
absl::StatusOr<Executor> ExecutorRow(const Row& row) { return rows::ReadExecutor(row); }
absl::StatusOr<TokenRecord> TokenRow(const Row& row) { return rows::ReadToken(row); }
absl::StatusOr<ModelRecord> ModelRow(const Row& row) { return rows::ReadModel(row); }
absl::StatusOr<Team> TeamRow(const Row& row) { return rows::ReadTeam(row); }
absl::StatusOr<std::string> TextRow(const Row& row) { return row.Text(0); }
absl::StatusOr<PendingGangTask> PendingGangTaskRow(const Row& row) { return gang_rows::ReadPendingGangTask(row); }

std::vector<GangLease> Gangs(const PgResult& result) {
  std::vector<GangLease> gangs;
  for (int i = 0; i < result.Rows(); ++i) gang_rows::AddSeat(Row{result, i}, gangs);
  return gangs;
}

std::optional<GangLease> First(std::vector<GangLease> gangs) {
  if (gangs.empty()) return std::nullopt;
  return std::move(gangs.front());
}

// Rows as one array parameter per column, `columns` values each (for unnest(...)).
template <typename T>
Params Arrays(const std::vector<T>& items, rows::Values (*values)(const T&), int columns) {
  std::vector<rows::Values> table;
  table.reserve(items.size());
  for (const T& item : items) table.push_back(values(item));
  return std::move(Params().Columns(table, columns));
}

Params TaskKeys(const std::vector<TaskId>& keys) {
  std::vector<rows::Values> values;
  values.reserve(keys.size());
  for (const auto& [job_id, index] : keys) values.push_back({job_id, index});
  return std::move(Params().Columns(values, 2));
}

Params Ids(const std::vector<std::string>& ids) {
  std::vector<rows::Values> values;
  values.reserve(ids.size());
  for (const std::string& id : ids) values.push_back({id});
  return std::move(Params().Columns(values, 1));
}

// What each statement of a Read answers, in the order they were sent.
enum class Answer { kTasks, kExecutorAndTasks, kExecutors, kExecutorIds, kJob, kTeam, kToken };

// Adds each row of `result`, read by `read`, to `by_key` under its key (`key_of` the row).
template <typename Map, typename Read, typename KeyOf>
absl::Status AddRows(const PgResult& result, Read read, KeyOf key_of, Map& by_key) {
  ASSIGN_OR_RETURN(std::vector<typename Map::mapped_type> found, (Collect<typename Map::mapped_type>(result, read)));
  for (auto& row : found) {
    auto key = key_of(row);
    by_key.emplace(std::move(key), std::move(row));
  }
  return absl::OkStatus();
}

std::string IdOf(const Executor& executor) { return executor.id; }
std::string IdOf(const Job& job) { return job.id; }
std::string IdOf(const TokenRecord& token) { return token.id; }
std::string IdOf(const Team& team) { return team.name; }
TaskId IdOf(const Task& task) { return {task.job_id, task.index}; }
std::string IdOf(const ModelRecord& model) { return absl::StrCat(model.team, "/", model.name, "@", model.digest); }

// Reads the answer of one statement of a Read into `out`.
absl::Status Take(Answer answer, const PgResult& result, Rows& out) {
  auto id_of = [](const auto& row) { return IdOf(row); };
  switch (answer) {
    case Answer::kExecutorAndTasks:
      // One row per task (NULL task columns when there are none), the executor's count first.
      for (int i = 0; i < result.Rows(); ++i) {
        if (i == 0 && result.Int(0, 0) > 0) out.executors.emplace("", Executor{});  // named by Read
        if (result.IsNull(i, 1)) continue;
        ASSIGN_OR_RETURN(Task task, rows::ReadTask(Row{result, i}, 1));
        out.tasks.emplace(IdOf(task), std::move(task));
      }
      return absl::OkStatus();
    case Answer::kTasks:
      return AddRows(result, TaskRow, id_of, out.tasks);
    case Answer::kExecutors:
      return AddRows(result, ExecutorRow, id_of, out.executors);
    case Answer::kExecutorIds:
      return AddRows(
          result, [](const Row& row) -> absl::StatusOr<Executor> { return Executor{.id = row.Text(0)}; }, id_of,
          out.executors);
    case Answer::kJob:
      return AddRows(result, JobRow, id_of, out.jobs);
    case Answer::kTeam:
      return AddRows(result, TeamRow, id_of, out.teams);
    case Answer::kToken:
      return AddRows(result, TokenRow, id_of, out.tokens);
  }
  return absl::InternalError("an unknown answer");
}

// The statements of one Insert or Update, with how many rows each must touch.
struct Writes {
  std::vector<Connection::Statement> statements;
  std::vector<int64_t> expected;
  std::vector<std::string> what;  // for the message when a statement touched fewer rows
  void Add(const char* sql, Params params, int64_t rows, std::string about) {
    statements.push_back({sql, std::move(params)});
    expected.push_back(rows);
    what.push_back(std::move(about));
  }
  // One statement per row of `items`, with its values, each to touch its row.
  template <typename T>
  void AddEach(const std::vector<T>& items, const char* sql, rows::Values (*values)(const T&), const char* kind) {
    for (const T& item : items) Add(sql, std::move(Params().Values(values(item))), 1, absl::StrCat(kind, " ", IdOf(item)));
  }
};

// Checks each answer touched its rows: `missing` says what a shortfall is.
absl::Status CheckTouched(const Writes& writes, const std::vector<PgResult>& answers,
                          absl::Status (*missing)(const std::string& what)) {
  for (size_t i = 0; i < answers.size(); ++i) {  // empty when a COMMIT's answers were lost
    if (answers[i].Affected() != writes.expected[i]) return missing(writes.what[i]);
  }
  return absl::OkStatus();
}

absl::Status Taken(const std::string& what) { return absl::AlreadyExistsError(absl::StrCat(what, " exists")); }
absl::Status Vanished(const std::string& what) { return absl::NotFoundError(absl::StrCat("no ", what)); }

}  // namespace

// --- keyed rows ---

absl::StatusOr<Rows> PostgresTransaction::Read(const RowKeys& keys, Locking locking) {
  const bool lock = Locks(locking);
  std::vector<Connection::Statement> statements;
  std::vector<Answer> answers;
  // One executor's existence and the tasks it reports, in one statement (the tasks locked only if
  // it exists).
  const bool combined = keys.executor_ids_only && keys.executors.size() == 1 && !keys.tasks.empty() && lock;
  if (combined) {
    statements.push_back({sql::kExecutorAndTasksForUpdate, std::move(TaskKeys(keys.tasks).Text(keys.executors[0]))});
    answers.push_back(Answer::kExecutorAndTasks);
  } else {
    if (!keys.tasks.empty()) {
      statements.push_back({lock ? sql::kSelectTasksForUpdate : sql::kSelectTasks, TaskKeys(keys.tasks)});
      answers.push_back(Answer::kTasks);
    }
    if (keys.executors.size() == 1 && !keys.executor_ids_only) {
      statements.push_back({lock ? sql::kSelectExecutorForUpdate : sql::kSelectExecutor,
                            std::move(Params().Text(keys.executors[0]))});
      answers.push_back(Answer::kExecutors);
    } else if (!keys.executors.empty()) {
      const char* select = keys.executor_ids_only ? (lock ? sql::kExecutorIdsForUpdate : sql::kExecutorIds)
                                                  : (lock ? sql::kSelectExecutorsForUpdate : sql::kSelectExecutors);
      statements.push_back({select, Ids(keys.executors)});
      answers.push_back(keys.executor_ids_only ? Answer::kExecutorIds : Answer::kExecutors);
    }
  }
  // Rows by one key each: a statement a key.
  auto by_key = [&](const std::vector<std::string>& list, const char* plain, const char* locked, Answer answer) {
    for (const std::string& key : list) {
      statements.push_back({lock ? locked : plain, std::move(Params().Text(key))});
      answers.push_back(answer);
    }
  };
  by_key(keys.jobs, sql::kSelectJob, sql::kSelectJobForUpdate, Answer::kJob);
  by_key(keys.teams, sql::kSelectTeam, sql::kSelectTeamForUpdate, Answer::kTeam);
  by_key(keys.tokens, sql::kTokenById, sql::kTokenByIdForUpdate, Answer::kToken);
  by_key(keys.token_hashes, sql::kTokenByHash, sql::kTokenByHashForUpdate, Answer::kToken);
  Rows out;
  if (statements.empty()) return out;
  ASSIGN_OR_RETURN(std::vector<PgResult> results, c_.ExecEach(statements));
  for (size_t i = 0; i < results.size(); ++i) RETURN_IF_ERROR(Take(answers[i], results[i], out));
  if (combined) {
    // The executor's row was counted, not read: name it.
    if (auto known = out.executors.extract(""); !known.empty()) {
      known.key() = keys.executors[0];
      known.mapped().id = keys.executors[0];
      out.executors.insert(std::move(known));
    }
  }
  return out;
}

absl::Status PostgresTransaction::Insert(const RowWrites& rows) {
  Writes writes;
  writes.AddEach(rows.jobs, sql::kInsertJob, &rows::JobValues, "job");
  if (!rows.tasks.empty()) {
    writes.Add(sql::kInsertTasks, Arrays(rows.tasks, &rows::TaskValues, rows::kTaskColumns),
               static_cast<int64_t>(rows.tasks.size()), absl::StrCat("job ", rows.tasks.front().job_id, ": a task"));
  }
  writes.AddEach(rows.executors, sql::kInsertExecutor, &rows::ExecutorValues, "executor");
  writes.AddEach(rows.teams, sql::kInsertTeam, &rows::TeamValues, "team");
  writes.AddEach(rows.tokens, sql::kInsertToken, &rows::TokenValues, "token (or its hash)");
  writes.AddEach(rows.models, sql::kInsertModel, &rows::ModelValues, "model");
  if (writes.statements.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<PgResult> answers, c_.ExecEach(writes.statements));
  return CheckTouched(writes, answers, &Taken);
}

absl::Status PostgresTransaction::Update(const RowWrites& rows, bool last) {
  if (!rows.models.empty()) return absl::InternalError("models are inserted, never updated");
  Writes writes;
  writes.AddEach(rows.jobs, sql::kUpdateJob, &rows::JobValues, "job");
  if (!rows.tasks.empty()) {
    writes.Add(sql::kUpdateTasks, Arrays(rows.tasks, &rows::TaskValues, rows::kTaskColumns),
               static_cast<int64_t>(rows.tasks.size()), absl::StrCat("task of job ", rows.tasks.front().job_id));
  }
  if (rows.executors.size() > 1) {
    writes.Add(sql::kUpdateExecutors, Arrays(rows.executors, &rows::ExecutorValues, rows::kExecutorColumns),
               static_cast<int64_t>(rows.executors.size()), "executor of the batch");
  } else {
    writes.AddEach(rows.executors, sql::kUpdateExecutor, &rows::ExecutorValues, "executor");
  }
  writes.AddEach(rows.teams, sql::kUpdateTeam, &rows::TeamValues, "team");
  writes.AddEach(rows.tokens, sql::kUpdateToken, &rows::TokenValues, "token");
  if (writes.statements.empty()) return absl::OkStatus();
  // The rows were locked when read, so none can vanish: an assertion more than a check (with
  // `last` the transaction has committed by then).
  ASSIGN_OR_RETURN(std::vector<PgResult> answers,
                   last ? c_.ExecEachAndCommit(writes.statements) : c_.ExecEach(writes.statements));
  return CheckTouched(writes, answers, &Vanished);
}

// --- jobs ---

absl::StatusOr<std::vector<Job>> PostgresTransaction::ListJobs(const JobFilter& filter) {
  Params params;
  if (filter.state) {
    params.Text(Name(JobStateName(*filter.state)));
  } else {
    params.Null();
  }
  params.Text(filter.team).Limit(filter.limit);
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kListJobs, params));
  return Collect<Job>(result, JobRow);
}

absl::StatusOr<std::vector<Job>> PostgresTransaction::JobsInState(JobState state, int limit) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kJobsInState, Params().Text(Name(JobStateName(state))).Limit(limit)));
  return Collect<Job>(result, JobRow);
}

absl::StatusOr<std::vector<std::string>> PostgresTransaction::UnsettledJobs() {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kUnsettledJobs, Params()
                                                                     .Text(Name(JobStateName(JobState::kQueued)))
                                                                     .Text(Name(JobStateName(JobState::kRunning)))));
  return Collect<std::string>(result, TextRow);
}

absl::StatusOr<int64_t> PostgresTransaction::CountActiveJobs(const std::string& team) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kCountActiveJobs, Params().Text(team)));
  return result.Int(0, 0);
}

absl::StatusOr<std::vector<Job>> PostgresTransaction::ActiveJobsNeedingModel(const std::string& team,
                                                                             const std::string& digest) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kJobsNeedingDigest, Params().Text(team).Text(digest)));
  return Collect<Job>(result, JobRow);
}

absl::StatusOr<std::string> PostgresTransaction::LastFailure(const std::string& job_id) {
  ASSIGN_OR_RETURN(PgResult result,
                   c_.Exec(sql::kLastFailure, Params().Text(job_id).Text(Name(TaskStateName(TaskState::kFailed)))));
  return result.Rows() > 0 ? result.Text(0, 0) : "";
}

absl::Status PostgresTransaction::SetJobTokens(const std::string& job_id, const TokenUsage& tokens) {
  return c_.Exec(sql::kSetJobTokens, Params()
                                         .Text(job_id)
                                         .Int(tokens.prompt_tokens)
                                         .Int(tokens.completion_tokens)
                                         .Int(tokens.reasoning_tokens))
      .status();
}

// --- tasks ---

absl::StatusOr<std::vector<Task>> PostgresTransaction::TasksOfJob(const std::string& job_id) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(c_.for_update() ? sql::kSelectTasksOfJobForUpdate : sql::kSelectTasksOfJob,
                                            Params().Text(job_id)));
  return Collect<Task>(result, TaskRow);
}

absl::StatusOr<std::vector<Task>> PostgresTransaction::RunningTasks() {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kRunningTasks));
  return Collect<Task>(result, TaskRow);
}

absl::StatusOr<TaskStateCounts> PostgresTransaction::CountTasks(const std::string& job_id) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kCountTasks, Params().Text(job_id)));
  TaskStateCounts counts;
  counts.pending = result.Int(0, 0);
  counts.running = result.Int(0, 1);
  counts.executors = result.Int(0, 2);
  counts.records_in_flight = result.Int(0, 3);
  return counts;
}

absl::StatusOr<bool> PostgresTransaction::AnyTaskPending() {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kAnyTaskPending, Params()));
  return result.Bool(0, 0);
}

absl::StatusOr<std::vector<Task>> PostgresTransaction::ExpiredLeases(absl::Time now, int limit) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kExpiredLeases, Params().Time(now).Limit(limit)));
  return Collect<Task>(result, TaskRow);
}

absl::StatusOr<std::vector<Task>> PostgresTransaction::TasksHeldBy(const std::string& executor_id) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kTasksOfExecutorForUpdate, Params().Text(executor_id)));
  return Collect<Task>(result, TaskRow);
}

absl::StatusOr<std::map<std::string, absl::Time>> PostgresTransaction::ChargedUntil(
    const std::vector<std::string>& executor_ids) {
  std::map<std::string, absl::Time> charged;
  if (executor_ids.empty()) return charged;
  std::vector<rows::Values> ids;
  for (const std::string& id : executor_ids) ids.push_back({id});
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kChargedUntil, Params().Columns(ids, 1)));
  for (int i = 0; i < result.Rows(); ++i) {
    if (std::optional<absl::Time> at = result.OptTime(i, 1)) charged[result.Text(i, 0)] = *at;
  }
  return charged;
}

absl::StatusOr<std::vector<LeaseCandidate>> PostgresTransaction::LeaseCandidates(const LeaseQuery& query,
                                                                                 std::map<std::string, Job>& jobs) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kLeaseCandidates, Params()
                                                                       .Time(query.now)
                                                                       .Text(Name(JobStateName(JobState::kQueued)))
                                                                       .Text(Name(JobStateName(JobState::kRunning)))
                                                                       .Int(query.memory_bytes)
                                                                       .Text(DumpJson(Json(query.runners)))
                                                                       .Int(query.limit)
                                                                       .Text(query.fair_share_ranks)
                                                                       .Text(query.loaded_model)
                                                                       .Text(DumpJson(Json(query.cached_models)))
                                                                       .Time(query.cold_before)
                                                                       .Int(query.model_affinity ? 1 : 0)
                                                                       .Int(query.confined ? 1 : 0)));
  // After the task's columns: the job's spec, state, started_at, team and created_at.
  constexpr int kJob = rows::kTaskColumns;
  std::vector<LeaseCandidate> candidates;
  candidates.reserve(result.Rows());
  for (int i = 0; i < result.Rows(); ++i) {
    const Row row{result, i};
    ASSIGN_OR_RETURN(Task task, rows::ReadTask(row));
    if (!jobs.contains(task.job_id)) {  // each job's spec parsed once
      Job job;
      job.id = task.job_id;
      ASSIGN_OR_RETURN(job.spec, rows::JobSpecOf(task.job_id, row.Text(kJob)));
      ASSIGN_OR_RETURN(job.state, rows::JobStateOf(task.job_id, row.Text(kJob + 1)));
      job.started_at = row.OptTime(kJob + 2);
      job.created_at = row.Time(kJob + 4);
      jobs.emplace(task.job_id, std::move(job));
    }
    candidates.push_back(LeaseCandidate{std::move(task), row.Text(kJob + 3)});
  }
  return candidates;
}

absl::StatusOr<std::vector<PendingGangTask>> PostgresTransaction::PendingGangTasks(absl::Time now, int limit) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kGangCandidates, Params().Time(now).Int(limit)));
  return Collect<PendingGangTask>(result, PendingGangTaskRow);
}

// --- executors ---

absl::StatusOr<std::vector<Executor>> PostgresTransaction::ListExecutors() {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kListExecutors));
  return Collect<Executor>(result, ExecutorRow);
}

absl::StatusOr<std::vector<Executor>> PostgresTransaction::SilentExecutors(absl::Time cutoff) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kSilentExecutors,
                                            Params()
                                                .Text(Name(ExecutorStateName(ExecutorState::kLost)))
                                                .Time(cutoff)
                                                .Text(Name(ExecutorStateName(ExecutorState::kRevoked)))
                                                .Text(Name(ExecutorStateName(ExecutorState::kQuarantined)))
                                                .Text(Name(ExecutorStateName(ExecutorState::kPending)))));
  return Collect<Executor>(result, ExecutorRow);
}

// --- fair share ---

absl::StatusOr<std::vector<TeamUsage>> PostgresTransaction::TeamStandings(absl::Time now) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kTeamUsage, Params().Time(now)));
  const absl::Duration half_life = options_.fair_share_half_life;
  return Collect<TeamUsage>(result, [&](const Row& row) -> absl::StatusOr<TeamUsage> {
    return rows::ReadTeamUsage(row, now, half_life);
  });
}

absl::StatusOr<std::map<std::string, int64_t>> PostgresTransaction::LockTeamUsage(const std::set<std::string>& teams) {
  std::map<std::string, int64_t> running;
  if (teams.empty()) return running;
  ASSIGN_OR_RETURN(PgResult result,
                   c_.Exec(sql::kTeamsRunningForUpdate, Ids(std::vector<std::string>(teams.begin(), teams.end()))));
  for (int i = 0; i < result.Rows(); ++i) running[result.Text(i, 0)] = result.Int(i, 1);
  return running;
}

// --- teams and credentials ---

absl::StatusOr<std::vector<Team>> PostgresTransaction::ListTeams() {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kListTeams));
  return Collect<Team>(result, TeamRow);
}

absl::StatusOr<std::vector<TokenRecord>> PostgresTransaction::ListTokens(const TokenFilter& filter) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kListTokens, Params()
                                                                  .Text(filter.team)
                                                                  .Text(filter.role ? Name(RoleName(*filter.role)) : "")
                                                                  .Text(filter.principal)
                                                                  .Bool(filter.include_revoked)));
  return Collect<TokenRecord>(result, TokenRow);
}

absl::StatusOr<std::vector<TokenRecord>> PostgresTransaction::LiveExecutorTokens(const std::string& executor_id) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kExecutorTokensForUpdate, Params().Text(executor_id)));
  return Collect<TokenRecord>(result, TokenRow);
}

absl::Status PostgresTransaction::RecordTokenUse(const std::vector<std::string>& token_ids, absl::Time at) {
  return c_.Exec(sql::kRecordTokenUse, std::move(Ids(token_ids).Time(at))).status();
}

absl::StatusOr<std::vector<std::string>> PostgresTransaction::RevokedTokensSince(absl::Time since) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kRevokedTokensSince, Params().Time(since)));
  return Collect<std::string>(result, TextRow);
}

// --- models ---

absl::StatusOr<std::vector<ModelRecord>> PostgresTransaction::ModelsNamed(const std::string& team,
                                                                          const std::string& name,
                                                                          const std::string& digest, Locking locking) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(Locks(locking) ? sql::kModelsNamedForUpdate : sql::kModelsNamed,
                                            Params().Text(team).Text(name).Text(digest)));
  return Collect<ModelRecord>(result, ModelRow);
}

absl::StatusOr<std::optional<ModelRecord>> PostgresTransaction::ModelWithDigest(const std::string& team,
                                                                                const std::string& digest) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kModelByDigest, Params().Text(team).Text(digest)));
  ASSIGN_OR_RETURN(std::vector<ModelRecord> found, Collect<ModelRecord>(result, ModelRow));
  if (found.empty()) return std::optional<ModelRecord>();
  return std::optional<ModelRecord>(std::move(found.front()));
}

absl::StatusOr<std::vector<ModelRecord>> PostgresTransaction::ListModels(const std::string& team) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kListModels, Params().Text(team)));
  return Collect<ModelRecord>(result, ModelRow);
}

absl::Status PostgresTransaction::DeleteModel(const ModelRecord& model) {
  return c_.Exec(sql::kDeleteModel, Params().Text(model.team).Text(model.name).Text(model.digest)).status();
}

absl::StatusOr<int64_t> PostgresTransaction::CountModelsWithDigest(const std::string& team, const std::string& digest) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kDigestNamed, Params().Text(team).Text(digest)));
  return result.Int(0, 0);
}

// --- gangs ---

absl::StatusOr<std::optional<GangLease>> PostgresTransaction::SeatOf(const std::string& executor_id) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kSeatOf, Params().Text(executor_id)));
  return First(Gangs(result));
}

absl::StatusOr<std::optional<GangLease>> PostgresTransaction::GangOfAttempt(const std::string& job_id,
                                                                           int64_t task_index, int attempt) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kSeatsOfAttempt, Params().Text(job_id).Int(task_index).Int(attempt)));
  return First(Gangs(result));
}

absl::StatusOr<std::vector<GangLease>> PostgresTransaction::ListGangs() {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kAllSeats));
  return Gangs(result);
}

absl::StatusOr<bool> PostgresTransaction::InsertGang(const GangLease& gang) {
  for (const rows::Values& values : gang_rows::SeatValues(gang)) {
    ASSIGN_OR_RETURN(PgResult inserted, c_.Exec(sql::kInsertSeat, Params().Values(values)));
    if (inserted.Affected() != 1) return false;
  }
  return true;
}

absl::StatusOr<int64_t> PostgresTransaction::DeleteGang(const std::string& job_id, int64_t task_index, int attempt) {
  ASSIGN_OR_RETURN(PgResult removed, c_.Exec(sql::kDeleteAttempt, Params().Text(job_id).Int(task_index).Int(attempt)));
  return removed.Affected();
}

// --- settings and task sizes ---

absl::Status PostgresTransaction::InsertSettingIfAbsent(const std::string& name, const std::string& value,
                                                        absl::Time at) {
  return c_.Exec(sql::kInsertSetting, Params().Text(name).Text(value).Time(at)).status();
}

absl::StatusOr<std::string> PostgresTransaction::Setting(const std::string& name) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kSelectSetting, Params().Text(name)));
  return result.Rows() > 0 ? result.Text(0, 0) : "";
}

absl::Status PostgresTransaction::AddThroughputSample(const ThroughputKey& key, const ThroughputSample& sample,
                                                      absl::Time now) {
  return c_
      .Exec(sql::kRecordThroughput, Params()
                                        .Text(key.model)
                                        .Text(key.runner)
                                        .Text(absl::StrCat(sample.records))
                                        .Text(absl::StrFormat("%.9g", absl::ToDoubleSeconds(sample.took)))
                                        .Time(now)
                                        .Text(absl::StrFormat("%.9g", kThroughputMemory)))
      .status();
}

absl::StatusOr<std::optional<Throughput>> PostgresTransaction::GetThroughput(const ThroughputKey& key) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kSelectThroughput, Params().Text(key.model).Text(key.runner)));
  if (result.Rows() == 0) return std::optional<Throughput>();
  Throughput throughput;
  if (!absl::SimpleAtod(result.Text(0, 0), &throughput.records) ||
      !absl::SimpleAtod(result.Text(0, 1), &throughput.seconds)) {
    return absl::DataLossError(absl::StrCat("task_throughput of ", key.model, " holds no number"));
  }
  throughput.samples = result.Int(0, 2);
  throughput.updated_at = result.Time(0, 3);
  return std::optional<Throughput>(throughput);
}

// --- the dashboard's history ---

absl::Status PostgresTransaction::InsertFleetHistory(const FleetHistoryRow& row, absl::Time keep_after) {
  RETURN_IF_ERROR(c_.Exec(sql::kInsertFleetHistory, Params().Time(row.at).Text(row.point)).status());
  return c_.Exec(sql::kPruneFleetHistory, Params().Time(keep_after)).status();
}

absl::StatusOr<std::vector<FleetHistoryRow>> PostgresTransaction::ListFleetHistory(absl::Time since) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kSelectFleetHistory, Params().Time(since)));
  std::vector<FleetHistoryRow> rows;
  rows.reserve(result.Rows());
  for (int i = 0; i < result.Rows(); ++i) rows.push_back({result.Time(i, 0), result.Text(i, 1)});
  return rows;
}

absl::Status PostgresTransaction::AddFleetTokens(absl::Time at, const std::string& team, const TokenUsage& tokens) {
  return c_.Exec(sql::kAddFleetTokens,
                 Params().Time(at).Text(team).Int(tokens.prompt_tokens).Int(tokens.completion_tokens))
      .status();
}

absl::Status PostgresTransaction::PruneFleetTokens(absl::Time keep_after) {
  return c_.Exec(sql::kPruneFleetTokens, Params().Time(keep_after)).status();
}

absl::StatusOr<std::vector<FleetTokensRow>> PostgresTransaction::ListFleetTokens(absl::Time since) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kSelectFleetTokens, Params().Time(since)));
  std::vector<FleetTokensRow> rows;
  rows.reserve(result.Rows());
  for (int i = 0; i < result.Rows(); ++i) {
    rows.push_back({result.Time(i, 0), result.Text(i, 1), TokenUsage{result.Int(i, 2), result.Int(i, 3)}});
  }
  return rows;
}

// --- verification ---

absl::Status PostgresTransaction::InsertVerification(const Verification& v) {
  ASSIGN_OR_RETURN(PgResult inserted, c_.Exec(sql::kInsertVerification, Params()
                                                                           .Text(v.job_id)
                                                                           .Int(v.task_index)
                                                                           .Text(v.custom_id)
                                                                           .Text(v.producer_id)
                                                                           .Text(v.verifier_id)
                                                                           .Bool(v.passed)
                                                                           .Text(v.reason)
                                                                           .Time(v.at)));
  if (inserted.Affected() != 1) {
    return absl::AlreadyExistsError(absl::StrCat("verifier ", v.verifier_id, " already judged record ", v.custom_id,
                                                 " of job ", v.job_id));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Verification>> PostgresTransaction::VerificationsOfJob(const std::string& job_id) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kVerificationsOfJob, Params().Text(job_id)));
  std::vector<Verification> out;
  for (int i = 0; i < result.Rows(); ++i) {
    out.push_back(Verification{result.Text(i, 0), result.Int(i, 1), result.Text(i, 2), result.Text(i, 3),
                               result.Text(i, 4), result.Bool(i, 5), result.Text(i, 6), result.Time(i, 7)});
  }
  return out;
}

// --- spot checks ---

namespace {

absl::StatusOr<VerificationTask> VerificationTaskRow(const PgResult& result, int i) {
  VerificationTask task{result.Text(i, 0), result.Int(i, 1), static_cast<int>(result.Int(i, 2)),
                        static_cast<int>(result.Int(i, 3)), result.Text(i, 4)};
  ASSIGN_OR_RETURN(task.records, DecodeRecords(result.Text(i, 5)));
  task.verifier_id = result.Text(i, 6);
  task.lease_expires_at = result.OptTime(i, 7);
  task.created_at = result.Time(i, 8);
  task.disputed_verifier = result.Text(i, 9);
  task.chunk_begin = result.Int(i, 10);
  task.chunk_end = result.Int(i, 11);
  return task;
}

absl::StatusOr<std::vector<VerificationTask>> VerificationTaskRows(const PgResult& result) {
  std::vector<VerificationTask> tasks;
  for (int i = 0; i < result.Rows(); ++i) {
    ASSIGN_OR_RETURN(VerificationTask task, VerificationTaskRow(result, i));
    tasks.push_back(std::move(task));
  }
  return tasks;
}

Params VerificationKey(const VerificationTask& task) {
  return std::move(Params().Text(task.job_id).Int(task.task_index).Int(task.attempt).Int(task.seq));
}

}  // namespace

absl::Status PostgresTransaction::InsertVerificationTasks(const std::vector<VerificationTask>& tasks) {
  for (const VerificationTask& task : tasks) {
    RETURN_IF_ERROR(c_.Exec(sql::kInsertVerificationTask, VerificationKey(task)
                                                              .Text(task.producer_id)
                                                              .Text(EncodeRecords(task.records))
                                                              .Text(task.verifier_id)
                                                              .Time(task.lease_expires_at)
                                                              .Time(task.created_at)
                                                              .Text(task.disputed_verifier)
                                                              .Int(task.chunk_begin)
                                                              .Int(task.chunk_end))
                        .status());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<VerificationTask>> PostgresTransaction::LeasableVerificationTasks(
    const std::string& executor_id, absl::Time now, int64_t limit) {
  ASSIGN_OR_RETURN(PgResult result,
                   c_.Exec(sql::kLeasableVerificationTasks, Params().Text(executor_id).Time(now).Int(limit)));
  return VerificationTaskRows(result);
}

absl::StatusOr<std::optional<VerificationTask>> PostgresTransaction::GetVerificationTask(const std::string& job_id,
                                                                                         int64_t task_index,
                                                                                         int attempt, int seq) {
  ASSIGN_OR_RETURN(PgResult result,
                   c_.Exec(sql::kSelectVerificationTask, VerificationKey(VerificationTask{job_id, task_index, attempt, seq})));
  ASSIGN_OR_RETURN(std::vector<VerificationTask> found, VerificationTaskRows(result));
  if (found.empty()) return std::optional<VerificationTask>();
  return std::optional<VerificationTask>(std::move(found.front()));
}

absl::Status PostgresTransaction::UpdateVerificationTask(const VerificationTask& task) {
  ASSIGN_OR_RETURN(PgResult updated, c_.Exec(sql::kUpdateVerificationTask,
                                             VerificationKey(task).Text(task.verifier_id).Time(task.lease_expires_at)));
  if (updated.Affected() != 1) return absl::NotFoundError("the verification task is gone");
  return absl::OkStatus();
}

absl::Status PostgresTransaction::DeleteVerificationTask(const VerificationTask& task) {
  return c_.Exec(sql::kDeleteVerificationTask, VerificationKey(task)).status();
}

absl::StatusOr<int64_t> PostgresTransaction::CountVerificationTasks(const std::string& job_id) {
  ASSIGN_OR_RETURN(PgResult result, c_.Exec(sql::kCountVerificationTasks, Params().Text(job_id)));
  return result.Int(0, 0);
}

// --- ending attempts ---

absl::Status PostgresTransaction::EndAttempts(const AttemptWrites& writes, absl::Time now,
                                              std::set<std::string>* finished) {
  // What each job's counter shard adds: its counts, and the device time of its ended attempts.
  std::map<std::string, Job> added = writes.counts;
  std::vector<rows::Values> charges;
  for (const auto& [job_id, time] : writes.charges) {
    if (time <= absl::ZeroDuration()) continue;
    charges.push_back({job_id, absl::ToInt64Microseconds(time)});
    added[job_id].device_time += time;  // an attempt retried counts too
  }
  std::vector<rows::Values> counts, device, job_ids;
  const int shard = RandomShard();
  for (const auto& [job_id, job] : added) {
    counts.push_back({job_id, int64_t{shard}, job.tasks_done, job.tasks_succeeded, job.counts.completed,
                      job.counts.failed, rows::TimeValue(now)});
    device.push_back({absl::ToInt64Microseconds(job.device_time)});
    job_ids.push_back({job_id});
  }
  // Each executor written once: the records it adds and where its charged time now ends (NULL: unmoved).
  std::map<std::string, std::pair<int64_t, std::optional<absl::Time>>> executors;
  for (const auto& [executor_id, n] : writes.records) executors[executor_id].first = n;
  for (const auto& [executor_id, at] : writes.charged_until) executors[executor_id].second = at;
  std::vector<rows::Values> records, charged_until;
  for (const auto& [executor_id, added] : executors) {
    records.push_back({executor_id, added.first});
    charged_until.push_back({rows::TimeValue(added.second)});
  }
  Params params = Arrays(writes.tasks, &rows::TaskValues, rows::kTaskColumns);
  params.Columns(counts, 7)
      .Columns(records, 2)
      .Columns(charges, 2)
      .Time(now)
      .Int(absl::ToInt64Microseconds(options_.fair_share_half_life))
      .Columns(device, 1)
      .Columns(charged_until, 1);
  if (finished != nullptr && !job_ids.empty()) {
    // Asked right after the COMMIT, in the same round trip.
    c_.AfterCommit(sql::kFinishedJobs,
                   std::move(Params()
                                 .Columns(job_ids, 1)
                                 .Text(Name(JobStateName(JobState::kQueued)))
                                 .Text(Name(JobStateName(JobState::kRunning)))),
                   [finished](const PgResult& done) {
                     for (int i = 0; i < done.Rows(); ++i) finished->insert(done.Text(i, 0));
                   });
  }
  return c_.ExecAndCommit(sql::kWriteAttempts, params);
}

// --- the schema ---

absl::Status PostgresTransaction::LockSchema() {
  RETURN_IF_ERROR(c_.Exec(sql::kMigrationLock, Params().Int(sql::kMigrationLockKey)).status());
  return c_.Exec(sql::kCreateMigrationsTable).status();
}

absl::StatusOr<SchemaState> PostgresTransaction::SchemaVersion() {
  ASSIGN_OR_RETURN(PgResult version, c_.Exec(sql::kSchemaVersion));
  return SchemaState{static_cast<int>(version.Int(0, 0)),
                     absl::StrCat("(PostgreSQL database ", version.Text(0, 1), ", schema ", version.Text(0, 2), ")")};
}

absl::Status PostgresTransaction::ApplyMigration(const store_common::Migration& migration) {
  RETURN_IF_ERROR(c_.ExecScript(migration.sql).status());
  return c_.Exec(sql::kRecordMigration, Params().Int(migration.version)).status();
}

}  // namespace minions::postgres_store
