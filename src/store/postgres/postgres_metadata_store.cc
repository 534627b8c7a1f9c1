#include "store/postgres/postgres_metadata_store.h"

#include <libpq-fe.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "model/json_codec.h"
#include "store/postgres/postgres_migrations.h"

namespace minions {
namespace {

// How long a method keeps retrying a transaction the server broke off (a restart, a failover, a
// deadlock victim) before it answers Unavailable.
constexpr absl::Duration kRetryWindow = absl::Seconds(30);
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(20);
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);

// Tasks of an unknown runner kind: an executor that lists no runners runs the built-in one.
constexpr char kDefaultRunner[] = "llama";

std::string Name(std::string_view name) { return std::string(name); }

// SQLSTATEs after which the whole transaction is run again: the connection is gone or going
// (class 08, 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now, 53300
// too_many_connections), or the server aborted it to resolve a conflict (40001, 40P01). An empty
// SQLSTATE is a client-side failure: the connection broke.
bool IsRetryableSqlState(std::string_view sqlstate) {
  return sqlstate.empty() || sqlstate.substr(0, 2) == "08" || sqlstate == "57P01" || sqlstate == "57P02" ||
         sqlstate == "57P03" || sqlstate == "53300" || sqlstate == "40001" || sqlstate == "40P01";
}

std::string TrimNewlines(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  return text;
}

absl::Status CorruptRow(std::string_view table, std::string_view id, std::string_view what) {
  return absl::InternalError(
      absl::StrCat("corrupt ", std::string(table), " row ", std::string(id), ": ", std::string(what)));
}

absl::Status CheckConninfo(const std::string& conninfo) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), &error);
  if (options == nullptr) {
    std::string message = error != nullptr ? TrimNewlines(error) : "out of memory";
    PQfreemem(error);
    return absl::InvalidArgumentError(absl::StrCat("invalid PostgreSQL connection string: ", message));
  }
  PQconninfoFree(options);
  return absl::OkStatus();
}

}  // namespace

namespace postgres_store {

// Query parameters, sent as text (NULL as nullopt).
class Params {
 public:
  Params& Text(std::string value) {
    values_.emplace_back(std::move(value));
    return *this;
  }
  Params& Int(int64_t value) { return Text(std::to_string(value)); }
  Params& Bool(bool value) { return Text(value ? "true" : "false"); }
  Params& Null() {
    values_.emplace_back(std::nullopt);
    return *this;
  }
  Params& Time(absl::Time value) { return Int(absl::ToUnixMicros(value)); }
  Params& Time(const std::optional<absl::Time>& value) { return value ? Time(*value) : Null(); }
  // A LIMIT: none (NULL, i.e. LIMIT ALL) unless positive.
  Params& Limit(int limit) { return limit > 0 ? Int(limit) : Null(); }
  const std::vector<std::optional<std::string>>& values() const { return values_; }

 private:
  std::vector<std::optional<std::string>> values_;
};

// An owned PGresult in text format.
class PgResult {
 public:
  explicit PgResult(PGresult* result) : result_(result) {}
  PgResult(PgResult&& other) noexcept : result_(std::exchange(other.result_, nullptr)) {}
  PgResult& operator=(PgResult&&) = delete;
  ~PgResult() {
    if (result_ != nullptr) PQclear(result_);
  }

  int Rows() const { return PQntuples(result_); }
  bool IsNull(int row, int column) const { return PQgetisnull(result_, row, column) != 0; }
  std::string Text(int row, int column) const {
    return std::string(PQgetvalue(result_, row, column), PQgetlength(result_, row, column));
  }
  int64_t Int(int row, int column) const { return std::strtoll(PQgetvalue(result_, row, column), nullptr, 10); }
  bool Bool(int row, int column) const { return PQgetvalue(result_, row, column)[0] == 't'; }
  absl::Time Time(int row, int column) const { return absl::FromUnixMicros(Int(row, column)); }
  std::optional<absl::Time> OptTime(int row, int column) const {
    if (IsNull(row, column)) return std::nullopt;
    return Time(row, column);
  }
  // Rows an INSERT/UPDATE/DELETE touched.
  int64_t Affected() const {
    const char* count = PQcmdTuples(result_);
    return count[0] != '\0' ? std::strtoll(count, nullptr, 10) : 0;
  }

