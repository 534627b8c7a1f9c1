#include "store/sqlite/sqlite_metadata_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <set>
#include <utility>
#include <variant>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "model/json_codec.h"
#include "store/common/store_rows.h"
#include "store/common/store_rules.h"
#include "store/sqlite/sqlite_migrations.h"
#include "store/sqlite/sqlite_statement.h"

namespace minions {
namespace {

using sqlite_store::SqliteError;
// How long a connection waits for another connection's (or process's) write transaction before
// giving up with Unavailable. Transactions here are short; seconds of waiting mean something is
// stuck.
constexpr absl::Duration kBusyTimeout = absl::Seconds(5);
// The waits between tries while busy (then the last, again and again): SQLite's own schedule.
constexpr int kBusyDelaysMs[] = {1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100};
using sqlite_store::Statement;
namespace rows = store_rows;
namespace rules = store_rules;

// --- SQL. Every statement is constant text with parameters; values are always bound. Rows are
// written with positional parameters in the order of store/common/store_rows.h's column lists. ---

constexpr char kSelectJob[] = "SELECT " MINIONS_STORE_JOB_COLUMNS " FROM jobs WHERE id = :id";
constexpr char kInsertJob[] = "INSERT INTO jobs (" MINIONS_STORE_JOB_WRITE_COLUMNS ", " MINIONS_STORE_JOB_COUNT_COLUMNS
                              ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, "
                              "?17, ?18, ?19, ?20, ?21, ?22)";
constexpr char kUpdateJob[] =
    "UPDATE jobs SET team = ?2, state = ?3, spec = ?4, priority = ?5, min_memory_bytes = ?6, runner = ?7, "
    "total_records = ?8, n_tasks = ?9, error = ?10, output_key = ?11, errors_key = ?12, manifest_key = ?13, "
    "created_at = ?14, updated_at = ?15, started_at = ?16, finished_at = ?17, model_digest = ?18, "
    "completed_records = ?19, failed_records = ?20, tasks_done = ?21, tasks_succeeded = ?22 WHERE id = ?1";
// A finished job's tokens (FinishJob), the one write of these columns: SaveJob's lists leave them be.
constexpr char kSetJobTokens[] =
    "UPDATE jobs SET prompt_tokens = :prompt, completion_tokens = :completion WHERE id = :id";
constexpr char kListJobs[] =
    "SELECT " MINIONS_STORE_JOB_COLUMNS " FROM jobs WHERE (:state IS NULL OR state = :state) "
    "AND (:team = '' OR team = :team) ORDER BY created_at DESC, id DESC LIMIT :limit";
constexpr char kJobsInState[] =
    "SELECT " MINIONS_STORE_JOB_COLUMNS " FROM jobs WHERE state = :state ORDER BY created_at, id LIMIT :limit";

constexpr char kSelectTask[] =
    "SELECT " MINIONS_STORE_TASK_COLUMNS " FROM tasks WHERE job_id = :job_id AND idx = :idx";
constexpr char kSelectTasksOfJob[] =
    "SELECT " MINIONS_STORE_TASK_COLUMNS " FROM tasks WHERE job_id = :job_id ORDER BY idx";
constexpr char kInsertTask[] = "INSERT INTO tasks (" MINIONS_STORE_TASK_COLUMNS
                               ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, "
                               "?17, ?18, ?19, ?20)";
constexpr char kUpdateTask[] =
    "UPDATE tasks SET first_record = ?3, n_records = ?4, byte_begin = ?5, byte_end = ?6, state = ?7, "
    "attempt = ?8, failures = ?9, preemptions = ?10, executor_id = ?11, lease_expires_at = ?12, "
    "not_before = ?13, records_done = ?14, records_failed = ?15, last_error = ?16, started_at = ?17, "
    "finished_at = ?18, chunks = ?19, shadow = ?20 WHERE job_id = ?1 AND idx = ?2";
constexpr char kRunningTasks[] =
    "SELECT " MINIONS_STORE_TASK_COLUMNS " FROM tasks WHERE state = :running ORDER BY executor_id, job_id, idx";
constexpr char kCountPending[] = "SELECT COUNT(*) FROM tasks WHERE job_id = :job_id AND state = :pending";
constexpr char kAnyPending[] = "SELECT EXISTS (SELECT 1 FROM tasks WHERE state = :pending)";
constexpr char kCountRunning[] =
    "SELECT COUNT(*), COUNT(DISTINCT executor_id), COALESCE(SUM(records_done), 0) FROM tasks "
    "WHERE job_id = :job_id AND state = :running";

// Candidate selection only: which pending tasks this executor could run, in grant order. Whether
// a task may actually be granted is GrantTask's decision.
// :ranks is the teams' fair-share order (store_rules::FairShareRanksJson): a team it leaves out
// ranks 0; a team ranked -1 is at its running-task quota.
// Placement: how warm the executor is for a job's registry model (0 loaded, 1 cached, 2 cold;
// a job without a registry model is 0): warmer first within a priority, and an executor that
// would have to drop another model or fetch the bytes (neither loaded, nor cached with no model
// loaded: placement.h TakesWithoutWait) takes a job only once it was submitted before
// :cold_before (delay scheduling). Without model
// affinity (:affinity = 0) every job is 0.
#define MINIONS_SQLITE_WARMTH                                                                   \
  "(CASE WHEN :affinity = 0 OR j.model_digest = '' OR j.model_digest = :loaded THEN 0 WHEN j.model_digest IN " \
  "(SELECT value FROM json_each(:cached)) THEN 1 ELSE 2 END)"
constexpr char kLeaseCandidates[] =
    "SELECT t.job_id, t.idx, j.team FROM tasks t JOIN jobs j ON j.id = t.job_id "
    "LEFT JOIN json_each(:ranks) r ON r.key = j.team "
    "WHERE t.state = :pending AND (t.not_before IS NULL OR t.not_before <= :now) "
    "AND j.state IN (:queued, :running) AND j.min_memory_bytes <= :memory_bytes AND j.gang_size < 2 "
    "AND j.runner IN (SELECT value FROM json_each(:runners)) AND COALESCE(r.value, 0) >= 0 "
    "AND (" MINIONS_SQLITE_WARMTH " = 0 OR (" MINIONS_SQLITE_WARMTH " = 1 AND :loaded = '') "
    "OR j.created_at <= :cold_before) "
    "ORDER BY COALESCE(r.value, 0), j.priority DESC, " MINIONS_SQLITE_WARMTH ", j.created_at, j.id, t.idx "
    "LIMIT :limit";
#undef MINIONS_SQLITE_WARMTH
// Every team's standing (store_rows::ReadTeamUsage's columns): teams without usage yet, and usage
// of teams without a row in `teams` (jobs of a team created before it was).
// (No FULL OUTER JOIN: older SQLite libraries, macOS's among them, lack it.)
#define MINIONS_SQLITE_OPEN_US \
  "CAST(COALESCE(u.running_devices * CAST(:now AS REAL) - u.running_device_since_us, 0) AS INTEGER)"
constexpr char kTeamUsage[] =
    "SELECT t.name, t.weight, t.max_running_tasks, COALESCE(u.usage_us, 0), COALESCE(u.usage_at, 0), "
    "COALESCE(u.running, 0), " MINIONS_SQLITE_OPEN_US ", COALESCE(u.device_us, 0) "
    "FROM teams t LEFT JOIN team_usage u ON u.team = t.name "
    "UNION ALL SELECT u.team, 1, 0, u.usage_us, u.usage_at, u.running, " MINIONS_SQLITE_OPEN_US ", u.device_us"
    " FROM team_usage u WHERE u.team NOT IN (SELECT name FROM teams) ORDER BY 1";
#undef MINIONS_SQLITE_OPEN_US
constexpr char kTeamUsageOf[] = "SELECT usage_us, usage_at FROM team_usage WHERE team = :team";
// (:charge_us also adds to the device time, which never decays.) A job's device time is charged
// by kChargeJobDevice alone: SaveJob's column lists leave it be.
constexpr char kChargeJobDevice[] = "UPDATE jobs SET device_us = device_us + :us WHERE id = :id";
constexpr char kChargeUsage[] =
    "INSERT INTO team_usage (team, usage_us, device_us, usage_at) VALUES (:team, :usage_us, :charge_us, :usage_at) "
    "ON CONFLICT (team) DO UPDATE SET usage_us = excluded.usage_us, device_us = team_usage.device_us + "
    "excluded.device_us, usage_at = excluded.usage_at";
constexpr char kExpiredLeases[] =
    "SELECT job_id, idx FROM tasks WHERE state = :running AND lease_expires_at <= :now "
    "ORDER BY lease_expires_at, job_id, idx LIMIT :limit";

constexpr char kSelectExecutor[] = "SELECT " MINIONS_STORE_EXECUTOR_COLUMNS " FROM executors WHERE id = :id";
constexpr char kListExecutors[] =
    "SELECT " MINIONS_STORE_EXECUTOR_COLUMNS " FROM executors ORDER BY registered_at, id";
constexpr char kInsertExecutor[] =
    "INSERT INTO executors (" MINIONS_STORE_EXECUTOR_COLUMNS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
constexpr char kUpdateExecutor[] =
    "UPDATE executors SET info = ?2, state = ?3, state_reason = ?4, registered_at = ?5, "
    "last_heartbeat_at = ?6, drain_requested = ?7, records_done = ?8 WHERE id = ?1";
constexpr char kSilentExecutors[] =
    "SELECT id FROM executors WHERE state NOT IN (:lost, :revoked) AND last_heartbeat_at < :cutoff "
    "ORDER BY last_heartbeat_at, id";
constexpr char kCountActiveJobs[] =
    "SELECT COUNT(*) FROM jobs WHERE team = :team "
    "AND state NOT IN ('completed', 'failed', 'cancelled', 'expired')";

constexpr char kCreateMigrationsTable[] =
    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)";
constexpr char kSchemaVersion[] = "SELECT COALESCE(MAX(version), 0) FROM schema_migrations";
constexpr char kRecordMigration[] =
    "INSERT INTO schema_migrations (version, applied_at) "
    "VALUES (:version, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))";

std::string Name(std::string_view name) { return std::string(name); }

rows::Values Concat(rows::Values a, const rows::Values& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

// --- opening and migrations ---

absl::StatusOr<std::unique_ptr<SqliteMetadataStore>> SqliteMetadataStore::Open(const std::string& path,
                                                                             const StoreOptions& options) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status error = absl::UnavailableError(
        absl::StrCat("cannot open metadata store ", path, ": ", db ? sqlite3_errmsg(db) : sqlite3_errstr(rc)));
    sqlite3_close_v2(db);
    return error;
  }
  std::unique_ptr<SqliteMetadataStore> store(new SqliteMetadataStore(db, options));
  {
    absl::MutexLock lock(&store->mu_);
    sqlite3_extended_result_codes(db, 1);
    // The busy handler first: switching to WAL itself may wait for another process.
    sqlite3_busy_handler(db, &SqliteMetadataStore::OnBusy, store.get());
    // WAL lets readers and one writer of several processes work at once; NORMAL synchronisation
    // is durable across application crashes (a power cut may lose the last transactions, never
    // corrupt the file). ":memory:" databases stay in "memory" journal mode.
    RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode = WAL"));
    RETURN_IF_ERROR(store->Exec("PRAGMA synchronous = NORMAL"));
    RETURN_IF_ERROR(store->Exec("PRAGMA foreign_keys = ON"));
  }
  RETURN_IF_ERROR(store->Migrate(path));
  return store;
}