 private:
  PGresult* result_;
};

// One row of a result, read like a SQLite statement's current row.
struct Row {
  const PgResult& result;
  int row;
  std::string Text(int column) const { return result.Text(row, column); }
  int64_t Int(int column) const { return result.Int(row, column); }
  bool Bool(int column) const { return result.Bool(row, column); }
  absl::Time Time(int column) const { return result.Time(row, column); }
  std::optional<absl::Time> OptTime(int column) const { return result.OptTime(row, column); }
};

// One libpq connection, (re)made on demand. Not thread-safe: the pool hands it to one thread at a
// time. Remembers the first error of the current transaction, and whether it calls for a retry.
class Connection {
 public:
  explicit Connection(std::string conninfo) : conninfo_(std::move(conninfo)) {}
  ~Connection() { Close(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Connects unless connected and idle (outside any transaction).
  absl::Status EnsureConnected() {
    if (conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK) {
      if (PQtransactionStatus(conn_) == PQTRANS_IDLE) return absl::OkStatus();
      Rollback();
      if (PQstatus(conn_) == CONNECTION_OK && PQtransactionStatus(conn_) == PQTRANS_IDLE) return absl::OkStatus();
    }
    Close();
    conn_ = PQconnectdb(conninfo_.c_str());
    if (conn_ == nullptr || PQstatus(conn_) != CONNECTION_OK) {
      std::string message = conn_ != nullptr ? TrimNewlines(PQerrorMessage(conn_)) : "out of memory";
      Close();
      return absl::UnavailableError(absl::StrCat("cannot connect to PostgreSQL: ", message));
    }
    // NOTICEs (e.g. "relation already exists, skipping") are not ours to print.
    PQsetNoticeProcessor(
        conn_, [](void*, const char*) {}, nullptr);
    return absl::OkStatus();
  }

  void Close() {
    if (conn_ != nullptr) PQfinish(conn_);
    conn_ = nullptr;
    prepared_.clear();  // prepared statements live and die with their session
  }
  bool Broken() const { return conn_ == nullptr || PQstatus(conn_) != CONNECTION_OK; }

  // One statement with $n parameters (extended protocol).
  absl::StatusOr<PgResult> Exec(const char* sql, const Params& params = Params()) {
    if (conn_ == nullptr) return Fail(nullptr, sql);
    std::vector<const char*> values;
    values.reserve(params.values().size());
    for (const std::optional<std::string>& value : params.values()) {
      values.push_back(value ? value->c_str() : nullptr);
    }
    // Each statement is parsed and planned once per connection, then only executed: the store's
    // statements are a fixed set of constants, run thousands of times a second under load.
    auto it = prepared_.find(sql);
    if (it == prepared_.end()) {
      std::string name = absl::StrCat("minions_", prepared_.size());
      auto prepared = Check(PQprepare(conn_, name.c_str(), sql, static_cast<int>(values.size()), nullptr), sql);
      if (!prepared.ok()) return prepared.status();
      it = prepared_.emplace(sql, std::move(name)).first;
    }
    return Check(PQexecPrepared(conn_, it->second.c_str(), static_cast<int>(values.size()), values.data(), nullptr,
                                nullptr, 0),
                 sql);
  }
  // Constant text of one or more statements, no parameters (simple protocol); the last result.
  absl::StatusOr<PgResult> ExecScript(const char* sql) {
    if (conn_ == nullptr) return Fail(nullptr, sql);
    return Check(PQexec(conn_, sql), sql);
  }
  // Ends the current transaction, if any, ignoring errors (they are already recorded).
  void Rollback() {
    if (conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK && PQtransactionStatus(conn_) != PQTRANS_IDLE) {
      PQclear(PQexec(conn_, "ROLLBACK"));
    }
  }

  // Per transaction.
  void StartTransaction(bool write) {
    first_error_ = absl::OkStatus();
    retryable_ = false;
    for_update_ = write;
  }
  const absl::Status& first_error() const { return first_error_; }
  bool retryable() const { return retryable_; }
  // In a writing transaction, loads lock the rows they read.
  bool for_update() const { return for_update_; }

 private:
  absl::StatusOr<PgResult> Check(PGresult* result, const char* sql) {
    ExecStatusType status = result != nullptr ? PQresultStatus(result) : PGRES_FATAL_ERROR;
    if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) return PgResult(result);
    return Fail(result, sql);
  }
  absl::Status Fail(PGresult* result, const char* sql) {
    std::string sqlstate;
    std::string message = "not connected";
    if (result != nullptr) {
      const char* field = PQresultErrorField(result, PG_DIAG_SQLSTATE);
      if (field != nullptr) sqlstate = field;
      message = TrimNewlines(PQresultErrorMessage(result));
      PQclear(result);
    } else if (conn_ != nullptr) {
      message = TrimNewlines(PQerrorMessage(conn_));
    }
    if (Broken()) sqlstate.clear();  // whatever the server said last, the connection is gone
    std::string text = absl::StrCat("postgres: ", Excerpt(sql, 60), ": ",
                                    sqlstate.empty() ? "" : absl::StrCat("[", sqlstate, "] "), message);
    absl::Status error;
    if (IsRetryableSqlState(sqlstate)) {
      error = absl::UnavailableError(text);
      retryable_ = true;
    } else if (sqlstate == "23505") {
      error = absl::AlreadyExistsError(text);
    } else {
      error = absl::InternalError(text);
    }
    if (first_error_.ok()) first_error_ = error;
    return error;
  }

  const std::string conninfo_;
  PGconn* conn_ = nullptr;
  std::map<std::string, std::string> prepared_;  // statement text -> prepared name, this session
  absl::Status first_error_;
  bool retryable_ = false;
  bool for_update_ = false;
};

// A fixed set of connections; Acquire waits for a free one.
class ConnectionPool {
 public:
  ConnectionPool(const std::string& conninfo, int size) {
    for (int i = 0; i < size; ++i) idle_.push_back(std::make_unique<Connection>(conninfo));
  }
  std::unique_ptr<Connection> Acquire() {
    absl::MutexLock lock(&mu_);
    while (idle_.empty()) available_.Wait(&mu_);
    std::unique_ptr<Connection> connection = std::move(idle_.back());
    idle_.pop_back();
    return connection;
  }
  void Release(std::unique_ptr<Connection> connection) {
    absl::MutexLock lock(&mu_);
    idle_.push_back(std::move(connection));  // last in, first out: warm connections are reused
    available_.Signal();
  }

 private:
  absl::Mutex mu_;
  absl::CondVar available_;
  std::vector<std::unique_ptr<Connection>> idle_ ABSL_GUARDED_BY(mu_);
};

// A connection borrowed from the pool for one scope.
class Borrowed {
 public:
  explicit Borrowed(ConnectionPool* pool) : pool_(pool), connection_(pool->Acquire()) {}
  ~Borrowed() { pool_->Release(std::move(connection_)); }
  Connection& operator*() { return *connection_; }
  Connection* operator->() { return connection_.get(); }

 private:
  ConnectionPool* pool_;
  std::unique_ptr<Connection> connection_;
};

}  // namespace postgres_store

namespace {

using postgres_store::Params;
using postgres_store::PgResult;
using postgres_store::Row;

// --- SQL. Every statement is constant text with $n parameters; values are always bound. ---

#define MINIONS_JOB_COLUMNS                                                                        \
  "id, team, state, spec, total_records, completed_records, failed_records, n_tasks, tasks_done, " \
  "tasks_succeeded, error, output_key, errors_key, manifest_key, created_at, updated_at, "         \
  "started_at, finished_at"
#define MINIONS_TASK_COLUMNS                                                               \
  "job_id, idx, first_record, n_records, byte_begin, byte_end, state, attempt, failures, " \
  "preemptions, executor_id, lease_expires_at, not_before, records_done, records_failed, " \
  "last_error, started_at, finished_at, chunks"
#define MINIONS_EXECUTOR_COLUMNS \
  "id, info, state, state_reason, registered_at, last_heartbeat_at, drain_requested, records_done"

#define MINIONS_SELECT_JOB "SELECT " MINIONS_JOB_COLUMNS " FROM jobs WHERE id = $1"
constexpr char kSelectJob[] = MINIONS_SELECT_JOB;
constexpr char kSelectJobForUpdate[] = MINIONS_SELECT_JOB " FOR UPDATE";
// Insert and update take the same parameters: $1 id, then the other columns in this order.
constexpr char kInsertJob[] =
    "INSERT INTO jobs (id, team, state, spec, priority, min_memory_bytes, runner, total_records, "
    "completed_records, failed_records, n_tasks, tasks_done, tasks_succeeded, error, output_key, "
    "errors_key, manifest_key, created_at, updated_at, started_at, finished_at) VALUES ($1, $2, $3, "
    "$4::jsonb, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21) "
    "ON CONFLICT (id) DO NOTHING";
constexpr char kUpdateJob[] =
    "UPDATE jobs SET team = $2, state = $3, spec = $4::jsonb, priority = $5, min_memory_bytes = $6, "
    "runner = $7, total_records = $8, completed_records = $9, failed_records = $10, n_tasks = $11, "
    "tasks_done = $12, tasks_succeeded = $13, error = $14, output_key = $15, errors_key = $16, "
    "manifest_key = $17, created_at = $18, updated_at = $19, started_at = $20, finished_at = $21 "
    "WHERE id = $1";
constexpr char kListJobs[] =
    "SELECT " MINIONS_JOB_COLUMNS
    " FROM jobs WHERE ($1::text IS NULL OR state = $1::text) "
    "AND ($2::text = '' OR team = $2::text) ORDER BY created_at DESC, id DESC LIMIT $3::bigint";
constexpr char kJobsInState[] =
    "SELECT " MINIONS_JOB_COLUMNS " FROM jobs WHERE state = $1 ORDER BY created_at, id LIMIT $2::bigint";

#define MINIONS_SELECT_TASK "SELECT " MINIONS_TASK_COLUMNS " FROM tasks WHERE job_id = $1 AND idx = $2"
constexpr char kSelectTask[] = MINIONS_SELECT_TASK;
constexpr char kSelectTaskForUpdate[] = MINIONS_SELECT_TASK " FOR UPDATE";
#define MINIONS_SELECT_TASKS_OF_JOB "SELECT " MINIONS_TASK_COLUMNS " FROM tasks WHERE job_id = $1 ORDER BY idx"
constexpr char kSelectTasksOfJob[] = MINIONS_SELECT_TASKS_OF_JOB;
constexpr char kSelectTasksOfJobForUpdate[] = MINIONS_SELECT_TASKS_OF_JOB " FOR UPDATE";
constexpr char kInsertTask[] = "INSERT INTO tasks (" MINIONS_TASK_COLUMNS
                               ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, "
                               "$12, $13, $14, $15, $16, $17, $18, $19::jsonb) ON CONFLICT (job_id, idx) DO NOTHING";
constexpr char kUpdateTask[] =
    "UPDATE tasks SET first_record = $3, n_records = $4, byte_begin = $5, byte_end = $6, state = $7, "
    "attempt = $8, failures = $9, preemptions = $10, executor_id = $11, lease_expires_at = $12, "
    "not_before = $13, records_done = $14, records_failed = $15, last_error = $16, started_at = $17, "
    "finished_at = $18, chunks = $19::jsonb WHERE job_id = $1 AND idx = $2";

// Candidate selection only: which pending tasks this executor could run, in grant order, locked
// (tasks another transaction holds are skipped, not waited for). Whether a task may actually be
// granted is GrantTask's decision.
constexpr char kLeaseCandidates[] =
    "SELECT t.job_id, t.idx FROM tasks t JOIN jobs j ON j.id = t.job_id "
    "WHERE t.state = $1 AND (t.not_before IS NULL OR t.not_before <= $2) "
    "AND j.state IN ($3, $4) AND j.min_memory_bytes <= $5 "
    "AND j.runner IN (SELECT jsonb_array_elements_text($6::jsonb)) "
    "ORDER BY j.priority DESC, j.created_at, j.id, t.idx LIMIT $7 FOR UPDATE OF t SKIP LOCKED";
constexpr char kExpiredLeases[] =
    "SELECT job_id, idx FROM tasks WHERE state = $1 AND lease_expires_at <= $2 "
    "ORDER BY lease_expires_at, job_id, idx LIMIT $3::bigint FOR UPDATE SKIP LOCKED";

#define MINIONS_SELECT_EXECUTOR "SELECT " MINIONS_EXECUTOR_COLUMNS " FROM executors WHERE id = $1"
constexpr char kSelectExecutor[] = MINIONS_SELECT_EXECUTOR;
constexpr char kSelectExecutorForUpdate[] = MINIONS_SELECT_EXECUTOR " FOR UPDATE";
constexpr char kListExecutors[] = "SELECT " MINIONS_EXECUTOR_COLUMNS " FROM executors ORDER BY registered_at, id";
constexpr char kInsertExecutor[] = "INSERT INTO executors (" MINIONS_EXECUTOR_COLUMNS
                                   ") VALUES ($1, $2::jsonb, $3, $4, $5, $6, $7, $8) "
                                   "ON CONFLICT (id) DO NOTHING";
constexpr char kUpdateExecutor[] =
    "UPDATE executors SET info = $2::jsonb, state = $3, state_reason = $4, registered_at = $5, "
    "last_heartbeat_at = $6, drain_requested = $7, records_done = $8 WHERE id = $1";
// A heartbeat being recorded right now (its row locked) is proof of life: skipped.
constexpr char kSilentExecutors[] =
    "SELECT id FROM executors WHERE state <> $1 AND last_heartbeat_at < $2 "
    "ORDER BY last_heartbeat_at, id FOR UPDATE SKIP LOCKED";

constexpr char kMigrationLock[] = "SELECT pg_advisory_xact_lock($1)";
constexpr char kCreateMigrationsTable[] =
    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
    "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())";
constexpr char kSchemaVersion[] =
    "SELECT COALESCE(MAX(version), 0), current_database(), COALESCE(current_schema(), '') FROM schema_migrations";
constexpr char kRecordMigration[] = "INSERT INTO schema_migrations (version) VALUES ($1)";

constexpr char kTxidStatus[] = "SELECT txid_status($1)";

#undef MINIONS_JOB_COLUMNS
#undef MINIONS_TASK_COLUMNS
#undef MINIONS_EXECUTOR_COLUMNS
#undef MINIONS_SELECT_JOB
#undef MINIONS_SELECT_TASK
#undef MINIONS_SELECT_TASKS_OF_JOB
#undef MINIONS_SELECT_EXECUTOR

// A bit of jitter, so that servers that lost the database together do not retry in lockstep.
absl::Duration Jittered(absl::Duration backoff) {
  static thread_local std::mt19937 random(std::random_device{}());
  return backoff * (0.5 + std::uniform_real_distribution<double>(0, 1)(random));
}

// After a COMMIT whose answer was lost: did transaction `xid` commit? Asks on a fresh connection
// until `deadline`.
absl::StatusOr<bool> WasCommitted(postgres_store::Connection& c, int64_t xid, absl::Time deadline) {
  absl::Duration backoff = kFirstBackoff;
  absl::Status last_error;
  while (true) {
    absl::Status connected = c.EnsureConnected();
    if (connected.ok()) {
      c.StartTransaction(false);
      absl::StatusOr<PgResult> status = c.Exec(kTxidStatus, Params().Int(xid));
      if (status.ok()) {
        const std::string answer = status->IsNull(0, 0) ? "" : status->Text(0, 0);
        if (answer == "committed") return true;
        if (answer != "in progress") return false;  // aborted (or forgotten: never committed)
      } else {
        last_error = status.status();
        if (!c.retryable()) return last_error;
      }
    } else {
      last_error = connected;
    }
    if (absl::Now() + backoff > deadline) {
      return absl::UnavailableError(
          absl::StrCat("PostgreSQL: cannot learn whether a transaction committed: ", last_error.message()));
    }
    absl::SleepFor(Jittered(backoff));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

}  // namespace

// --- opening and migrations ---

absl::StatusOr<std::unique_ptr<PostgresMetadataStore>> PostgresMetadataStore::Open(const std::string& conninfo,
                                                                                   const StoreOptions& options,
                                                                                   int pool_size) {
  RETURN_IF_ERROR(CheckConninfo(conninfo));
  if (pool_size < 1) return absl::InvalidArgumentError(absl::StrCat("pool size ", pool_size, " < 1"));
  auto pool = std::make_unique<postgres_store::ConnectionPool>(conninfo, pool_size);
  {
    // A server that cannot be reached at all now is an error at once; retrying is for a server
    // that goes away while we use it.
    postgres_store::Borrowed connection(pool.get());
    RETURN_IF_ERROR(connection->EnsureConnected());
  }
  std::unique_ptr<PostgresMetadataStore> store(new PostgresMetadataStore(std::move(pool), options));
  RETURN_IF_ERROR(store->Migrate());
  return store;
}

PostgresMetadataStore::PostgresMetadataStore(std::unique_ptr<postgres_store::ConnectionPool> pool,
                                             const StoreOptions& options)
    : options_(options), pool_(std::move(pool)), random_(std::random_device{}()) {}

PostgresMetadataStore::~PostgresMetadataStore() = default;

absl::Status PostgresMetadataStore::Migrate() {
  const int latest = postgres_store::LatestSchemaVersion();
  // One migration per transaction, each under the advisory lock; the version is read again
  // inside each one, after the lock: another server may have migrated meanwhile.
  while (true) {
    ASSIGN_OR_RETURN(
        bool done, InTransaction(true, [&](Connection& c) -> absl::StatusOr<bool> {
          RETURN_IF_ERROR(c.Exec(kMigrationLock, Params().Int(postgres_store::kMigrationLockKey)).status());
          RETURN_IF_ERROR(c.Exec(kCreateMigrationsTable).status());
          ASSIGN_OR_RETURN(PgResult version, c.Exec(kSchemaVersion));
          const int current = static_cast<int>(version.Int(0, 0));
          if (current > latest) {
            return absl::FailedPreconditionError(
                absl::StrCat("metadata store (PostgreSQL database ", version.Text(0, 1), ", schema ",
                             version.Text(0, 2), ") has schema version ", current, " but this binary knows only up to ",
                             latest, ": it was written by a newer minions; upgrade this binary"));
          }
          if (current == latest) return true;
          const postgres_store::Migration& migration = postgres_store::Migrations()[current];
          if (migration.version != current + 1) {
            return absl::InternalError(absl::StrCat("migration list is out of order at version ", current + 1));
          }
          RETURN_IF_ERROR(c.ExecScript(migration.sql).status());
          RETURN_IF_ERROR(c.Exec(kRecordMigration, Params().Int(migration.version)).status());
          return false;
        }));
    if (done) return absl::OkStatus();
  }
}

absl::StatusOr<int> PostgresMetadataStore::SchemaVersion() {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<int> {
    ASSIGN_OR_RETURN(PgResult version, c.Exec(kSchemaVersion));
    return static_cast<int>(version.Int(0, 0));
  });
}

// --- plumbing ---

template <typename Body>
auto PostgresMetadataStore::InTransaction(bool write, Body&& body) -> decltype(body(std::declval<Connection&>())) {
  using Result = decltype(body(std::declval<Connection&>()));
  postgres_store::Borrowed borrowed(pool_.get());
  Connection& c = *borrowed;
  const absl::Time deadline = absl::Now() + kRetryWindow;
  absl::Duration backoff = kFirstBackoff;
  absl::Status last_error;
  for (int tries = 0;; ++tries) {
    if (tries > 0) {
      if (absl::Now() + backoff > deadline) {
        return Result(
            absl::UnavailableError(absl::StrCat("PostgreSQL unavailable; gave up after ", tries, " tries in ",
                                                absl::FormatDuration(kRetryWindow), ": ", last_error.message())));
      }
      absl::SleepFor(Jittered(backoff));
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
    if (absl::Status connected = c.EnsureConnected(); !connected.ok()) {
      last_error = connected;
      continue;
    }
    c.StartTransaction(write);
    // A writing transaction takes its id at once, so that a COMMIT whose answer is lost can be
    // looked up afterwards instead of being run twice.
    absl::StatusOr<PgResult> begun = c.ExecScript(write ? "BEGIN; SELECT txid_current()" : "BEGIN");
    if (!begun.ok()) {
      last_error = begun.status();
      c.Rollback();
      if (c.retryable()) continue;
      return Result(begun.status());
    }
    const int64_t xid = write ? begun->Int(0, 0) : 0;

    Result result = body(c);
    if (c.retryable()) {  // the body's answer was made on a broken or aborted transaction
      last_error = c.first_error();
      c.Rollback();
      continue;
    }
    if (!result.ok() || !c.first_error().ok()) {
      c.Rollback();
      if (result.ok()) return Result(c.first_error());  // a query failed but the body went on
      return result;
    }
    absl::StatusOr<PgResult> committed = c.ExecScript("COMMIT");
    if (committed.ok()) return result;
    last_error = committed.status();
    if (!c.retryable()) {
      c.Rollback();
      return Result(committed.status());
    }
    if (!write) continue;
    absl::StatusOr<bool> was_committed = WasCommitted(c, xid, deadline);
    if (!was_committed.ok()) return Result(was_committed.status());
    if (*was_committed) return result;
    // It rolled back: run it again.
  }
}

std::string PostgresMetadataStore::NewId(const char* prefix) {
  uint64_t bits;
  {
    absl::MutexLock lock(&random_mu_);
    bits = random_();
  }
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%012llx", static_cast<unsigned long long>(bits & 0xffffffffffffULL));
  return absl::StrCat(prefix, hex);
}

// --- rows ---

namespace {

absl::StatusOr<Job> ReadJobRow(const Row& row) {
  Job job;
  job.id = row.Text(0);
  std::optional<JobState> state = ParseJobState(row.Text(2));
  if (!state) return CorruptRow("jobs", job.id, absl::StrCat("unknown state ", row.Text(2)));
  job.state = *state;
  absl::StatusOr<Json> spec_json = ParseJson(row.Text(3));
  if (!spec_json.ok()) return CorruptRow("jobs", job.id, std::string(spec_json.status().message()));
  absl::StatusOr<JobSpec> spec = JobSpecFromJson(*spec_json);
  if (!spec.ok()) return CorruptRow("jobs", job.id, std::string(spec.status().message()));
  job.spec = std::move(*spec);
  job.counts.total = row.Int(4);
  job.counts.completed = row.Int(5);
  job.counts.failed = row.Int(6);
  job.n_tasks = row.Int(7);
  job.tasks_done = row.Int(8);
  job.tasks_succeeded = row.Int(9);
  job.error = row.Text(10);
  job.output_key = row.Text(11);
  job.errors_key = row.Text(12);
  job.manifest_key = row.Text(13);
  job.created_at = row.Time(14);
  job.updated_at = row.Time(15);
  job.started_at = row.OptTime(16);
  job.finished_at = row.OptTime(17);
  return job;
}

absl::StatusOr<std::vector<Job>> ReadJobs(const PgResult& result) {
  std::vector<Job> jobs;
  for (int i = 0; i < result.Rows(); ++i) {
    ASSIGN_OR_RETURN(Job job, ReadJobRow(Row{result, i}));
    jobs.push_back(std::move(job));
  }
  return jobs;
}

absl::StatusOr<Task> ReadTaskRow(const Row& row) {
  Task task;
  task.job_id = row.Text(0);
  task.index = row.Int(1);
  task.first_record = row.Int(2);
  task.n_records = row.Int(3);
  task.byte_begin = row.Int(4);
  task.byte_end = row.Int(5);
  std::optional<TaskState> state = ParseTaskState(row.Text(6));
  if (!state) {
    return CorruptRow("tasks", absl::StrCat(task.job_id, "/", task.index), absl::StrCat("unknown state ", row.Text(6)));
  }
  task.state = *state;
  task.attempt = static_cast<int>(row.Int(7));
  task.failures = static_cast<int>(row.Int(8));
  task.preemptions = static_cast<int>(row.Int(9));
  task.executor_id = row.Text(10);
  task.lease_expires_at = row.OptTime(11);
  task.not_before = row.OptTime(12);
  task.records_done = row.Int(13);
  task.records_failed = row.Int(14);
  task.last_error = row.Text(15);
  task.started_at = row.OptTime(16);
  task.finished_at = row.OptTime(17);
  absl::StatusOr<Json> chunks_json = ParseJson(row.Text(18));
  absl::StatusOr<std::vector<Chunk>> chunks =
      chunks_json.ok() ? ChunksFromJson(*chunks_json) : absl::StatusOr<std::vector<Chunk>>(chunks_json.status());
  if (!chunks.ok()) return CorruptRow("tasks", absl::StrCat(task.job_id, "/", task.index), std::string(chunks.status().message()));
  task.chunks = *std::move(chunks);
  return task;
}

absl::StatusOr<Executor> ReadExecutorRow(const Row& row) {
  Executor executor;
  executor.id = row.Text(0);
  absl::StatusOr<Json> info_json = ParseJson(row.Text(1));
  if (!info_json.ok()) return CorruptRow("executors", executor.id, std::string(info_json.status().message()));
  absl::StatusOr<ExecutorInfo> info = ExecutorInfoFromJson(*info_json);
  if (!info.ok()) return CorruptRow("executors", executor.id, std::string(info.status().message()));
  executor.info = std::move(*info);
  std::optional<ExecutorState> state = ParseExecutorState(row.Text(2));
  if (!state) return CorruptRow("executors", executor.id, absl::StrCat("unknown state ", row.Text(2)));
  executor.state = *state;
  executor.state_reason = row.Text(3);
  executor.registered_at = row.Time(4);
  executor.last_heartbeat_at = row.Time(5);
  executor.drain_requested = row.Bool(6);
  executor.records_done = row.Int(7);
  return executor;
}

}  // namespace

absl::StatusOr<Job> PostgresMetadataStore::LoadJob(Connection& c, const std::string& job_id) {
  ASSIGN_OR_RETURN(PgResult result, c.Exec(c.for_update() ? kSelectJobForUpdate : kSelectJob, Params().Text(job_id)));
  if (result.Rows() == 0) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  return ReadJobRow(Row{result, 0});
}

absl::Status PostgresMetadataStore::SaveJob(Connection& c, const Job& job, bool insert) {
  Params params;
  params.Text(job.id)
      .Text(job.spec.team)
      .Text(Name(JobStateName(job.state)))
      .Text(DumpJson(JobSpecToJson(job.spec)))
      .Int(job.spec.priority)
      .Int(job.spec.requirements.min_memory_bytes)
      .Text(job.spec.requirements.runner)
      .Int(job.counts.total)
      .Int(job.counts.completed)
      .Int(job.counts.failed)
      .Int(job.n_tasks)
      .Int(job.tasks_done)
      .Int(job.tasks_succeeded)
      .Text(job.error)
      .Text(job.output_key)
      .Text(job.errors_key)
      .Text(job.manifest_key)
      .Time(job.created_at)
      .Time(job.updated_at)
      .Time(job.started_at)
      .Time(job.finished_at);
  ASSIGN_OR_RETURN(PgResult result, c.Exec(insert ? kInsertJob : kUpdateJob, params));
  if (result.Affected() != 1) {
    if (insert) return absl::AlreadyExistsError(absl::StrCat("job ", job.id, " exists"));
    return absl::NotFoundError(absl::StrCat("no job ", job.id));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Task>> PostgresMetadataStore::LoadTasks(Connection& c, const std::string& job_id) {
  ASSIGN_OR_RETURN(PgResult result,
                   c.Exec(c.for_update() ? kSelectTasksOfJobForUpdate : kSelectTasksOfJob, Params().Text(job_id)));
  std::vector<Task> tasks;
  for (int i = 0; i < result.Rows(); ++i) {
    ASSIGN_OR_RETURN(Task task, ReadTaskRow(Row{result, i}));
    tasks.push_back(std::move(task));
  }
  return tasks;
}

absl::StatusOr<Task> PostgresMetadataStore::LoadTask(Connection& c, const std::string& job_id, int64_t index) {
  ASSIGN_OR_RETURN(PgResult result,
                   c.Exec(c.for_update() ? kSelectTaskForUpdate : kSelectTask, Params().Text(job_id).Int(index)));
  if (result.Rows() == 0) return absl::NotFoundError(absl::StrCat("no task ", job_id, "/", index));
  return ReadTaskRow(Row{result, 0});
}

absl::Status PostgresMetadataStore::SaveTask(Connection& c, const Task& task, bool insert) {
  Params params;
  params.Text(task.job_id)
      .Int(task.index)
      .Int(task.first_record)
      .Int(task.n_records)
      .Int(task.byte_begin)
      .Int(task.byte_end)
      .Text(Name(TaskStateName(task.state)))
      .Int(task.attempt)
      .Int(task.failures)
      .Int(task.preemptions)
      .Text(task.executor_id)
      .Time(task.lease_expires_at)
      .Time(task.not_before)
      .Int(task.records_done)
      .Int(task.records_failed)
      .Text(task.last_error)
      .Time(task.started_at)
      .Time(task.finished_at)
      .Text(DumpJson(ChunksToJson(task.chunks)));
  ASSIGN_OR_RETURN(PgResult result, c.Exec(insert ? kInsertTask : kUpdateTask, params));
  if (result.Affected() != 1) {
    if (insert) return absl::AlreadyExistsError(absl::StrCat("task ", task.job_id, "/", task.index, " exists"));
    return absl::NotFoundError(absl::StrCat("no task ", task.job_id, "/", task.index));
  }
  return absl::OkStatus();
}

absl::StatusOr<Executor> PostgresMetadataStore::LoadExecutor(Connection& c, const std::string& executor_id) {
  ASSIGN_OR_RETURN(PgResult result,
                   c.Exec(c.for_update() ? kSelectExecutorForUpdate : kSelectExecutor, Params().Text(executor_id)));
  if (result.Rows() == 0) return absl::NotFoundError(absl::StrCat("no executor ", executor_id));
  return ReadExecutorRow(Row{result, 0});
}

absl::Status PostgresMetadataStore::SaveExecutor(Connection& c, const Executor& executor, bool insert) {
  Params params;
  params.Text(executor.id)
      .Text(DumpJson(ExecutorInfoToJson(executor.info)))
      .Text(Name(ExecutorStateName(executor.state)))
      .Text(executor.state_reason)
      .Time(executor.registered_at)
      .Time(executor.last_heartbeat_at)
      .Bool(executor.drain_requested)
      .Int(executor.records_done);
  ASSIGN_OR_RETURN(PgResult result, c.Exec(insert ? kInsertExecutor : kUpdateExecutor, params));
  if (result.Affected() != 1) {
    if (insert) return absl::AlreadyExistsError(absl::StrCat("executor ", executor.id, " exists"));
    return absl::NotFoundError(absl::StrCat("no executor ", executor.id));
  }
  return absl::OkStatus();
}

// --- jobs ---

absl::StatusOr<Job> PostgresMetadataStore::CreateJob(const JobSpec& spec, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Job> {
    Job job;
    job.spec = spec;
    job.state = JobState::kValidating;
    job.created_at = now;
    job.updated_at = now;
    // 48 random bits: a collision is unlikely, and retried when it happens.
    for (int tries = 0;; ++tries) {
      job.id = NewId("job-");
      absl::Status inserted = SaveJob(c, job, /*insert=*/true);
      if (inserted.ok()) return job;
      if (!absl::IsAlreadyExists(inserted) || tries == 3) return inserted;
    }
  });
}

absl::Status PostgresMetadataStore::AddTasks(const std::string& job_id, const std::vector<Task>& tasks,
                                             int64_t total_records, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::Status {
    ASSIGN_OR_RETURN(Job job, LoadJob(c, job_id));
    if (!IsAllowed(job.state, JobState::kQueued) || job.n_tasks != 0) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " is ", Name(JobStateName(job.state)),
                                                        "; tasks are added once, to a validating job"));
    }
    std::set<int64_t> indexes;
    int64_t records = 0;
    for (const Task& given : tasks) {
      if (given.index < 0 || !indexes.insert(given.index).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("job ", job_id, ": task index ", given.index, " is negative or given twice"));
      }
      records += given.n_records;
    }
    if (records != total_records) {
      return absl::InvalidArgumentError(
          absl::StrCat("job ", job_id, ": tasks hold ", records, " records but the job has ", total_records));
    }
    for (const Task& given : tasks) {
      // Only the shard's extent comes from the caller; the rest is a fresh task.
      Task task;
      task.job_id = job_id;
      task.index = given.index;
      task.first_record = given.first_record;
      task.n_records = given.n_records;
      task.byte_begin = given.byte_begin;
      task.byte_end = given.byte_end;
      RETURN_IF_ERROR(SaveTask(c, task, /*insert=*/true));
    }
    job.n_tasks = static_cast<int64_t>(tasks.size());
    job.counts.total = total_records;
    job.state = JobState::kQueued;
    // An empty input has nothing to run: straight to finalizing (an empty output).
    if (tasks.empty()) job.state = JobState::kFinalizing;
    job.updated_at = now;
    return SaveJob(c, job);
  });
}