SqliteMetadataStore::SqliteMetadataStore(sqlite3* db, const StoreOptions& options)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : &real_clock_),
      db_(db),
      random_(std::random_device{}()) {}

int SqliteMetadataStore::OnBusy(void* arg, int count) {
  auto* store = static_cast<SqliteMetadataStore*>(arg);
  store->mu_.AssertHeld();  // statements run under mu_
  const absl::Time now = store->clock_->Now();
  if (count == 0) store->busy_since_ = now;
  if (now - store->busy_since_ >= kBusyTimeout) return 0;  // give up: SQLITE_BUSY
  const int n = static_cast<int>(std::size(kBusyDelaysMs));
  store->clock_->SleepFor(absl::Milliseconds(kBusyDelaysMs[std::min(count, n - 1)]));
  return 1;
}

SqliteMetadataStore::~SqliteMetadataStore() {
  absl::MutexLock lock(&mu_);
  for (auto& [sql, stmt] : statements_) sqlite3_finalize(stmt);
  sqlite3_close_v2(db_);
}

absl::Status SqliteMetadataStore::Migrate(const std::string& path) {
  const int latest = sqlite_store::LatestSchemaVersion();
  // One migration per transaction. The version is read again inside each one: another process
  // opening the same file may have applied it meanwhile.
  while (true) {
    ASSIGN_OR_RETURN(bool done, InTransaction(true, [&]() -> absl::StatusOr<bool> {
    mu_.AssertHeld();
      RETURN_IF_ERROR(Exec(kCreateMigrationsTable));
      ASSIGN_OR_RETURN(Statement version_query, Prepare(kSchemaVersion));
      ASSIGN_OR_RETURN(bool row, version_query.Step());
      const int current = row ? static_cast<int>(version_query.Int(0)) : 0;
      if (current > latest) {
        return absl::FailedPreconditionError(absl::StrCat(
            "metadata store ", path, " has schema version ", current, " but this binary knows only up to ",
            latest, ": it was written by a newer minions; upgrade this binary"));
      }
      if (current == latest) return true;
      const sqlite_store::Migration& migration = sqlite_store::Migrations()[current];
      if (migration.version != current + 1) {
        return absl::InternalError(absl::StrCat("migration list is out of order at version ", current + 1));
      }
      RETURN_IF_ERROR(Exec(migration.sql));
      ASSIGN_OR_RETURN(Statement record, Prepare(kRecordMigration));
      RETURN_IF_ERROR(record.BindInt(":version", migration.version).Run());
      return false;
    }));
    if (done) return absl::OkStatus();
  }
}