absl::StatusOr<Job> PostgresMetadataStore::GetJob(const std::string& job_id) {
  return InTransaction(false, [&](Connection& c) { return LoadJob(c, job_id); });
}

absl::StatusOr<std::vector<Job>> PostgresMetadataStore::ListJobs(const JobFilter& filter) {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::vector<Job>> {
    Params params;
    if (filter.state) {
      params.Text(Name(JobStateName(*filter.state)));
    } else {
      params.Null();
    }
    params.Text(filter.team).Limit(filter.limit);
    ASSIGN_OR_RETURN(PgResult result, c.Exec(kListJobs, params));
    return ReadJobs(result);
  });
}

absl::StatusOr<std::vector<Task>> PostgresMetadataStore::ListTasks(const std::string& job_id) {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::vector<Task>> {
    RETURN_IF_ERROR(LoadJob(c, job_id).status());
    return LoadTasks(c, job_id);
  });
}

absl::StatusOr<Job> PostgresMetadataStore::EndJob(Connection& c, const std::string& job_id, JobState state,
                                                  const std::string& error, absl::Time now) {
  // The store's lock order is tasks, then their job: lock the tasks first, then read them again
  // once the job is locked (AddTasks may have committed in between).
  RETURN_IF_ERROR(LoadTasks(c, job_id).status());
  ASSIGN_OR_RETURN(Job job, LoadJob(c, job_id));
  if (!IsAllowed(job.state, state)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " already ", Name(JobStateName(job.state)),
                                                      "; it cannot become ", Name(JobStateName(state))));
  }
  // The job ends first, so accounting its cancelled tasks below only counts them done.
  job.state = state;
  job.error = error;
  job.finished_at = now;
  job.updated_at = now;
  ASSIGN_OR_RETURN(std::vector<Task> tasks, LoadTasks(c, job_id));
  for (Task& task : tasks) {
    if (IsTerminal(task.state)) continue;
    CancelTask(task, now);
    RETURN_IF_ERROR(SaveTask(c, task));
    AccountTerminalTask(job, task, now);
  }
  RETURN_IF_ERROR(SaveJob(c, job));
  return job;
}

absl::StatusOr<Job> PostgresMetadataStore::CancelJob(const std::string& job_id, absl::Time now) {
  return InTransaction(true, [&](Connection& c) { return EndJob(c, job_id, JobState::kCancelled, "", now); });
}

absl::StatusOr<Job> PostgresMetadataStore::FailJob(const std::string& job_id, const std::string& error,
                                                   absl::Time now) {
  return InTransaction(true, [&](Connection& c) { return EndJob(c, job_id, JobState::kFailed, error, now); });
}

absl::StatusOr<Job> PostgresMetadataStore::ExpireJob(const std::string& job_id, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Job> {
    ASSIGN_OR_RETURN(Job job, LoadJob(c, job_id));
    ASSIGN_OR_RETURN(std::vector<Task> tasks, LoadTasks(c, job_id));
    std::vector<Task> before = tasks;
    RETURN_IF_ERROR(::minions::ExpireJob(job, tasks, now));
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (tasks[i].state != before[i].state) RETURN_IF_ERROR(SaveTask(c, tasks[i]));
    }
    RETURN_IF_ERROR(SaveJob(c, job));
    return job;
  });
}

absl::StatusOr<std::vector<Job>> PostgresMetadataStore::JobsToFinalize(int limit) {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::vector<Job>> {
    ASSIGN_OR_RETURN(PgResult result,
                     c.Exec(kJobsInState, Params().Text(Name(JobStateName(JobState::kFinalizing))).Limit(limit)));
    return ReadJobs(result);
  });
}