absl::StatusOr<int> SqliteMetadataStore::SchemaVersion() {
  return InTransaction(false, [&]() -> absl::StatusOr<int> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Statement query, Prepare(kSchemaVersion));
    ASSIGN_OR_RETURN(bool row, query.Step());
    return row ? static_cast<int>(query.Int(0)) : 0;
  });
}

// --- plumbing ---

absl::StatusOr<Statement> SqliteMetadataStore::Prepare(const char* sql) {
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    sqlite3_stmt* stmt = nullptr;
    int rc = sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
    if (rc != SQLITE_OK) return SqliteError(db_, rc, absl::StrCat("prepare ", Excerpt(sql, 60)));
    it = statements_.emplace(sql, stmt).first;
  }
  return Statement(db_, it->second);
}

absl::Status SqliteMetadataStore::Exec(const char* sql) {
  int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, Excerpt(sql, 60));
  return absl::OkStatus();
}

std::string SqliteMetadataStore::NewId(const char* prefix) {
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%012llx", static_cast<unsigned long long>(random_() & 0xffffffffffffULL));
  return absl::StrCat(prefix, hex);
}

// --- rows ---

absl::StatusOr<Job> SqliteMetadataStore::LoadJob(const std::string& job_id) {
  ASSIGN_OR_RETURN(Statement query, Prepare(kSelectJob));
  query.BindText(":id", job_id);
  ASSIGN_OR_RETURN(std::vector<Job> jobs, QueryJobs(query));
  if (jobs.empty()) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  return std::move(jobs.front());
}

absl::StatusOr<std::vector<Job>> SqliteMetadataStore::QueryJobs(Statement& query) {
  std::vector<Job> jobs;
  while (true) {
    ASSIGN_OR_RETURN(bool row, query.Step());
    if (!row) break;
    ASSIGN_OR_RETURN(Job job, rows::ReadJob(query));
    jobs.push_back(std::move(job));
  }
  return jobs;
}

absl::Status SqliteMetadataStore::SaveJob(const Job& job, bool insert) {
  ASSIGN_OR_RETURN(Statement statement, Prepare(insert ? kInsertJob : kUpdateJob));
  statement.BindValues(Concat(rows::JobValues(job), rows::JobCountValues(job)));
  RETURN_IF_ERROR(statement.Run());
  if (statement.Changes() != 1) return absl::NotFoundError(absl::StrCat("no job ", job.id));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Task>> SqliteMetadataStore::QueryTasks(Statement& query) {
  std::vector<Task> tasks;
  while (true) {
    ASSIGN_OR_RETURN(bool row, query.Step());
    if (!row) break;
    ASSIGN_OR_RETURN(Task task, rows::ReadTask(query));
    tasks.push_back(std::move(task));
  }
  return tasks;
}

absl::StatusOr<std::vector<Task>> SqliteMetadataStore::LoadTasks(const std::string& job_id) {
  ASSIGN_OR_RETURN(Statement query, Prepare(kSelectTasksOfJob));
  query.BindText(":job_id", job_id);
  return QueryTasks(query);
}

absl::StatusOr<Task> SqliteMetadataStore::LoadTask(const std::string& job_id, int64_t index) {
  ASSIGN_OR_RETURN(Statement query, Prepare(kSelectTask));
  query.BindText(":job_id", job_id).BindInt(":idx", index);
  ASSIGN_OR_RETURN(bool row, query.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no task ", job_id, "/", index));
  return rows::ReadTask(query);
}

absl::Status SqliteMetadataStore::SaveTask(const Task& task, bool insert) {
  ASSIGN_OR_RETURN(Statement statement, Prepare(insert ? kInsertTask : kUpdateTask));
  statement.BindValues(rows::TaskValues(task));
  RETURN_IF_ERROR(statement.Run());
  if (statement.Changes() != 1) return absl::NotFoundError(absl::StrCat("no task ", task.job_id, "/", task.index));
  return absl::OkStatus();
}

absl::StatusOr<Executor> SqliteMetadataStore::LoadExecutor(const std::string& executor_id) {
  ASSIGN_OR_RETURN(Statement query, Prepare(kSelectExecutor));
  query.BindText(":id", executor_id);
  ASSIGN_OR_RETURN(bool row, query.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no executor ", executor_id));
  return rows::ReadExecutor(query);
}

absl::Status SqliteMetadataStore::SaveExecutor(const Executor& executor, bool insert) {
  ASSIGN_OR_RETURN(Statement statement, Prepare(insert ? kInsertExecutor : kUpdateExecutor));
  statement.BindValues(rows::ExecutorValues(executor));
  RETURN_IF_ERROR(statement.Run());
  if (statement.Changes() != 1) return absl::NotFoundError(absl::StrCat("no executor ", executor.id));
  return absl::OkStatus();
}

// --- jobs ---

absl::StatusOr<Job> SqliteMetadataStore::CreateJob(const JobSpec& spec, absl::Time now) {
  return InTransaction(true, [&]() -> absl::StatusOr<Job> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(std::optional<Team> team, LoadTeam(spec.team));
    {
      ASSIGN_OR_RETURN(Statement count, Prepare(kCountActiveJobs));
      count.BindText(":team", spec.team);
      ASSIGN_OR_RETURN(bool row, count.Step());
      RETURN_IF_ERROR(rules::CheckJobQuota(team, row ? count.Int(0) : 0));
    }
    Job job = rules::NewJob(spec, now);
    // 48 random bits: a collision is unlikely, and retried when it happens.
    for (int tries = 0;; ++tries) {
      job.id = NewId("job-");
      absl::Status inserted = SaveJob(job, /*insert=*/true);
      if (inserted.ok()) return job;
      if (!absl::IsAlreadyExists(inserted) || tries == 3) return inserted;
    }
  });
}

absl::Status SqliteMetadataStore::AddTasks(const std::string& job_id, const std::vector<Task>& tasks,
                                           int64_t total_records, absl::Time now) {
  return InTransaction(true, [&]() -> absl::Status {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Job job, LoadJob(job_id));
    ASSIGN_OR_RETURN(std::vector<Task> fresh, rules::AddTasksToJob(job, tasks, total_records, now));
    for (const Task& task : fresh) RETURN_IF_ERROR(SaveTask(task, /*insert=*/true));
    return SaveJob(job);
  });
}

absl::StatusOr<Job> SqliteMetadataStore::GetJob(const std::string& job_id) {
  return InTransaction(false, [&] { mu_.AssertHeld(); return LoadJob(job_id); });
}

absl::StatusOr<std::vector<Job>> SqliteMetadataStore::ListJobs(const JobFilter& filter) {
  return InTransaction(false, [&]() -> absl::StatusOr<std::vector<Job>> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Statement query, Prepare(kListJobs));
    if (filter.state) {
      query.BindText(":state", Name(JobStateName(*filter.state)));
    } else {
      query.BindNull(":state");
    }
    query.BindText(":team", filter.team).BindInt(":limit", filter.limit > 0 ? filter.limit : -1);
    return QueryJobs(query);
  });
}