absl::StatusOr<Job> PostgresMetadataStore::FinishJob(const std::string& job_id, const std::string& output_key,
                                                     const std::string& errors_key, const std::string& manifest_key,
                                                     absl::Time now, JobState outcome) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Job> {
    ASSIGN_OR_RETURN(Job job, LoadJob(c, job_id));
    if (job.state != JobState::kFinalizing || !IsAllowed(job.state, outcome)) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " is ", Name(JobStateName(job.state)),
                                                        ", not finalizing; it cannot become ",
                                                        Name(JobStateName(outcome))));
    }
    job.state = outcome;
    job.output_key = output_key;
    job.errors_key = errors_key;
    job.manifest_key = manifest_key;
    job.finished_at = now;
    job.updated_at = now;
    RETURN_IF_ERROR(SaveJob(c, job));
    return job;
  });
}

// --- executors ---

absl::StatusOr<Executor> PostgresMetadataStore::RegisterExecutor(const std::string& executor_id,
                                                                 const ExecutorInfo& info, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Executor> {
    Executor executor;
    bool exists = false;
    if (!executor_id.empty()) {
      absl::StatusOr<Executor> loaded = LoadExecutor(c, executor_id);
      if (loaded.ok()) {
        executor = std::move(*loaded);
        exists = true;
      } else if (!absl::IsNotFound(loaded.status())) {
        return loaded.status();
      } else {
        executor.id = executor_id;  // known to the executor, not (or no longer) to this store
      }
    }
    if (!exists) executor.registered_at = now;
    // A (re)started executor starts afresh: available, no drain pending (a drained executor that
    // is started again is back in service), leases of its previous life left to expire.
    executor.info = info;
    executor.state = ExecutorState::kAvailable;
    executor.state_reason.clear();
    executor.last_heartbeat_at = now;
    executor.drain_requested = false;
    if (exists || !executor.id.empty()) {
      RETURN_IF_ERROR(SaveExecutor(c, executor, /*insert=*/!exists));
      return executor;
    }
    for (int tries = 0;; ++tries) {
      executor.id = NewId("exe-");
      absl::Status inserted = SaveExecutor(c, executor, /*insert=*/true);
      if (inserted.ok()) return executor;
      if (!absl::IsAlreadyExists(inserted) || tries == 3) return inserted;
    }
  });
}

absl::StatusOr<Executor> PostgresMetadataStore::GetExecutor(const std::string& executor_id) {
  return InTransaction(false, [&](Connection& c) { return LoadExecutor(c, executor_id); });
}

absl::StatusOr<std::vector<Executor>> PostgresMetadataStore::ListExecutors() {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::vector<Executor>> {
    ASSIGN_OR_RETURN(PgResult result, c.Exec(kListExecutors));
    std::vector<Executor> executors;
    for (int i = 0; i < result.Rows(); ++i) {
      ASSIGN_OR_RETURN(Executor executor, ReadExecutorRow(Row{result, i}));
      executors.push_back(std::move(executor));
    }
    return executors;
  });
}

absl::StatusOr<HeartbeatReply> PostgresMetadataStore::Heartbeat(const std::string& executor_id, ExecutorState state,
                                                                const std::string& reason,
                                                                const std::vector<LeaseProgress>& held,
                                                                absl::Duration ttl, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<HeartbeatReply> {
    HeartbeatReply reply;
    absl::StatusOr<Executor> loaded = LoadExecutor(c, executor_id);
    if (absl::IsNotFound(loaded.status())) {
      // Its leases are left alone: it registers again (same id) and heartbeats them then.
      reply.unknown_executor = true;
      return reply;
    }
    RETURN_IF_ERROR(loaded.status());
    Executor& executor = *loaded;
    // Alive again if it was lost; in whatever state it reports, except that a drain asked for
    // stays visible until the executor itself reports draining.
    executor.last_heartbeat_at = now;
    executor.state = state;
    executor.state_reason = reason;
    if (executor.drain_requested && (state == ExecutorState::kAvailable || state == ExecutorState::kBusy)) {
      executor.state = ExecutorState::kDraining;
      if (executor.state_reason.empty()) executor.state_reason = "drain requested";
    }
    for (const LeaseProgress& progress : held) {
      absl::StatusOr<Task> task = LoadTask(c, progress.job_id, progress.task_index);
      if (absl::IsNotFound(task.status())) {
        reply.cancel.push_back(progress);
        continue;
      }
      RETURN_IF_ERROR(task.status());
      if (!CheckFence(*task, executor_id, progress.attempt).ok()) {
        reply.cancel.push_back(progress);  // cancelled, expired and requeued, or someone else's
        continue;
      }
      if (absl::Status chunks = RenewLease(*task, progress, ttl, now); !chunks.ok()) {
        // The lease is renewed all the same; the completion will be refused with this message.
        task->last_error = std::string(chunks.message());
      }
      RETURN_IF_ERROR(SaveTask(c, *task));
      reply.renewed.push_back(progress);
    }
    reply.drain = executor.drain_requested;
    RETURN_IF_ERROR(SaveExecutor(c, executor));
    return reply;
  });
}

absl::Status PostgresMetadataStore::RequestDrain(const std::string& executor_id, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::Status {
    ASSIGN_OR_RETURN(Executor executor, LoadExecutor(c, executor_id));
    executor.drain_requested = true;
    if (executor.state != ExecutorState::kLost) {
      executor.state = ExecutorState::kDraining;
      executor.state_reason = "drain requested";
    }
    return SaveExecutor(c, executor);
  });
}

// --- leasing ---

absl::StatusOr<std::vector<Lease>> PostgresMetadataStore::LeaseTasks(const std::string& executor_id, int max_tasks,
                                                                     absl::Duration ttl, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<std::vector<Lease>> {
    std::vector<Lease> leases;
    ASSIGN_OR_RETURN(Executor executor, LoadExecutor(c, executor_id));
    if (max_tasks <= 0 || executor.state == ExecutorState::kLost || executor.state == ExecutorState::kDraining ||
        executor.drain_requested) {
      return leases;
    }
    std::vector<std::string> runners = executor.info.runners;
    if (runners.empty()) runners.push_back(kDefaultRunner);

    std::vector<std::pair<std::string, int64_t>> candidates;
    {
      ASSIGN_OR_RETURN(PgResult result, c.Exec(kLeaseCandidates, Params()
                                                                     .Text(Name(TaskStateName(TaskState::kPending)))
                                                                     .Time(now)
                                                                     .Text(Name(JobStateName(JobState::kQueued)))
                                                                     .Text(Name(JobStateName(JobState::kRunning)))
                                                                     .Int(executor.info.memory_bytes)
                                                                     .Text(DumpJson(Json(runners)))
                                                                     .Int(max_tasks)));
      for (int i = 0; i < result.Rows(); ++i) candidates.emplace_back(result.Text(i, 0), result.Int(i, 1));
    }

    // The candidates' jobs (their model and options go into the leases).
    std::map<std::string, Job> jobs;
    for (const auto& candidate : candidates) jobs.emplace(candidate.first, Job{});
    for (auto& [job_id, job] : jobs) {
      // Read without a row lock: every lease of a job would queue on its row otherwise. Only a
      // job that starts with this lease is locked and written, below.
      ASSIGN_OR_RETURN(PgResult result, c.Exec(kSelectJob, Params().Text(job_id)));
      if (result.Rows() == 0) return absl::NotFoundError(absl::StrCat("no job ", job_id));
      ASSIGN_OR_RETURN(job, ReadJobRow(Row{result, 0}));
    }
    for (const auto& [job_id, index] : candidates) {
      const Job& job = jobs.at(job_id);
      ASSIGN_OR_RETURN(Task task, LoadTask(c, job_id, index));
      RETURN_IF_ERROR(GrantTask(task, executor_id, ttl, now));
      RETURN_IF_ERROR(SaveTask(c, task));
      Lease lease;
      lease.expires_at = *task.lease_expires_at;
      lease.task = std::move(task);
      lease.job_model = job.spec.model;
      lease.runner_options = job.spec.runner_options;
      lease.input_key = job.spec.input_key;
      leases.push_back(std::move(lease));
    }
    for (auto& [job_id, job] : jobs) {
      if (job.state != JobState::kQueued && job.started_at) continue;  // already running
      // Starting it: now lock it (jobs in id order, after their tasks: the store's lock order).
      ASSIGN_OR_RETURN(job, LoadJob(c, job_id));
      if (MarkJobStarted(job, now)) RETURN_IF_ERROR(SaveJob(c, job));
    }
    // An executor that is already busy stays as it is: no write, no contention on its row.
    if (!leases.empty() && (executor.state != ExecutorState::kBusy || !executor.state_reason.empty())) {
      executor.state = ExecutorState::kBusy;
      executor.state_reason.clear();
      RETURN_IF_ERROR(SaveExecutor(c, executor));
    }
    return leases;
  });
}

template <typename Transition>
absl::StatusOr<Task> PostgresMetadataStore::FinishAttempt(Connection& c, const std::string& executor_id,
                                                          const std::string& job_id, int64_t task_index, int attempt,
                                                          Transition&& transition, absl::Time now) {
  RETURN_IF_ERROR(LoadExecutor(c, executor_id).status());
  // The task is locked before its job (the store's lock order); an unknown job is still "no job".
  absl::StatusOr<Task> loaded = LoadTask(c, job_id, task_index);
  ASSIGN_OR_RETURN(Job job, LoadJob(c, job_id));
  ASSIGN_OR_RETURN(Task task, std::move(loaded));
  RETURN_IF_ERROR(CheckFence(task, executor_id, attempt));
  RETURN_IF_ERROR(transition(task, job));
  RETURN_IF_ERROR(SaveTask(c, task));
  if (IsTerminal(task.state)) {
    AccountTerminalTask(job, task, now);
    RETURN_IF_ERROR(SaveJob(c, job));
  }
  return task;
}

absl::StatusOr<Task> PostgresMetadataStore::CompleteTask(const std::string& executor_id, const std::string& job_id,
                                                         int64_t task_index, int attempt, int64_t records_done,
                                                         int64_t records_failed, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Task> {
    ASSIGN_OR_RETURN(
        Task task,
        FinishAttempt(
            c, executor_id, job_id, task_index, attempt,
            [&](Task& t, const Job&) { return ::minions::CompleteTask(t, records_done, records_failed, now); }, now));
    ASSIGN_OR_RETURN(Executor executor, LoadExecutor(c, executor_id));
    executor.records_done += task.records_done;
    RETURN_IF_ERROR(SaveExecutor(c, executor));
    return task;
  });
}