absl::StatusOr<std::vector<Task>> SqliteMetadataStore::ListTasks(const std::string& job_id) {
  return InTransaction(false, [&]() -> absl::StatusOr<std::vector<Task>> {
    mu_.AssertHeld();
    RETURN_IF_ERROR(LoadJob(job_id).status());
    return LoadTasks(job_id);
  });
}

absl::StatusOr<Task> SqliteMetadataStore::GetTask(const std::string& job_id, int64_t task_index) {
  return InTransaction(false, [&]() -> absl::StatusOr<Task> {
    mu_.AssertHeld();
    return LoadTask(job_id, task_index);
  });
}

absl::StatusOr<std::vector<Task>> SqliteMetadataStore::GetTasks(
    const std::vector<std::pair<std::string, int64_t>>& keys) {
  std::vector<std::pair<std::string, int64_t>> sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  return InTransaction(false, [&]() -> absl::StatusOr<std::vector<Task>> {
    mu_.AssertHeld();
    std::vector<Task> tasks;
    for (const auto& [job_id, index] : sorted) {
      absl::StatusOr<Task> task = LoadTask(job_id, index);
      if (absl::IsNotFound(task.status())) continue;
      RETURN_IF_ERROR(task.status());
      tasks.push_back(*std::move(task));
    }
    return tasks;
  });
}

absl::StatusOr<TaskStateCounts> SqliteMetadataStore::CountTasks(const std::string& job_id) {
  return InTransaction(false, [&]() -> absl::StatusOr<TaskStateCounts> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Job job, LoadJob(job_id));
    TaskStateCounts counts;
    counts.done = job.tasks_done;
    counts.succeeded = job.tasks_succeeded;
    {
      ASSIGN_OR_RETURN(Statement query, Prepare(kCountPending));
      query.BindText(":job_id", job_id).BindText(":pending", Name(TaskStateName(TaskState::kPending)));
      ASSIGN_OR_RETURN(bool row, query.Step());
      if (row) counts.pending = query.Int(0);
    }
    ASSIGN_OR_RETURN(Statement query, Prepare(kCountRunning));
    query.BindText(":job_id", job_id).BindText(":running", Name(TaskStateName(TaskState::kRunning)));
    ASSIGN_OR_RETURN(bool row, query.Step());
    if (row) {
      counts.running = query.Int(0);
      counts.executors = query.Int(1);
      counts.records_in_flight = query.Int(2);
    }
    return counts;
  });
}

absl::StatusOr<bool> SqliteMetadataStore::AnyTaskPending() {
  return InTransaction(false, [&]() -> absl::StatusOr<bool> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Statement query, Prepare(kAnyPending));
    query.BindText(":pending", Name(TaskStateName(TaskState::kPending)));
    ASSIGN_OR_RETURN(bool row, query.Step());
    return row && query.Int(0) != 0;
  });
}

absl::StatusOr<Job> SqliteMetadataStore::EndJob(const std::string& job_id, JobState state,
                                                const std::string& error, absl::Time now) {
  ASSIGN_OR_RETURN(Job job, LoadJob(job_id));
  ASSIGN_OR_RETURN(std::vector<Task> tasks, LoadTasks(job_id));
  std::map<int64_t, Task> before;
  for (const Task& task : tasks) before[task.index] = task;
  ASSIGN_OR_RETURN(std::vector<Task> cancelled, rules::EndJob(job, state, error, tasks, now));
  // The attempts it stopped used their machines until now: charged to the team like any other.
  absl::Duration used;
  for (const Task& task : cancelled) {
    RETURN_IF_ERROR(SaveTask(task));
    used += rules::EndedAttemptTime(before[task.index], task, now);
  }
  RETURN_IF_ERROR(ChargeUsage({{job_id, used}}, now));
  RETURN_IF_ERROR(SaveJob(job));
  job.device_time += rules::DeviceTime(used, job.spec);  // (read before the charge)
  return job;
}

absl::StatusOr<Job> SqliteMetadataStore::CancelJob(const std::string& job_id, absl::Time now) {
  return InTransaction(true, [&] { mu_.AssertHeld(); return EndJob(job_id, JobState::kCancelled, "", now); });
}

absl::StatusOr<Job> SqliteMetadataStore::FailJob(const std::string& job_id, const std::string& error,
                                                 absl::Time now) {
  return InTransaction(true, [&] { mu_.AssertHeld(); return EndJob(job_id, JobState::kFailed, error, now); });
}

absl::StatusOr<Job> SqliteMetadataStore::ExpireJob(const std::string& job_id, absl::Time now) {
  return InTransaction(true, [&]() -> absl::StatusOr<Job> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Job job, LoadJob(job_id));
    ASSIGN_OR_RETURN(std::vector<Task> tasks, LoadTasks(job_id));
    std::vector<Task> before = tasks;
    RETURN_IF_ERROR(::minions::ExpireJob(job, tasks, now));
    // The attempts it stopped used their machines until now, as a cancel's do.
    absl::Duration used;
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (tasks[i].state == before[i].state) continue;
      RETURN_IF_ERROR(SaveTask(tasks[i]));
      used += rules::EndedAttemptTime(before[i], tasks[i], now);
    }
    RETURN_IF_ERROR(ChargeUsage({{job_id, used}}, now));
    RETURN_IF_ERROR(SaveJob(job));
    job.device_time += rules::DeviceTime(used, job.spec);  // (read before the charge)
    return job;
  });
}

absl::StatusOr<Task> SqliteMetadataStore::RequestBackup(const std::string& job_id, int64_t task_index, int attempt,
                                                        absl::Time now) {
  return InTransaction(true, [&]() -> absl::StatusOr<Task> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Task task, LoadTask(job_id, task_index));
    if (task.attempt != attempt) {
      return absl::FailedPreconditionError(absl::StrCat("task ", job_id, "/", task_index, " is on attempt ",
                                                        task.attempt, ", not ", attempt));
    }
    const Task before = task;
    RETURN_IF_ERROR(::minions::RequestBackup(task, now));
    RETURN_IF_ERROR(SaveTask(task));
    // The straggler's time so far is charged now (the rest only if it wins).
    RETURN_IF_ERROR(ChargeUsage({{job_id, rules::EndedAttemptTime(before, task, now)}}, now));
    return task;
  });
}

absl::StatusOr<std::vector<Job>> SqliteMetadataStore::JobsToFinalize(int limit, absl::Time now) {
  // Nothing to settle first: here the transaction that ends a job's last task settles it.
  return InTransaction(false, [&]() -> absl::StatusOr<std::vector<Job>> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Statement query, Prepare(kJobsInState));
    query.BindText(":state", Name(JobStateName(JobState::kFinalizing))).BindInt(":limit", limit > 0 ? limit : -1);
    return QueryJobs(query);
  });
}

absl::StatusOr<Job> SqliteMetadataStore::FinishJob(const std::string& job_id, const std::string& output_key,
                                                   const std::string& errors_key, const std::string& manifest_key,
                                                   absl::Time now, JobState outcome, const TokenUsage& tokens) {
  return InTransaction(true, [&]() -> absl::StatusOr<Job> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Job job, LoadJob(job_id));
    RETURN_IF_ERROR(rules::FinishJob(job, output_key, errors_key, manifest_key, now, outcome, tokens));
    RETURN_IF_ERROR(SaveJob(job));
    ASSIGN_OR_RETURN(Statement set_tokens, Prepare(kSetJobTokens));
    set_tokens.BindInt(":prompt", tokens.prompt_tokens)
        .BindInt(":completion", tokens.completion_tokens)
        .BindText(":id", job_id);
    RETURN_IF_ERROR(set_tokens.Run());
    return job;
  });
}

// --- executors ---

absl::StatusOr<Executor> SqliteMetadataStore::RegisterExecutor(const std::string& executor_id,
                                                               const ExecutorInfo& info, absl::Time now) {
  return InTransaction(true, [&]() -> absl::StatusOr<Executor> {
    mu_.AssertHeld();
    Executor executor;
    bool exists = false;
    if (!executor_id.empty()) {
      absl::StatusOr<Executor> loaded = LoadExecutor(executor_id);
      if (loaded.ok()) {
        executor = std::move(*loaded);
        exists = true;
      } else if (!absl::IsNotFound(loaded.status())) {
        return loaded.status();
      } else {
        executor.id = executor_id;  // known to the executor, not (or no longer) to this store
      }
    }
    rules::RegisterExecutor(executor, exists, info, now);
    if (exists || !executor.id.empty()) {
      RETURN_IF_ERROR(SaveExecutor(executor, /*insert=*/!exists));
      return executor;
    }
    for (int tries = 0;; ++tries) {
      executor.id = NewId("exe-");
      absl::Status inserted = SaveExecutor(executor, /*insert=*/true);
      if (inserted.ok()) return executor;
      if (!absl::IsAlreadyExists(inserted) || tries == 3) return inserted;
    }
  });
}

absl::StatusOr<Executor> SqliteMetadataStore::GetExecutor(const std::string& executor_id) {
  return InTransaction(false, [&] { mu_.AssertHeld(); return LoadExecutor(executor_id); });
}

absl::StatusOr<std::vector<Executor>> SqliteMetadataStore::ListExecutors() {
  return InTransaction(false, [&]() -> absl::StatusOr<std::vector<Executor>> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Statement query, Prepare(kListExecutors));
    std::vector<Executor> executors;
    while (true) {
      ASSIGN_OR_RETURN(bool row, query.Step());
      if (!row) break;
      ASSIGN_OR_RETURN(Executor executor, rows::ReadExecutor(query));
      executors.push_back(std::move(executor));
    }
    return executors;
  });
}

absl::StatusOr<std::vector<Task>> SqliteMetadataStore::ListRunningTasks() {
  return InTransaction(false, [&]() -> absl::StatusOr<std::vector<Task>> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Statement query, Prepare(kRunningTasks));
    query.BindText(":running", Name(TaskStateName(TaskState::kRunning)));
    return QueryTasks(query);
  });
}

absl::StatusOr<HeartbeatReply> SqliteMetadataStore::Heartbeat(const std::string& executor_id, ExecutorState state,
                                                              const std::string& reason,
                                                              const std::vector<LeaseProgress>& held,
                                                              absl::Duration ttl, absl::Time now,
    const std::optional<ModelHoldings>& holdings) {
  ASSIGN_OR_RETURN(std::vector<HeartbeatReply> replies,
                   Heartbeats({HeartbeatCall{executor_id, state, reason, held, holdings}}, ttl, now));
  return std::move(replies.front());
}