absl::StatusOr<std::vector<absl::Status>> PostgresMetadataStore::CompleteTasks(
    const std::string& executor_id, const std::vector<LeaseProgress>& reports, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<std::vector<absl::Status>> {
    ASSIGN_OR_RETURN(Executor executor, LoadExecutor(c, executor_id));
    // The reported tasks are locked first, in key order, then their jobs, in id order (the
    // store's lock order). Jobs are loaded once and saved once, however many of their tasks
    // complete here.
    std::map<std::pair<std::string, int64_t>, absl::StatusOr<Task>> tasks;
    for (const LeaseProgress& report : reports) {
      tasks.emplace(std::make_pair(report.job_id, report.task_index), absl::UnknownError(""));
    }
    for (auto& [key, task] : tasks) task = LoadTask(c, key.first, key.second);
    std::map<std::string, absl::StatusOr<Job>> jobs;
    for (const LeaseProgress& report : reports) jobs.emplace(report.job_id, absl::UnknownError(""));
    for (auto& [job_id, job] : jobs) job = LoadJob(c, job_id);
    std::vector<absl::Status> outcomes;
    for (const LeaseProgress& report : reports) {
      absl::StatusOr<Job>& job = jobs.at(report.job_id);
      if (!job.ok()) {
        outcomes.push_back(job.status());
        continue;
      }
      absl::StatusOr<Task>& task = tasks.at(std::make_pair(report.job_id, report.task_index));
      if (!task.ok()) {
        outcomes.push_back(task.status());
        continue;
      }
      Task updated = *task;  // as reloaded: a refused report leaves the row as it is
      absl::Status fence = CheckFence(updated, executor_id, report.attempt);
      if (fence.ok()) fence = ::minions::CompleteTask(updated, report, now);
      if (!fence.ok()) {
        outcomes.push_back(fence);
        continue;
      }
      RETURN_IF_ERROR(SaveTask(c, updated));
      *task = updated;
      AccountTerminalTask(*job, updated, now);
      executor.records_done += updated.records_done;
      outcomes.push_back(absl::OkStatus());
    }
    for (auto& [id, job] : jobs) {
      if (job.ok()) RETURN_IF_ERROR(SaveJob(c, *job));
    }
    RETURN_IF_ERROR(SaveExecutor(c, executor));
    return outcomes;
  });
}

absl::StatusOr<Task> PostgresMetadataStore::FailTask(const std::string& executor_id, const std::string& job_id,
                                                     int64_t task_index, int attempt, FailureClass failure,
                                                     const std::string& message, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Task> {
    return FinishAttempt(
        c, executor_id, job_id, task_index, attempt,
        [&](Task& t, const Job& job) {
          return ::minions::FailTask(t, failure, message, job.spec.max_attempts, options_.retry, now);
        },
        now);
  });
}

// --- watchdog ---

absl::StatusOr<std::vector<Task>> PostgresMetadataStore::ExpireLeases(absl::Time now, int limit) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<std::vector<Task>> {
    std::vector<std::pair<std::string, int64_t>> expired;
    {
      ASSIGN_OR_RETURN(
          PgResult result,
          c.Exec(kExpiredLeases, Params().Text(Name(TaskStateName(TaskState::kRunning))).Time(now).Limit(limit)));
      for (int i = 0; i < result.Rows(); ++i) expired.emplace_back(result.Text(i, 0), result.Int(i, 1));
    }
    // Their jobs, locked in id order.
    std::map<std::string, Job> jobs;
    for (const auto& task : expired) jobs.emplace(task.first, Job{});
    for (auto& [job_id, job] : jobs) {
      ASSIGN_OR_RETURN(job, LoadJob(c, job_id));
    }
    std::set<std::string> accounted;  // jobs to save
    std::vector<Task> tasks;
    for (const auto& [job_id, index] : expired) {
      Job& job = jobs.at(job_id);
      ASSIGN_OR_RETURN(Task task, LoadTask(c, job_id, index));
      RETURN_IF_ERROR(ExpireLease(task, job.spec.max_attempts, options_.retry, now));
      RETURN_IF_ERROR(SaveTask(c, task));
      if (IsTerminal(task.state)) {
        AccountTerminalTask(job, task, now);
        accounted.insert(job_id);
      }
      tasks.push_back(std::move(task));
    }
    for (const std::string& job_id : accounted) RETURN_IF_ERROR(SaveJob(c, jobs.at(job_id)));
    return tasks;
  });
}

absl::StatusOr<std::vector<Executor>> PostgresMetadataStore::MarkLostExecutors(absl::Time cutoff, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<std::vector<Executor>> {
    std::vector<std::string> ids;
    {
      ASSIGN_OR_RETURN(
          PgResult result,
          c.Exec(kSilentExecutors, Params().Text(Name(ExecutorStateName(ExecutorState::kLost))).Time(cutoff)));
      for (int i = 0; i < result.Rows(); ++i) ids.push_back(result.Text(i, 0));
    }
    std::vector<Executor> lost;
    for (const std::string& id : ids) {
      ASSIGN_OR_RETURN(Executor executor, LoadExecutor(c, id));
      executor.state = ExecutorState::kLost;
      executor.state_reason = absl::StrCat("no heartbeat since ", absl::FormatTime(executor.last_heartbeat_at));
      RETURN_IF_ERROR(SaveExecutor(c, executor));
      lost.push_back(std::move(executor));
    }
    return lost;
  });
}

// --- the watchdog lock ---

absl::StatusOr<std::unique_ptr<PostgresWatchdogLock>> PostgresWatchdogLock::TryAcquire(const std::string& conninfo) {
  RETURN_IF_ERROR(CheckConninfo(conninfo));
  auto connection = std::make_unique<Connection>(conninfo);
  RETURN_IF_ERROR(connection->EnsureConnected());
  ASSIGN_OR_RETURN(PgResult got, connection->Exec("SELECT pg_try_advisory_lock($1)", Params().Int(kLockKey)));
  if (!got.Bool(0, 0)) {
    return absl::UnavailableError(
        absl::StrCat("another watchdog holds the PostgreSQL advisory lock ", kLockKey, " on this database"));
  }
  return std::unique_ptr<PostgresWatchdogLock>(new PostgresWatchdogLock(std::move(connection)));
}

PostgresWatchdogLock::PostgresWatchdogLock(std::unique_ptr<Connection> connection)
    : connection_(std::move(connection)) {}

PostgresWatchdogLock::~PostgresWatchdogLock() {
  absl::MutexLock lock(&mu_);
  // Unlocking first makes the release immediate (closing alone releases it once the server has
  // noticed); a dead process gets the second.
  if (!connection_->Broken()) (void)connection_->Exec("SELECT pg_advisory_unlock($1)", Params().Int(kLockKey));
  connection_->Close();
}

absl::Status PostgresWatchdogLock::Check() {
  absl::MutexLock lock(&mu_);
  // The session is the lock: the connection never reconnects by itself, so a live connection
  // still holds it.
  absl::StatusOr<PgResult> alive = connection_->Exec("SELECT 1");
  if (!alive.ok() || connection_->Broken()) {
    return absl::UnavailableError(absl::StrCat("the watchdog lock was lost with its connection: ",
                                               alive.ok() ? "connection broken" : alive.status().message()));
  }
  return absl::OkStatus();
}

}  // namespace minions