absl::StatusOr<std::vector<HeartbeatReply>> SqliteMetadataStore::Heartbeats(const std::vector<HeartbeatCall>& calls,
                                                                           absl::Duration ttl, absl::Time now) {
  if (calls.empty()) return std::vector<HeartbeatReply>{};
  return InTransaction(true, [&]() -> absl::StatusOr<std::vector<HeartbeatReply>> {
    mu_.AssertHeld();
    std::vector<HeartbeatReply> replies;
    for (const HeartbeatCall& call : calls) {
      HeartbeatReply& reply = replies.emplace_back();
      absl::StatusOr<Executor> loaded = LoadExecutor(call.executor_id);
      if (absl::IsNotFound(loaded.status())) {
        // Its leases are left alone: it registers again (same id) and heartbeats them then.
        reply.unknown_executor = true;
        continue;
      }
      RETURN_IF_ERROR(loaded.status());
      Executor& executor = *loaded;
      if (rules::HeardSince(executor, call.unless_heard_since)) {
        reply.drain = executor.drain_requested;  // heard since: nothing to write
        continue;
      }
      rules::RecordHeartbeat(executor, call.state, call.reason, now, call.holdings);
      for (const LeaseProgress& progress : call.held) {
        absl::StatusOr<Task> task = LoadTask(progress.job_id, progress.task_index);
        if (!task.ok() && !absl::IsNotFound(task.status())) return task.status();
        if (!task.ok() || !rules::RenewLease(*task, call.executor_id, progress, ttl, now)) {
          reply.cancel.push_back(progress);
          continue;
        }
        RETURN_IF_ERROR(SaveTask(*task));
        reply.renewed.push_back(progress);
      }
      reply.drain = executor.drain_requested;
      RETURN_IF_ERROR(SaveExecutor(executor));
    }
    return replies;
  });
}

absl::Status SqliteMetadataStore::RequestDrain(const std::string& executor_id, absl::Time now) {
  return InTransaction(true, [&]() -> absl::Status {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Executor executor, LoadExecutor(executor_id));
    rules::RequestDrain(executor);
    return SaveExecutor(executor);
  });
}

// --- leasing ---

absl::StatusOr<std::vector<TeamUsage>> SqliteMetadataStore::LoadTeamUsage(absl::Time now) {
  ASSIGN_OR_RETURN(Statement query, Prepare(kTeamUsage));
  query.BindTime(":now", now);
  std::vector<TeamUsage> teams;
  while (true) {
    ASSIGN_OR_RETURN(bool row, query.Step());
    if (!row) break;
    teams.push_back(rows::ReadTeamUsage(query, now, options_.fair_share_half_life));
  }
  return teams;
}

absl::Status SqliteMetadataStore::ChargeUsage(const std::map<std::string, absl::Duration>& by_job, absl::Time now) {
  std::map<std::string, absl::Duration> by_team;
  for (const auto& [job_id, time] : by_job) {
    if (time <= absl::ZeroDuration()) continue;
    ASSIGN_OR_RETURN(Job job, LoadJob(job_id));
    const absl::Duration device_time = rules::DeviceTime(time, job.spec);
    by_team[job.spec.team] += device_time;
    ASSIGN_OR_RETURN(Statement charge, Prepare(kChargeJobDevice));
    charge.BindInt(":us", absl::ToInt64Microseconds(device_time)).BindText(":id", job_id);
    RETURN_IF_ERROR(charge.Run());
  }
  for (const auto& [team, time] : by_team) {
    absl::Duration usage;
    absl::Time at = now;
    {
      ASSIGN_OR_RETURN(Statement query, Prepare(kTeamUsageOf));
      query.BindText(":team", team);
      ASSIGN_OR_RETURN(bool row, query.Step());
      if (row) {
        usage = absl::Microseconds(query.Int(0));
        at = absl::FromUnixMicros(query.Int(1));
      }
    }
    usage = DecayUsage(usage, at, now, options_.fair_share_half_life) + time;
    ASSIGN_OR_RETURN(Statement upsert, Prepare(kChargeUsage));
    upsert.BindText(":team", team)
        .BindInt(":usage_us", absl::ToInt64Microseconds(usage))
        .BindInt(":charge_us", absl::ToInt64Microseconds(time))
        .BindTime(":usage_at", std::max(at, now));
    RETURN_IF_ERROR(upsert.Run());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TeamUsage>> SqliteMetadataStore::ListTeamUsage(absl::Time now) {
  return InTransaction(false, [&] { mu_.AssertHeld(); return LoadTeamUsage(now); });
}

absl::StatusOr<std::vector<Lease>> SqliteMetadataStore::LeaseTasks(const std::string& executor_id, int max_tasks,
                                                                   absl::Duration ttl, absl::Time now) {
  return InTransaction(true, [&]() -> absl::StatusOr<std::vector<Lease>> {
    mu_.AssertHeld();
    std::vector<Lease> leases;
    ASSIGN_OR_RETURN(Executor executor, LoadExecutor(executor_id));
    if (!rules::MayLease(executor, max_tasks)) return leases;

    ASSIGN_OR_RETURN(std::vector<TeamUsage> teams, LoadTeamUsage(now));
    std::map<std::string, int64_t> allowances = rules::RunningAllowances(teams);
    struct Candidate {
      std::string job_id;
      int64_t index;
      std::string team;
    };
    std::vector<Candidate> candidates;
    {
      ASSIGN_OR_RETURN(Statement query, Prepare(kLeaseCandidates));
      query.BindText(":pending", Name(TaskStateName(TaskState::kPending)))
          .BindTime(":now", now)
          .BindText(":queued", Name(JobStateName(JobState::kQueued)))
          .BindText(":running", Name(JobStateName(JobState::kRunning)))
          .BindInt(":memory_bytes", UsableMemory(executor.info))
          .BindText(":runners", DumpJson(Json(rules::RunnersOf(executor))))
          .BindText(":ranks", rules::FairShareRanksJson(teams))
          .BindText(":loaded", executor.info.model_loaded)
          .BindText(":cached", DumpJson(Json(executor.info.models)))
          .BindTime(":cold_before", now - WarmWait())
          .BindInt(":affinity", options_.model_affinity ? 1 : 0)
          .BindInt(":limit", max_tasks);
      while (true) {
        ASSIGN_OR_RETURN(bool row, query.Step());
        if (!row) break;
        candidates.push_back({query.Text(0), query.Int(1), query.Text(2)});
      }
    }

    std::map<std::string, Job> jobs;  // the candidates' jobs, loaded once each (started by their first grant)
    for (const auto& [job_id, index, team] : candidates) {
      auto job_it = jobs.find(job_id);
      if (job_it == jobs.end()) {
        ASSIGN_OR_RETURN(Job job, LoadJob(job_id));
        job_it = jobs.emplace(job_id, std::move(job)).first;
      }
      if (!rules::MayPlace(executor, job_it->second, now, WarmWait())) continue;  // the rules decide
      ASSIGN_OR_RETURN(Task task, LoadTask(job_id, index));
      if (task.shadow && task.shadow->executor_id == executor_id) continue;  // its backup goes elsewhere
      if (!rules::TakeAllowance(allowances, team)) continue;                 // its team reached its quota
      RETURN_IF_ERROR(GrantTask(task, executor_id, ttl, now));
      RETURN_IF_ERROR(SaveTask(task));
      leases.push_back(MakeLease(std::move(task), job_it->second.spec));
      if (MarkJobStarted(job_it->second, now)) RETURN_IF_ERROR(SaveJob(job_it->second));
    }
    if (!leases.empty() && rules::MarkBusy(executor)) RETURN_IF_ERROR(SaveExecutor(executor));
    return leases;
  });
}

template <typename Transition>
absl::StatusOr<Task> SqliteMetadataStore::FinishAttempt(const std::string& executor_id, const std::string& job_id,
                                                        int64_t task_index, int attempt, Transition&& transition,
                                                        absl::Time now) {
  RETURN_IF_ERROR(LoadExecutor(executor_id).status());
  ASSIGN_OR_RETURN(Job job, LoadJob(job_id));
  ASSIGN_OR_RETURN(Task task, LoadTask(job_id, task_index));
  RETURN_IF_ERROR(CheckFence(task, executor_id, attempt));
  const Task before = task;
  RETURN_IF_ERROR(transition(task, job));
  RETURN_IF_ERROR(SaveTask(task));
  RETURN_IF_ERROR(ChargeUsage({{job_id, rules::EndedAttemptTime(before, task, now)}}, now));
  if (IsTerminal(task.state)) {
    AccountTerminalTask(job, task, now);
    RETURN_IF_ERROR(SaveJob(job));
  }
  return task;
}

absl::StatusOr<Task> SqliteMetadataStore::CompleteTask(const std::string& executor_id, const std::string& job_id,
                                                       int64_t task_index, int attempt, int64_t records_done,
                                                       int64_t records_failed, absl::Time now) {
  return InTransaction(true, [&]() -> absl::StatusOr<Task> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Task task, FinishAttempt(
                                    executor_id, job_id, task_index, attempt,
                                    [&](Task& t, const Job&) {
                                      return ::minions::CompleteTask(t, records_done, records_failed, now);
                                    },
                                    now));
    ASSIGN_OR_RETURN(Executor executor, LoadExecutor(executor_id));
    executor.records_done += task.records_done;
    RETURN_IF_ERROR(SaveExecutor(executor));
    return task;
  });
}

absl::StatusOr<CompletionReply> SqliteMetadataStore::CompleteMany(const std::vector<CompletionCall>& calls,
                                                                   absl::Time now) {
  return InTransaction(true, [&]() -> absl::StatusOr<CompletionReply> {
    mu_.AssertHeld();
    // Jobs are loaded once and saved once, however many of their tasks complete here.
    std::map<std::string, Job> jobs;
    std::map<std::string, JobState> states;  // each job's state as loaded
    std::map<std::string, absl::Duration> charges;  // by job
    CompletionReply reply;
    for (const CompletionCall& call : calls) {
      absl::StatusOr<Executor> executor = LoadExecutor(call.executor_id);
      if (absl::IsNotFound(executor.status())) {
        reply.outcomes.push_back(executor.status());
        continue;
      }
      RETURN_IF_ERROR(executor.status());
      std::vector<absl::Status> outcomes;
      for (const LeaseProgress& report : call.reports) {
        auto job_it = jobs.find(report.job_id);
        if (job_it == jobs.end()) {
          auto job = LoadJob(report.job_id);
          if (!job.ok()) {
            outcomes.push_back(job.status());
            continue;
          }
          states[report.job_id] = job->state;
          job_it = jobs.emplace(report.job_id, std::move(*job)).first;
        }
        auto task = LoadTask(report.job_id, report.task_index);
        if (!task.ok()) {
          outcomes.push_back(task.status());
          continue;
        }
        const Task before = *task;
        if (absl::Status done = rules::CompleteReport(*task, call.executor_id, report, now); !done.ok()) {
          outcomes.push_back(done);
          continue;
        }
        RETURN_IF_ERROR(SaveTask(*task));
        charges[report.job_id] += rules::EndedAttemptTime(before, *task, now);
        AccountTerminalTask(job_it->second, *task, now);
        executor->records_done += task->records_done;
        outcomes.push_back(absl::OkStatus());
      }
      RETURN_IF_ERROR(SaveExecutor(*executor));
      reply.outcomes.push_back(std::move(outcomes));
    }
    for (auto& [id, job] : jobs) {
      RETURN_IF_ERROR(SaveJob(job));
      if (job.state == JobState::kFinalizing && states[id] != JobState::kFinalizing) reply.finalizing.push_back(id);
    }
    RETURN_IF_ERROR(ChargeUsage(charges, now));
    return reply;
  });
}

absl::StatusOr<Task> SqliteMetadataStore::FailTask(const std::string& executor_id, const std::string& job_id,
                                                   int64_t task_index, int attempt, FailureClass failure,
                                                   const std::string& message, absl::Time now,
                                                   const std::vector<Chunk>& chunks) {
  return InTransaction(true, [&]() -> absl::StatusOr<Task> {
    mu_.AssertHeld();
    return FinishAttempt(
        executor_id, job_id, task_index, attempt,
        [&](Task& t, const Job& job) {
          return FailAttempt(t, attempt, chunks, failure, message, job.spec.max_attempts, options_.retry, now);
        },
        now);
  });
}

// --- watchdog ---

// --- the servers' agreement ---

absl::Status SqliteMetadataStore::ClaimObjectStore(const std::string& identity, absl::Time now) {
  return InTransaction(true, [&]() -> absl::Status {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Statement insert, Prepare("INSERT INTO settings (name, value, set_at) VALUES (:name, :value, :at) "
                                               "ON CONFLICT (name) DO NOTHING"));
    RETURN_IF_ERROR(insert.BindText(":name", kObjectStoreSetting)
                        .BindText(":value", identity)
                        .BindTime(":at", now)
                        .Run());
    ASSIGN_OR_RETURN(std::string recorded, LoadSetting(kObjectStoreSetting));
    return CheckObjectStore(recorded, identity);
  });
}

absl::StatusOr<std::string> SqliteMetadataStore::RecordedObjectStore() {
  return InTransaction(false, [&]() -> absl::StatusOr<std::string> {
    mu_.AssertHeld();
    return LoadSetting(kObjectStoreSetting);
  });
}

absl::Status SqliteMetadataStore::RecordThroughput(const ThroughputKey& key, const ThroughputSample& sample,
                                                   absl::Time now) {
  return InTransaction(true, [&]() -> absl::Status {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(
        Statement upsert,
        Prepare("INSERT INTO task_throughput (model, runner, records, seconds, samples, updated_at) "
                "VALUES (:model, :runner, CAST(:records AS REAL), CAST(:seconds AS REAL), 1, :at) "
                "ON CONFLICT (model, runner) DO UPDATE SET records = records * CAST(:keep AS REAL) + excluded.records, "
                "seconds = seconds * CAST(:keep AS REAL) + excluded.seconds, samples = samples + 1, "
                "updated_at = excluded.updated_at"));
    return upsert.BindText(":model", key.model)
        .BindText(":runner", key.runner)
        .BindText(":records", absl::StrCat(sample.records))
        .BindText(":seconds", absl::StrFormat("%.9g", absl::ToDoubleSeconds(sample.took)))
        .BindText(":keep", absl::StrFormat("%.9g", kThroughputMemory))
        .BindTime(":at", now)
        .Run();
  });
}

absl::StatusOr<std::optional<Throughput>> SqliteMetadataStore::GetThroughput(const ThroughputKey& key) {
  return InTransaction(false, [&]() -> absl::StatusOr<std::optional<Throughput>> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Statement query,
                     Prepare("SELECT CAST(records AS TEXT), CAST(seconds AS TEXT), samples, updated_at "
                             "FROM task_throughput WHERE model = :model AND runner = :runner"));
    query.BindText(":model", key.model).BindText(":runner", key.runner);
    ASSIGN_OR_RETURN(bool row, query.Step());
    if (!row) return std::optional<Throughput>();
    Throughput throughput;
    if (!absl::SimpleAtod(query.Text(0), &throughput.records) ||
        !absl::SimpleAtod(query.Text(1), &throughput.seconds)) {
      return absl::DataLossError(absl::StrCat("task_throughput of ", key.model, " holds no number"));
    }
    throughput.samples = query.Int(2);
    throughput.updated_at = query.Time(3);
    return std::optional<Throughput>(throughput);
  });
}

absl::StatusOr<std::string> SqliteMetadataStore::LoadSetting(const std::string& name) {
  ASSIGN_OR_RETURN(Statement query, Prepare("SELECT value FROM settings WHERE name = :name"));
  query.BindText(":name", name);
  ASSIGN_OR_RETURN(bool row, query.Step());
  return row ? query.Text(0) : std::string();
}

absl::StatusOr<std::vector<Task>> SqliteMetadataStore::ExpireLeases(absl::Time now, int limit) {
  return InTransaction(true, [&]() -> absl::StatusOr<std::vector<Task>> {
    mu_.AssertHeld();
    std::vector<std::pair<std::string, int64_t>> expired;
    {
      ASSIGN_OR_RETURN(Statement query, Prepare(kExpiredLeases));
      query.BindText(":running", Name(TaskStateName(TaskState::kRunning)))
          .BindTime(":now", now)
          .BindInt(":limit", limit > 0 ? limit : -1);
      while (true) {
        ASSIGN_OR_RETURN(bool row, query.Step());
        if (!row) break;
        expired.emplace_back(query.Text(0), query.Int(1));
      }
    }
    std::map<std::string, Job> jobs;
    std::set<std::string> accounted;  // jobs to save
    std::map<std::string, absl::Duration> charges;  // by job
    std::vector<Task> tasks;
    for (const auto& [job_id, index] : expired) {
      auto job_it = jobs.find(job_id);
      if (job_it == jobs.end()) {
        ASSIGN_OR_RETURN(Job job, LoadJob(job_id));
        job_it = jobs.emplace(job_id, std::move(job)).first;
      }
      Job& job = job_it->second;
      ASSIGN_OR_RETURN(Task task, LoadTask(job_id, index));
      const Task before = task;
      RETURN_IF_ERROR(ExpireLease(task, job.spec.max_attempts, options_.retry, now));
      RETURN_IF_ERROR(SaveTask(task));
      charges[job_id] += rules::EndedAttemptTime(before, task, now);
      if (IsTerminal(task.state)) {
        AccountTerminalTask(job, task, now);
        accounted.insert(job_id);
      }
      tasks.push_back(std::move(task));
    }
    for (const std::string& job_id : accounted) RETURN_IF_ERROR(SaveJob(jobs.at(job_id)));
    RETURN_IF_ERROR(ChargeUsage(charges, now));
    return tasks;
  });
}

absl::StatusOr<std::vector<Executor>> SqliteMetadataStore::MarkLostExecutors(absl::Time cutoff, absl::Time now) {
  return InTransaction(true, [&]() -> absl::StatusOr<std::vector<Executor>> {
    mu_.AssertHeld();
    std::vector<std::string> ids;
    {
      ASSIGN_OR_RETURN(Statement query, Prepare(kSilentExecutors));
      query.BindText(":lost", Name(ExecutorStateName(ExecutorState::kLost)))
          .BindText(":revoked", Name(ExecutorStateName(ExecutorState::kRevoked)))
          .BindTime(":cutoff", cutoff);
      while (true) {
        ASSIGN_OR_RETURN(bool row, query.Step());
        if (!row) break;
        ids.push_back(query.Text(0));
      }
    }
    std::vector<Executor> lost;
    for (const std::string& id : ids) {
      ASSIGN_OR_RETURN(Executor executor, LoadExecutor(id));
      rules::MarkLost(executor);
      RETURN_IF_ERROR(SaveExecutor(executor));
      lost.push_back(std::move(executor));
    }
    return lost;
  });
}

}  // namespace minions
