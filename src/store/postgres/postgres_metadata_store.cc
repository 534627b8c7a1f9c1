#include "store/postgres/postgres_metadata_store.h"

#include <libpq-fe.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "model/json_codec.h"
#include "store/common/store_rows.h"
#include "store/common/store_rules.h"
#include "store/postgres/postgres_migrations.h"

namespace minions {
namespace {

// How long a method keeps retrying a transaction the server broke off (a restart, a failover, a
// deadlock victim) before it answers Unavailable.
constexpr absl::Duration kRetryWindow = absl::Seconds(30);
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(20);
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);

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
  Params& Value(const store_rows::Value& value) {
    if (const int64_t* number = std::get_if<int64_t>(&value)) return Int(*number);
    if (const std::string* text = std::get_if<std::string>(&value)) return Text(*text);
    return Null();
  }
  // One row's values, as $n, $n+1, ...
  Params& Values(const store_rows::Values& values) {
    for (const store_rows::Value& value : values) Value(value);
    return *this;
  }
  // Rows of `columns` values each, as one array parameter per column (for unnest(...)).
  Params& Columns(const std::vector<store_rows::Values>& rows, int columns) {
    for (int column = 0; column < columns; ++column) {
      std::string array = "{";
      for (size_t row = 0; row < rows.size(); ++row) {
        if (row > 0) array += ',';
        const store_rows::Value& value = rows[row][column];
        if (const int64_t* number = std::get_if<int64_t>(&value)) {
          absl::StrAppend(&array, *number);
        } else if (const std::string* text = std::get_if<std::string>(&value)) {
          array += '"';
          for (char ch : *text) {
            if (ch == '"' || ch == '\\') array += '\\';
            array += ch;
          }
          array += '"';
        } else {
          array += "NULL";
        }
      }
      array += '}';
      Text(std::move(array));
    }
    return *this;
  }
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
  const PGresult* get() const { return result_; }
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
    // The store's statements are planned once per session: left to choose, PostgreSQL plans
    // those that take arrays again on every call (their generic plan looks dearer than a plan
    // for one element), which costs more than running them. Their generic plans are index
    // lookups per key (docs/benchmarks.md).
    PGresult* set = PQexec(conn_, "SET plan_cache_mode = force_generic_plan");
    const bool ok = set != nullptr && PQresultStatus(set) == PGRES_COMMAND_OK;
    std::string message = ok ? "" : TrimNewlines(PQerrorMessage(conn_));
    PQclear(set);
    if (!ok) {
      Close();
      return absl::UnavailableError(absl::StrCat("cannot set up a PostgreSQL session: ", message));
    }
    return absl::OkStatus();
  }

  void Close() {
    if (conn_ != nullptr) PQfinish(conn_);
    conn_ = nullptr;
    prepared_.clear();  // prepared statements live and die with their session
    next_statement_ = 0;
  }
  bool Broken() const { return conn_ == nullptr || PQstatus(conn_) != CONNECTION_OK; }

  // One statement with $n parameters (extended protocol). The first statement of a transaction
  // goes out together with its BEGIN (see StartTransaction).
  absl::StatusOr<PgResult> Exec(const char* sql, const Params& params = Params()) {
    if (conn_ == nullptr) return Fail(nullptr, sql);
    std::vector<const char*> values;
    values.reserve(params.values().size());
    for (const std::optional<std::string>& value : params.values()) {
      values.push_back(value ? value->c_str() : nullptr);
    }
    const int n = static_cast<int>(values.size());
    // Each statement is parsed and planned once per connection, then only executed: the store's
    // statements are a fixed set of constants, run thousands of times a second under load.
    auto it = prepared_.find(sql);
    if (begin_pending_) return BeginWith(sql, params);
    if (it == prepared_.end()) {
      std::string name = absl::StrCat("minions_", next_statement_++);
      auto prepared = Check(PQprepare(conn_, name.c_str(), sql, n, nullptr), sql);
      if (!prepared.ok()) return prepared.status();
      it = prepared_.emplace(sql, std::move(name)).first;
    }
    return Check(PQexecPrepared(conn_, it->second.c_str(), n, values.data(), nullptr, nullptr, 0), sql);
  }
  // Constant text of one or more statements, no parameters (simple protocol); the last result.
  absl::StatusOr<PgResult> ExecScript(const char* sql) {
    if (conn_ == nullptr) return Fail(nullptr, sql);
    if (begin_pending_) {
      begin_pending_ = false;
      absl::StatusOr<PgResult> begun = Check(PQexec(conn_, for_update_ ? "BEGIN; SELECT txid_current()" : "BEGIN"), sql);
      if (!begun.ok()) return begun.status();
      if (for_update_) xid_ = begun->Int(0, 0);
    }
    return Check(PQexec(conn_, sql), sql);
  }
  // Ends the current transaction, if any, ignoring errors (they are already recorded).
  void Rollback() {
    if (conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK && PQtransactionStatus(conn_) != PQTRANS_IDLE) {
      PQclear(PQexec(conn_, "ROLLBACK"));
    }
  }

  // Per transaction.
  // Starts a transaction. BEGIN is not sent yet: it goes out with the first statement, in one
  // round trip (libpq's pipeline mode), and a writing transaction also takes its id then, so that
  // a COMMIT whose answer is lost can be looked up afterwards instead of being run twice.
  void StartTransaction(bool write, CommitFault fault = CommitFault::kNone) {
    first_error_ = absl::OkStatus();
    retryable_ = false;
    for_update_ = write;
    begin_pending_ = true;
    xid_ = 0;
    after_commit_sql_ = nullptr;
    after_commit_use_ = nullptr;
    commit_state_ = CommitState::kNotSent;
    fault_ = fault;
  }
  // True while the transaction has sent nothing (there is nothing to commit).
  bool begin_pending() const { return begin_pending_; }
  // The id of the current writing transaction (0 before its first statement).
  int64_t xid() const { return xid_; }

  // Set by a transaction's body: a statement to run right after its COMMIT (sent together with
  // it, so in the same round trip), and what to do with the answer. Nothing happens to it when
  // the COMMIT fails or its answer is lost.
  void AfterCommit(const char* sql, Params params, std::function<void(const PgResult&)> use) {
    after_commit_sql_ = sql;
    after_commit_params_ = std::move(params);
    after_commit_use_ = std::move(use);
  }
  // When a COMMIT's answer was lost: the after-commit statement, taken to run (RunAfterCommit)
  // once it is known that the transaction committed.
  struct AfterCommitStep {
    const char* sql = nullptr;
    Params params;
    std::function<void(const PgResult&)> use;
  };
  AfterCommitStep TakeAfterCommit() {
    AfterCommitStep step{after_commit_sql_, std::move(after_commit_params_), std::move(after_commit_use_)};
    after_commit_sql_ = nullptr;
    after_commit_use_ = nullptr;
    return step;
  }
  void RunAfterCommit(const AfterCommitStep& step) {
    if (step.sql == nullptr || Broken()) return;
    begin_pending_ = false;  // on its own, outside any transaction
    absl::StatusOr<PgResult> answer = Exec(step.sql, step.params);
    if (answer.ok()) step.use(*answer);
  }

  // Whether the transaction's COMMIT went out (ExecAndCommit sends it with the last statement).
  enum class CommitState { kNotSent, kCommitted, kAnswerLost };
  CommitState commit_state() const { return commit_state_; }

  // COMMIT, and the after-commit statement if there is one. The answer is COMMIT's.
  absl::StatusOr<PgResult> Commit() {
    if (fault_ == CommitFault::kConnectionLostBeforeCommit) Close();
    if (conn_ == nullptr) return Fail(nullptr, "COMMIT");
    if (after_commit_sql_ == nullptr && fault_ == CommitFault::kNone) return ExecScript("COMMIT");
    std::vector<Step> steps = {{"COMMIT"}};
    if (after_commit_sql_ != nullptr) steps.push_back({after_commit_sql_, &after_commit_params_});
    std::vector<PGresult*> results = Pipeline(steps, fault_ == CommitFault::kAnswerLost);
    absl::StatusOr<PgResult> committed = Answer(results[0], "COMMIT");
    if (results.size() > 1 && results[1] != nullptr) UseAfterCommit(committed.ok(), PgResult(results[1]));
    return committed;
  }

  // The transaction's last statement, sent with its COMMIT (and the after-commit statement) in
  // one round trip; the answer to the statement is not kept. An error is the statement's or the
  // COMMIT's (the transaction did not commit); when the answers were lost, commit_state() says so
  // and the caller must find out whether it committed.
  absl::Status ExecAndCommit(const char* sql, const Params& params) {
    if (begin_pending_) {  // nothing before it: BEGIN goes with the statement, COMMIT after
      RETURN_IF_ERROR(Exec(sql, params).status());
      RETURN_IF_ERROR(Commit().status());
      commit_state_ = CommitState::kCommitted;
      return absl::OkStatus();
    }
    if (fault_ == CommitFault::kConnectionLostBeforeCommit) Close();
    if (conn_ == nullptr) return Fail(nullptr, sql);
    std::vector<Step> steps = {{sql, &params}, {"COMMIT"}};
    if (after_commit_sql_ != nullptr) steps.push_back({after_commit_sql_, &after_commit_params_});
    std::vector<PGresult*> results = Pipeline(steps, fault_ == CommitFault::kAnswerLost);
    absl::Status outcome;
    if (results[0] != nullptr && results[1] != nullptr) {
      outcome = Answer(results[0], sql).status();
      absl::StatusOr<PgResult> committed = Answer(results[1], "COMMIT");
      if (outcome.ok()) outcome = committed.status();
      if (outcome.ok()) commit_state_ = CommitState::kCommitted;
    } else if (results[0] != nullptr && PQresultStatus(results[0]) == PGRES_FATAL_ERROR) {
      outcome = Fail(results[0], sql);  // refused: what followed it did not run
      if (results[1] != nullptr) PQclear(results[1]);
    } else {
      if (results[0] != nullptr) PQclear(results[0]);
      if (results[1] != nullptr) PQclear(results[1]);
      commit_state_ = CommitState::kAnswerLost;
    }
    if (results.size() > 2 && results[2] != nullptr) {
      UseAfterCommit(commit_state_ == CommitState::kCommitted, PgResult(results[2]));
    }
    return outcome;
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
    } else if (!lost_message_.empty()) {
      message = lost_message_;
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

  // A pipeline step's answer as Exec gives it (nullptr: none came, the connection broke).
  absl::StatusOr<PgResult> Answer(PGresult* result, const char* sql) {
    if (result == nullptr) return Fail(nullptr, sql);
    return Check(result, sql);
  }
  void UseAfterCommit(bool committed, const PgResult& answer) {
    const ExecStatusType status = PQresultStatus(answer.get());
    if (committed && (status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK)) after_commit_use_(answer);
  }

  // One statement of a pipeline: constant text, with `params` (a prepared statement) or without
  // (sent as is).
  struct Step {
    const char* sql;
    const Params* params = nullptr;
  };

  // Sends `steps` and a sync at once (libpq's pipeline mode) and reads their answers, in order:
  // one result per step, nullptr for a step that got none (the connection broke). New prepared
  // statements are prepared on the way; a failed PREPARE is its step's answer.
  // With `hang_up` (tests: an answer lost on the way) it closes the connection once all is sent,
  // without reading anything.
  std::vector<PGresult*> Pipeline(const std::vector<Step>& steps, bool hang_up = false) {
    std::vector<PGresult*> results(steps.size(), nullptr);
    std::vector<int> kinds;  // per answer expected: the step's index, or -1 - index for its PREPARE
    std::vector<std::string> new_names(steps.size());
    bool sent = PQenterPipelineMode(conn_) == 1;
    for (size_t i = 0; sent && i < steps.size(); ++i) {
      const Step& step = steps[i];
      if (step.params == nullptr) {
        sent = PQsendQueryParams(conn_, step.sql, 0, nullptr, nullptr, nullptr, nullptr, 0) == 1;
        kinds.push_back(static_cast<int>(i));
        continue;
      }
      std::vector<const char*> values;
      for (const std::optional<std::string>& value : step.params->values()) {
        values.push_back(value ? value->c_str() : nullptr);
      }
      const int n = static_cast<int>(values.size());
      auto it = prepared_.find(step.sql);
      std::string name;
      if (it == prepared_.end()) {
        name = absl::StrCat("minions_", next_statement_++);
        new_names[i] = name;
        sent = PQsendPrepare(conn_, name.c_str(), step.sql, n, nullptr) == 1;
        kinds.push_back(-1 - static_cast<int>(i));
      } else {
        name = it->second;
      }
      sent = sent && PQsendQueryPrepared(conn_, name.c_str(), n, values.data(), nullptr, nullptr, 0) == 1;
      kinds.push_back(static_cast<int>(i));
    }
    sent = sent && PQpipelineSync(conn_) == 1;
    if (hang_up) {
      while (sent && PQflush(conn_) == 1) {
      }
      sent = false;
    }
    size_t answer = 0;
    bool synced = false;
    while (sent && !synced) {
      PGresult* result = PQgetResult(conn_);
      if (result == nullptr) {  // between two answers; only that, forever, when broken
        if (Broken() || answer > kinds.size()) break;
        continue;
      }
      if (PQresultStatus(result) == PGRES_PIPELINE_SYNC) {
        synced = true;
        PQclear(result);
        break;
      }
      if (answer >= kinds.size()) {
        PQclear(result);
        continue;
      }
      const int kind = kinds[answer++];
      const size_t step = kind >= 0 ? kind : -1 - kind;
      const ExecStatusType status = PQresultStatus(result);
      if (kind < 0 && (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK)) {
        PQclear(result);  // prepared; the statement's own answer follows
        continue;
      }
      if (results[step] == nullptr) {
        results[step] = result;  // a failed PREPARE's answer stands for its statement's
      } else {
        PQclear(result);
      }
    }
    if (synced) {
      PQexitPipelineMode(conn_);
      for (size_t i = 0; i < steps.size(); ++i) {
        if (new_names[i].empty() || results[i] == nullptr) continue;
        const ExecStatusType status = PQresultStatus(results[i]);
        if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) prepared_.emplace(steps[i].sql, new_names[i]);
      }
    } else {
      // A pipeline that could not be finished leaves the session unusable.
      for (PGresult*& result : results) {
        if (result != nullptr) PQclear(result);
        result = nullptr;
      }
      lost_message_ = conn_ != nullptr ? TrimNewlines(PQerrorMessage(conn_)) : "";
      Close();
    }
    return results;
  }

  // BEGIN, the transaction id (writing transactions) and the transaction's first statement.
  absl::StatusOr<PgResult> BeginWith(const char* sql, const Params& params) {
    begin_pending_ = false;
    std::vector<Step> steps = {{"BEGIN"}};
    if (for_update_) steps.push_back({"SELECT txid_current()"});
    steps.push_back({sql, &params});
    std::vector<PGresult*> results = Pipeline(steps);
    // The first failure is the transaction's; answers after it are "aborted" and say nothing.
    absl::Status failed;
    for (size_t i = 0; i < results.size(); ++i) {
      PGresult* result = std::exchange(results[i], nullptr);
      const ExecStatusType status = result != nullptr ? PQresultStatus(result) : PGRES_FATAL_ERROR;
      if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
        if (failed.ok()) {
          failed = Fail(result, sql);
        } else if (result != nullptr) {
          PQclear(result);
        }
        continue;
      }
      if (i + 1 == results.size() && failed.ok()) return PgResult(result);
      if (for_update_ && i == 1) xid_ = std::strtoll(PQgetvalue(result, 0, 0), nullptr, 10);
      PQclear(result);
    }
    return failed;
  }

  const std::string conninfo_;
  PGconn* conn_ = nullptr;
  std::map<std::string, std::string> prepared_;  // statement text -> prepared name, this session
  absl::Status first_error_;
  bool retryable_ = false;
  bool for_update_ = false;
  bool begin_pending_ = false;
  int64_t xid_ = 0;
  std::string lost_message_;  // why the last unfinished pipeline failed
  int next_statement_ = 0;    // names prepared statements
  const char* after_commit_sql_ = nullptr;
  Params after_commit_params_;
  std::function<void(const PgResult&)> after_commit_use_;
  CommitState commit_state_ = CommitState::kNotSent;
  CommitFault fault_ = CommitFault::kNone;
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
namespace rows = store_rows;
namespace rules = store_rules;

// --- SQL. Every statement is constant text with $n parameters; values are always bound. Rows are
// written with the parameters in the order of store/common/store_rows.h's column lists. ---

// A job's counts are the sums of its counter shards (job_counts, see postgres_migrations.cc); the
// jobs row's own count columns stay zero. Columns as MINIONS_STORE_JOB_COLUMNS.
#define MINIONS_PG_SELECT_JOBS                                                                                    \
  "SELECT j.id, j.team, j.state, j.spec, j.total_records, COALESCE(c.completed, 0), COALESCE(c.failed, 0), "      \
  "j.n_tasks, COALESCE(c.done, 0), COALESCE(c.succeeded, 0), j.error, j.output_key, j.errors_key, "               \
  "j.manifest_key, j.created_at, GREATEST(j.updated_at, c.updated_at), j.started_at, j.finished_at FROM jobs j " \
  "LEFT JOIN LATERAL (SELECT SUM(completed_records)::bigint AS completed, SUM(failed_records)::bigint AS failed, " \
  "SUM(tasks_done)::bigint AS done, SUM(tasks_succeeded)::bigint AS succeeded, MAX(updated_at) AS updated_at "    \
  "FROM job_counts WHERE job_id = j.id) c ON true "
constexpr char kSelectJob[] = MINIONS_PG_SELECT_JOBS "WHERE j.id = $1";
constexpr char kSelectJobForUpdate[] = MINIONS_PG_SELECT_JOBS "WHERE j.id = $1 FOR UPDATE OF j";
constexpr char kListJobs[] = MINIONS_PG_SELECT_JOBS
    "WHERE ($1::text IS NULL OR j.state = $1::text) AND ($2::text = '' OR j.team = $2::text) "
    "ORDER BY j.created_at DESC, j.id DESC LIMIT $3::bigint";
constexpr char kJobsInState[] = MINIONS_PG_SELECT_JOBS "WHERE j.state = $1 ORDER BY j.created_at, j.id LIMIT $2::bigint";
// Jobs not yet settled whose tasks have all ended (their last completers ran at once and none saw
// the others' counts): JobsToFinalize settles them.
constexpr char kUnsettledJobs[] =
    "SELECT j.id FROM jobs j WHERE j.state IN ($1, $2) AND j.n_tasks > 0 "
    "AND j.n_tasks <= (SELECT COALESCE(SUM(tasks_done), 0) FROM job_counts WHERE job_id = j.id)";
constexpr char kLastFailure[] =
    "SELECT last_error FROM tasks WHERE job_id = $1 AND state = $2 ORDER BY finished_at DESC NULLS LAST, idx DESC "
    "LIMIT 1";
// Parameters: rows::JobValues.
constexpr char kInsertJob[] = "INSERT INTO jobs (" MINIONS_STORE_JOB_WRITE_COLUMNS
                              ") VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, "
                              "$16, $17) ON CONFLICT (id) DO NOTHING";
constexpr char kUpdateJob[] =
    "UPDATE jobs SET team = $2, state = $3, spec = $4::jsonb, priority = $5, min_memory_bytes = $6, runner = $7, "
    "total_records = $8, n_tasks = $9, error = $10, output_key = $11, errors_key = $12, manifest_key = $13, "
    "created_at = $14, updated_at = $15, started_at = $16, finished_at = $17 WHERE id = $1";

// Tasks, many at a time: one array parameter per column of MINIONS_STORE_TASK_COLUMNS.
#define MINIONS_PG_TASK_ARRAYS                                                                                  \
  "unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::text[], "       \
  "$8::int[], $9::int[], $10::int[], $11::text[], $12::bigint[], $13::bigint[], $14::bigint[], $15::bigint[], " \
  "$16::text[], $17::bigint[], $18::bigint[], $19::jsonb[], $20::jsonb[])"
#define MINIONS_PG_UPDATE_TASKS                                                                                  \
  "UPDATE tasks SET first_record = u.first_record, n_records = u.n_records, byte_begin = u.byte_begin, "          \
  "byte_end = u.byte_end, state = u.state, attempt = u.attempt, failures = u.failures, preemptions = "             \
  "u.preemptions, executor_id = u.executor_id, lease_expires_at = u.lease_expires_at, not_before = u.not_before, " \
  "records_done = u.records_done, records_failed = u.records_failed, last_error = u.last_error, started_at = "     \
  "u.started_at, finished_at = u.finished_at, chunks = u.chunks, shadow = u.shadow FROM " MINIONS_PG_TASK_ARRAYS                                         \
  " AS u(" MINIONS_STORE_TASK_COLUMNS ") WHERE tasks.job_id = u.job_id AND tasks.idx = u.idx"
constexpr char kInsertTasks[] = "INSERT INTO tasks (" MINIONS_STORE_TASK_COLUMNS ") SELECT * FROM " MINIONS_PG_TASK_ARRAYS
                                " ON CONFLICT (job_id, idx) DO NOTHING";
constexpr char kUpdateTasks[] = MINIONS_PG_UPDATE_TASKS;
// Tasks by key ($1 job ids, $2 indexes), in key order (the order they are locked in).
// (A lateral join: one index probe per key, whatever the planner guesses unnest's size to be.)
#define MINIONS_PG_SELECT_TASKS(LOCK)                                                                        \
  "SELECT t.* FROM (SELECT DISTINCT * FROM unnest($1::text[], $2::bigint[]) ORDER BY 1, 2) k(job_id, idx) " \
  "CROSS JOIN LATERAL (SELECT " MINIONS_STORE_TASK_COLUMNS " FROM tasks WHERE job_id = k.job_id AND "       \
  "idx = k.idx" LOCK ") t"
constexpr char kSelectTasks[] = MINIONS_PG_SELECT_TASKS("");
constexpr char kSelectTasksForUpdate[] = MINIONS_PG_SELECT_TASKS(" FOR UPDATE");
// Whether executor $3 exists, then (only if it does) the tasks by key, locked: one row with
// NULL task columns when there are none.
constexpr char kExecutorAndTasksForUpdate[] =
    "SELECT e.n, t.* FROM (SELECT COUNT(*) AS n FROM executors WHERE id = $3) e LEFT JOIN LATERAL ("
    MINIONS_PG_SELECT_TASKS(" FOR UPDATE") " WHERE e.n > 0) t ON true";
#define MINIONS_PG_SELECT_TASKS_OF_JOB "SELECT " MINIONS_STORE_TASK_COLUMNS " FROM tasks WHERE job_id = $1 ORDER BY idx"
constexpr char kSelectTasksOfJob[] = MINIONS_PG_SELECT_TASKS_OF_JOB;
constexpr char kSelectTasksOfJobForUpdate[] = MINIONS_PG_SELECT_TASKS_OF_JOB " FOR UPDATE";
constexpr char kRunningTasks[] =
    "SELECT " MINIONS_STORE_TASK_COLUMNS " FROM tasks WHERE state = 'running' ORDER BY executor_id, job_id, idx";
constexpr char kCountTasks[] =
    "SELECT (SELECT COUNT(*) FROM tasks WHERE job_id = $1 AND state = 'pending'), COUNT(*), "
    "COUNT(DISTINCT executor_id) FROM tasks WHERE job_id = $1 AND state = 'running'";

// The end of attempts, in one statement: the tasks as the state machine left them ($1-$20, as
// kUpdateTasks), what they add to their jobs' counts ($21-$27: one counter shard row per job),
// and the records the executor ($29) did ($28). Answers how many tasks it wrote and whether the
// executor exists.
constexpr char kWriteAttempts[] =
    "WITH t AS (" MINIONS_PG_UPDATE_TASKS " RETURNING 1), "
    "c AS (INSERT INTO job_counts (job_id, shard, tasks_done, tasks_succeeded, completed_records, failed_records, "
    "updated_at) SELECT * FROM unnest($21::text[], $22::int[], $23::bigint[], $24::bigint[], $25::bigint[], "
    "$26::bigint[], $27::bigint[]) ON CONFLICT (job_id, shard) DO UPDATE SET "
    "tasks_done = job_counts.tasks_done + EXCLUDED.tasks_done, "
    "tasks_succeeded = job_counts.tasks_succeeded + EXCLUDED.tasks_succeeded, "
    "completed_records = job_counts.completed_records + EXCLUDED.completed_records, "
    "failed_records = job_counts.failed_records + EXCLUDED.failed_records, "
    "updated_at = GREATEST(job_counts.updated_at, EXCLUDED.updated_at)), "
    "e AS (UPDATE executors SET records_done = records_done + $28 WHERE id = $29 RETURNING 1) "
    "SELECT (SELECT COUNT(*) FROM t), (SELECT COUNT(*) FROM e)";
// Which of the jobs $1 have not settled though all their tasks have ended: asked right after
// the COMMIT of a transaction that ended some of their tasks. Of transactions ending a job's last
// tasks at once, none may see the others' counts before it commits; the one that commits last
// sees them all after.
constexpr char kFinishedJobs[] =
    "SELECT j.id FROM jobs j WHERE j.id = ANY($1::text[]) AND j.state IN ($2, $3) "
    "AND j.n_tasks <= (SELECT COALESCE(SUM(tasks_done), 0) FROM job_counts WHERE job_id = j.id)";

// Candidate selection: which pending tasks this executor could run, in grant order, locked
// (tasks another transaction holds are skipped, not waited for), with what the lease needs of
// their job. Runnable jobs in grant order, and for each its pending tasks in index order off the
// partial index (a nested loop keeps the jobs' order), so a lease reads about as many tasks as it
// takes, however many are pending. States the partial indexes name are literals: a generic plan
// can only use a partial index whose predicate the query states as such. Whether a task may
// actually be granted is GrantTask's decision.
constexpr char kLeaseCandidates[] =
    "SELECT t.*, j.spec, j.state, j.started_at IS NOT NULL FROM (SELECT id, spec, state, started_at FROM jobs "
    "WHERE state IN ($2, $3) AND min_memory_bytes <= $4 AND runner IN (SELECT jsonb_array_elements_text($5::jsonb)) "
    "ORDER BY priority DESC, created_at, id) j CROSS JOIN LATERAL (SELECT " MINIONS_STORE_TASK_COLUMNS
    " FROM tasks WHERE job_id = j.id AND state = 'pending' AND (not_before IS NULL OR not_before <= $1) "
    "ORDER BY idx LIMIT $6 FOR UPDATE SKIP LOCKED) t LIMIT $6";
constexpr char kExpiredLeases[] =
    "SELECT " MINIONS_STORE_TASK_COLUMNS " FROM tasks WHERE state = 'running' AND lease_expires_at <= $1 "
    "ORDER BY lease_expires_at, job_id, idx LIMIT $2::bigint FOR UPDATE SKIP LOCKED";

#define MINIONS_PG_SELECT_EXECUTOR "SELECT " MINIONS_STORE_EXECUTOR_COLUMNS " FROM executors WHERE id = $1"
constexpr char kSelectExecutor[] = MINIONS_PG_SELECT_EXECUTOR;
constexpr char kSelectExecutorForUpdate[] = MINIONS_PG_SELECT_EXECUTOR " FOR UPDATE";
constexpr char kListExecutors[] =
    "SELECT " MINIONS_STORE_EXECUTOR_COLUMNS " FROM executors ORDER BY registered_at, id";
// Parameters: rows::ExecutorValues.
constexpr char kInsertExecutor[] = "INSERT INTO executors (" MINIONS_STORE_EXECUTOR_COLUMNS
                                   ") VALUES ($1, $2::jsonb, $3, $4, $5, $6, $7::int::boolean, $8) "
                                   "ON CONFLICT (id) DO NOTHING";
constexpr char kUpdateExecutor[] =
    "UPDATE executors SET info = $2::jsonb, state = $3, state_reason = $4, registered_at = $5, "
    "last_heartbeat_at = $6, drain_requested = $7::int::boolean, records_done = $8 WHERE id = $1";
// A heartbeat being recorded right now (its row locked) is proof of life: skipped.
constexpr char kSilentExecutors[] =
    "SELECT " MINIONS_STORE_EXECUTOR_COLUMNS " FROM executors WHERE state <> $1 AND last_heartbeat_at < $2 "
    "ORDER BY last_heartbeat_at, id FOR UPDATE SKIP LOCKED";

constexpr char kMigrationLock[] = "SELECT pg_advisory_xact_lock($1)";
constexpr char kCreateMigrationsTable[] =
    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
    "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())";
constexpr char kSchemaVersion[] =
    "SELECT COALESCE(MAX(version), 0), current_database(), COALESCE(current_schema(), '') FROM schema_migrations";
constexpr char kRecordMigration[] = "INSERT INTO schema_migrations (version) VALUES ($1)";

constexpr char kTxidStatus[] = "SELECT txid_status($1)";

#undef MINIONS_PG_SELECT_JOBS
#undef MINIONS_PG_TASK_ARRAYS
#undef MINIONS_PG_UPDATE_TASKS
#undef MINIONS_PG_SELECT_TASKS
#undef MINIONS_PG_SELECT_TASKS_OF_JOB
#undef MINIONS_PG_SELECT_EXECUTOR

// Counter shards per job: a completion adds to one at random, so that completers of one job
// rarely wait on each other (16: several times the connections one server pool has).
constexpr int kCounterShards = 16;

int RandomShard() {
  static thread_local std::mt19937 random(std::random_device{}());
  return std::uniform_int_distribution<int>(0, kCounterShards - 1)(random);
}

std::string Name(std::string_view name) { return std::string(name); }

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
      c.Rollback();
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
    c.StartTransaction(write, write ? TakeCommitFault() : CommitFault::kNone);
    Result result = body(c);
    if (c.commit_state() == Connection::CommitState::kCommitted) return result;
    if (c.commit_state() == Connection::CommitState::kAnswerLost) {
      // Its last statement and COMMIT went out together and no answer came back.
      const Connection::AfterCommitStep after = c.TakeAfterCommit();
      absl::StatusOr<bool> was_committed = WasCommitted(c, c.xid(), deadline);
      if (!was_committed.ok()) return Result(was_committed.status());
      if (*was_committed) {
        c.RunAfterCommit(after);
        return result;
      }
      last_error = absl::UnavailableError("the connection broke before a COMMIT was answered");
      continue;  // it rolled back: run it again
    }
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
    if (c.begin_pending()) return result;  // it sent nothing: nothing to commit
    const int64_t xid = c.xid();
    absl::StatusOr<PgResult> committed = c.Commit();
    if (committed.ok()) return result;
    last_error = committed.status();
    if (!c.retryable()) {
      c.Rollback();
      return Result(committed.status());
    }
    if (!write) continue;
    const Connection::AfterCommitStep after = c.TakeAfterCommit();
    absl::StatusOr<bool> was_committed = WasCommitted(c, xid, deadline);
    if (!was_committed.ok()) return Result(was_committed.status());
    if (*was_committed) {
      c.RunAfterCommit(after);
      return result;
    }
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

absl::StatusOr<Job> PostgresMetadataStore::LoadJob(Connection& c, const std::string& job_id) {
  ASSIGN_OR_RETURN(PgResult result, c.Exec(c.for_update() ? kSelectJobForUpdate : kSelectJob, Params().Text(job_id)));
  if (result.Rows() == 0) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  return rows::ReadJob(Row{result, 0});
}

namespace {

absl::StatusOr<std::vector<Job>> ReadJobs(const PgResult& result) {
  std::vector<Job> jobs;
  for (int i = 0; i < result.Rows(); ++i) {
    ASSIGN_OR_RETURN(Job job, rows::ReadJob(Row{result, i}));
    jobs.push_back(std::move(job));
  }
  return jobs;
}

// A job as committed (or written by this transaction), without locking its row.
absl::StatusOr<Job> ReadJobUnlocked(postgres_store::Connection& c, const std::string& job_id) {
  ASSIGN_OR_RETURN(PgResult result, c.Exec(kSelectJob, Params().Text(job_id)));
  if (result.Rows() == 0) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  return rows::ReadJob(Row{result, 0});
}

absl::StatusOr<std::vector<Task>> ReadTasks(const PgResult& result) {
  std::vector<Task> tasks;
  tasks.reserve(result.Rows());
  for (int i = 0; i < result.Rows(); ++i) {
    ASSIGN_OR_RETURN(Task task, rows::ReadTask(Row{result, i}));
    tasks.push_back(std::move(task));
  }
  return tasks;
}

Params TaskArrays(const std::vector<Task>& tasks) {
  std::vector<rows::Values> values;
  values.reserve(tasks.size());
  for (const Task& task : tasks) values.push_back(rows::TaskValues(task));
  return std::move(Params().Columns(values, rows::kTaskColumns));
}

}  // namespace

absl::Status PostgresMetadataStore::SaveJob(Connection& c, const Job& job, bool insert) {
  ASSIGN_OR_RETURN(PgResult result, c.Exec(insert ? kInsertJob : kUpdateJob, Params().Values(rows::JobValues(job))));
  if (result.Affected() != 1) {
    if (insert) return absl::AlreadyExistsError(absl::StrCat("job ", job.id, " exists"));
    return absl::NotFoundError(absl::StrCat("no job ", job.id));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Task>> PostgresMetadataStore::LoadTasks(Connection& c, const std::string& job_id) {
  ASSIGN_OR_RETURN(PgResult result,
                   c.Exec(c.for_update() ? kSelectTasksOfJobForUpdate : kSelectTasksOfJob, Params().Text(job_id)));
  return ReadTasks(result);
}

absl::StatusOr<std::vector<Task>> PostgresMetadataStore::LoadTasks(
    Connection& c, const std::vector<std::pair<std::string, int64_t>>& keys) {
  std::vector<rows::Values> values;
  for (const auto& [job_id, index] : keys) values.push_back({job_id, index});
  ASSIGN_OR_RETURN(PgResult result,
                   c.Exec(c.for_update() ? kSelectTasksForUpdate : kSelectTasks, Params().Columns(values, 2)));
  return ReadTasks(result);
}

absl::Status PostgresMetadataStore::SaveTasks(Connection& c, const std::vector<Task>& tasks, bool insert) {
  if (tasks.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(PgResult result, c.Exec(insert ? kInsertTasks : kUpdateTasks, TaskArrays(tasks)));
  if (result.Affected() != static_cast<int64_t>(tasks.size())) {
    return insert ? absl::AlreadyExistsError(absl::StrCat("job ", tasks.front().job_id, ": tasks exist"))
                  : absl::NotFoundError(absl::StrCat("job ", tasks.front().job_id, ": tasks vanished"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Executor> PostgresMetadataStore::LoadExecutor(Connection& c, const std::string& executor_id) {
  ASSIGN_OR_RETURN(PgResult result,
                   c.Exec(c.for_update() ? kSelectExecutorForUpdate : kSelectExecutor, Params().Text(executor_id)));
  if (result.Rows() == 0) return absl::NotFoundError(absl::StrCat("no executor ", executor_id));
  return rows::ReadExecutor(Row{result, 0});
}

absl::Status PostgresMetadataStore::SaveExecutor(Connection& c, const Executor& executor, bool insert) {
  ASSIGN_OR_RETURN(PgResult result, c.Exec(insert ? kInsertExecutor : kUpdateExecutor,
                                           Params().Values(rows::ExecutorValues(executor))));
  if (result.Affected() != 1) {
    if (insert) return absl::AlreadyExistsError(absl::StrCat("executor ", executor.id, " exists"));
    return absl::NotFoundError(absl::StrCat("no executor ", executor.id));
  }
  return absl::OkStatus();
}

// --- ending attempts, counting, settling ---

struct PostgresMetadataStore::AttemptWrites {
  std::vector<Task> tasks;         // to write back
  std::vector<const Task*> ended;  // those of them that reached a terminal state
  // What they add to their jobs' counts, when not CountTerminalTask of `ended` (an expiry).
  std::optional<std::map<std::string, Job>> counted;
  std::string executor_id;         // "" for none
  int64_t records = 0;             // added to the executor's records_done
};

absl::Status PostgresMetadataStore::WriteAttempts(Connection& c, const AttemptWrites& writes, absl::Time now,
                                                  std::set<std::string>* settle_later) {
  // What the ended tasks add to each job's counts, as a zeroed Job counts them.
  std::map<std::string, Job> added;
  if (writes.counted) added = *writes.counted;
  for (const Task* task : writes.ended) CountTerminalTask(added[task->job_id], *task, now);
  std::vector<rows::Values> counts;
  std::vector<rows::Values> job_ids;
  const int shard = RandomShard();
  for (const auto& [job_id, job] : added) {
    counts.push_back({job_id, int64_t{shard}, job.tasks_done, job.tasks_succeeded, job.counts.completed,
                      job.counts.failed, rows::TimeValue(now)});
    job_ids.push_back({job_id});
  }
  Params params = TaskArrays(writes.tasks);
  params.Columns(counts, 7).Int(writes.records).Text(writes.executor_id);
  if (settle_later != nullptr && !job_ids.empty()) {
    c.AfterCommit(kFinishedJobs,
                  std::move(Params()
                                .Columns(job_ids, 1)
                                .Text(Name(JobStateName(JobState::kQueued)))
                                .Text(Name(JobStateName(JobState::kRunning)))),
                  [settle_later](const PgResult& finished) {
                    for (int i = 0; i < finished.Rows(); ++i) settle_later->insert(finished.Text(i, 0));
                  });
  }
  return c.ExecAndCommit(kWriteAttempts, params);
}

absl::Status PostgresMetadataStore::SettleIfDone(Connection& c, const std::string& job_id, absl::Time now) {
  auto unsettled = [](const Job& job) {
    // Only a job whose tasks run: one still validating has none yet.
    return job.tasks_done >= job.n_tasks && (job.state == JobState::kQueued || job.state == JobState::kRunning);
  };
  ASSIGN_OR_RETURN(Job job, ReadJobUnlocked(c, job_id));
  if (!unsettled(job)) return absl::OkStatus();
  // Lock it and look again.
  if (!c.for_update()) return absl::InternalError("settling a job outside a writing transaction");
  ASSIGN_OR_RETURN(job, LoadJob(c, job_id));
  if (!unsettled(job)) return absl::OkStatus();
  std::string last_error;
  if (job.tasks_succeeded == 0) {
    ASSIGN_OR_RETURN(PgResult failure,
                     c.Exec(kLastFailure, Params().Text(job_id).Text(Name(TaskStateName(TaskState::kFailed)))));
    if (failure.Rows() > 0) last_error = failure.Text(0, 0);
  }
  if (SettleJob(job, last_error, now)) RETURN_IF_ERROR(SaveJob(c, job));
  return absl::OkStatus();
}

void PostgresMetadataStore::SettleLater(const std::set<std::string>& job_ids, absl::Time now) {
  if (job_ids.empty()) return;
  (void)InTransaction(true, [&](Connection& c) -> absl::Status {
    for (const std::string& job_id : job_ids) RETURN_IF_ERROR(SettleIfDone(c, job_id, now));
    return absl::OkStatus();
  });
}

template <typename Transition>
absl::StatusOr<std::vector<absl::Status>> PostgresMetadataStore::FinishAttempts(
    Connection& c, const std::string& executor_id, const std::vector<LeaseProgress>& reports, Transition&& transition,
    absl::Time now, std::vector<Task>* finished, std::set<std::string>& settle_later) {
  // The reported tasks are locked in key order, in one statement.
  std::vector<std::pair<std::string, int64_t>> keys;
  for (const LeaseProgress& report : reports) keys.emplace_back(report.job_id, report.task_index);
  std::vector<rows::Values> key_values;
  for (const auto& [job_id, index] : keys) key_values.push_back({job_id, index});
  ASSIGN_OR_RETURN(PgResult loaded,
                   c.Exec(kExecutorAndTasksForUpdate, std::move(Params().Columns(key_values, 2).Text(executor_id))));
  if (loaded.Rows() == 0 || loaded.Int(0, 0) == 0) return absl::NotFoundError(absl::StrCat("no executor ", executor_id));
  std::map<std::pair<std::string, int64_t>, Task> tasks;
  for (int i = 0; i < loaded.Rows(); ++i) {
    if (loaded.IsNull(i, 1)) continue;
    ASSIGN_OR_RETURN(Task task, rows::ReadTask(Row{loaded, i}, 1));
    tasks.emplace(std::make_pair(task.job_id, task.index), std::move(task));
  }

  AttemptWrites writes;
  writes.executor_id = executor_id;
  std::vector<absl::Status> outcomes;
  std::vector<size_t> written;  // index in writes.tasks of each report's task, or npos
  for (const LeaseProgress& report : reports) {
    auto it = tasks.find(std::make_pair(report.job_id, report.task_index));
    if (it == tasks.end()) {
      outcomes.push_back(absl::NotFoundError(absl::StrCat("no task ", report.job_id, "/", report.task_index)));
      written.push_back(std::string::npos);
      continue;
    }
    Task updated = it->second;  // as loaded: a refused report leaves the row as it is
    absl::Status fence = CheckFence(updated, executor_id, report.attempt);
    if (fence.ok()) fence = transition(updated, report);
    outcomes.push_back(fence);
    if (!fence.ok()) {
      written.push_back(std::string::npos);
      continue;
    }
    it->second = updated;  // a second report of the same attempt is then refused
    written.push_back(writes.tasks.size());
    writes.tasks.push_back(std::move(updated));
  }
  for (const Task& task : writes.tasks) {
    if (IsTerminal(task.state)) {
      writes.ended.push_back(&task);
      if (task.state == TaskState::kSucceeded) writes.records += task.records_done;
    }
  }
  RETURN_IF_ERROR(WriteAttempts(c, writes, now, &settle_later));
  if (finished != nullptr) {
    for (size_t i : written) finished->push_back(i == std::string::npos ? Task{} : writes.tasks[i]);
  }
  return outcomes;
}

// --- jobs ---

absl::StatusOr<Job> PostgresMetadataStore::CreateJob(const JobSpec& spec, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Job> {
    Job job = rules::NewJob(spec, now);
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
    ASSIGN_OR_RETURN(std::vector<Task> fresh, rules::AddTasksToJob(job, tasks, total_records, now));
    RETURN_IF_ERROR(SaveTasks(c, fresh, /*insert=*/true));
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

absl::StatusOr<TaskStateCounts> PostgresMetadataStore::CountTasks(const std::string& job_id) {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<TaskStateCounts> {
    ASSIGN_OR_RETURN(Job job, LoadJob(c, job_id));
    ASSIGN_OR_RETURN(PgResult result, c.Exec(kCountTasks, Params().Text(job_id)));
    TaskStateCounts counts;
    counts.done = job.tasks_done;
    counts.succeeded = job.tasks_succeeded;
    counts.pending = result.Int(0, 0);
    counts.running = result.Int(0, 1);
    counts.executors = result.Int(0, 2);
    return counts;
  });
}

absl::StatusOr<Job> PostgresMetadataStore::EndJob(Connection& c, const std::string& job_id, JobState state,
                                                  const std::string& error, absl::Time now) {
  // The store's lock order is tasks, then their job: lock the tasks first, then read them again
  // once the job is locked (AddTasks may have committed in between).
  RETURN_IF_ERROR(LoadTasks(c, job_id).status());
  ASSIGN_OR_RETURN(Job job, LoadJob(c, job_id));
  ASSIGN_OR_RETURN(std::vector<Task> tasks, LoadTasks(c, job_id));
  ASSIGN_OR_RETURN(std::vector<Task> cancelled, rules::EndJob(job, state, error, tasks, now));
  RETURN_IF_ERROR(SaveJob(c, job));
  AttemptWrites writes;
  writes.tasks = std::move(cancelled);
  for (const Task& task : writes.tasks) writes.ended.push_back(&task);
  RETURN_IF_ERROR(WriteAttempts(c, writes, now, /*settle_later=*/nullptr));  // it has ended: nothing to settle
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
    // Lock order: the tasks, then their job (as EndJob).
    RETURN_IF_ERROR(LoadTasks(c, job_id).status());
    ASSIGN_OR_RETURN(Job job, LoadJob(c, job_id));
    ASSIGN_OR_RETURN(std::vector<Task> tasks, LoadTasks(c, job_id));
    const Job before = job;
    std::vector<Task> was = tasks;
    RETURN_IF_ERROR(::minions::ExpireJob(job, tasks, now));
    RETURN_IF_ERROR(SaveJob(c, job));
    // The counts live in counter rows: add what the expiry counted.
    AttemptWrites writes;
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (tasks[i].state != was[i].state) writes.tasks.push_back(tasks[i]);
    }
    Job delta;
    delta.tasks_done = job.tasks_done - before.tasks_done;
    delta.tasks_succeeded = job.tasks_succeeded - before.tasks_succeeded;
    delta.counts.completed = job.counts.completed - before.counts.completed;
    delta.counts.failed = job.counts.failed - before.counts.failed;
    writes.counted.emplace();
    if (delta.tasks_done > 0) (*writes.counted)[job_id] = delta;
    RETURN_IF_ERROR(WriteAttempts(c, writes, now, /*settle_later=*/nullptr));  // it is finalizing already
    return job;
  });
}

absl::StatusOr<Task> PostgresMetadataStore::RequestBackup(const std::string& job_id, int64_t task_index, int attempt,
                                                          absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Task> {
    ASSIGN_OR_RETURN(std::vector<Task> tasks, LoadTasks(c, std::vector<std::pair<std::string, int64_t>>{{job_id, task_index}}));
    if (tasks.empty()) return absl::NotFoundError(absl::StrCat("no task ", job_id, "/", task_index));
    Task& task = tasks[0];
    if (task.attempt != attempt) {
      return absl::FailedPreconditionError(absl::StrCat("task ", job_id, "/", task_index, " is on attempt ",
                                                        task.attempt, ", not ", attempt));
    }
    RETURN_IF_ERROR(::minions::RequestBackup(task, now));
    RETURN_IF_ERROR(SaveTasks(c, tasks));
    return task;
  });
}

absl::StatusOr<std::vector<Job>> PostgresMetadataStore::JobsToFinalize(int limit) {
  // First the sweep: jobs whose last tasks ended in transactions that could not see each other
  // (and whose settling after the commit did not happen: the server died in between).
  ASSIGN_OR_RETURN(std::vector<std::string> unsettled,
                   InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::vector<std::string>> {
                     ASSIGN_OR_RETURN(PgResult result,
                                      c.Exec(kUnsettledJobs, Params()
                                                                 .Text(Name(JobStateName(JobState::kQueued)))
                                                                 .Text(Name(JobStateName(JobState::kRunning)))));
                     std::vector<std::string> ids;
                     for (int i = 0; i < result.Rows(); ++i) ids.push_back(result.Text(i, 0));
                     return ids;
                   }));
  for (const std::string& job_id : unsettled) {
    RETURN_IF_ERROR(InTransaction(true, [&](Connection& c) -> absl::Status {
      // Settled as of its last count (this method is not told the time).
      ASSIGN_OR_RETURN(Job job, LoadJob(c, job_id));
      return SettleIfDone(c, job_id, job.updated_at);
    }));
  }
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
    RETURN_IF_ERROR(rules::FinishJob(job, output_key, errors_key, manifest_key, now, outcome));
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
    rules::RegisterExecutor(executor, exists, info, now);
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
      ASSIGN_OR_RETURN(Executor executor, rows::ReadExecutor(Row{result, i}));
      executors.push_back(std::move(executor));
    }
    return executors;
  });
}

absl::StatusOr<std::vector<Task>> PostgresMetadataStore::ListRunningTasks() {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::vector<Task>> {
    ASSIGN_OR_RETURN(PgResult result, c.Exec(kRunningTasks));
    return ReadTasks(result);
  });
}

absl::StatusOr<HeartbeatReply> PostgresMetadataStore::Heartbeat(const std::string& executor_id, ExecutorState state,
                                                                const std::string& reason,
                                                                const std::vector<LeaseProgress>& held,
                                                                absl::Duration ttl, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<HeartbeatReply> {
    HeartbeatReply reply;
    // Tasks before their executor: the lock order of completions, which also lock both.
    std::vector<std::pair<std::string, int64_t>> keys;
    for (const LeaseProgress& progress : held) keys.emplace_back(progress.job_id, progress.task_index);
    std::sort(keys.begin(), keys.end());
    ASSIGN_OR_RETURN(std::vector<Task> loaded, LoadTasks(c, keys));
    absl::StatusOr<Executor> executor = LoadExecutor(c, executor_id);
    if (absl::IsNotFound(executor.status())) {
      // Its leases are left alone: it registers again (same id) and heartbeats them then.
      reply.unknown_executor = true;
      return reply;
    }
    RETURN_IF_ERROR(executor.status());
    rules::RecordHeartbeat(*executor, state, reason, now);
    std::map<std::pair<std::string, int64_t>, Task> tasks;
    for (Task& task : loaded) tasks.emplace(std::make_pair(task.job_id, task.index), std::move(task));
    std::vector<Task> renewed;
    for (const LeaseProgress& progress : held) {
      auto it = tasks.find(std::make_pair(progress.job_id, progress.task_index));
      if (it == tasks.end() || !rules::RenewLease(it->second, executor_id, progress, ttl, now)) {
        reply.cancel.push_back(progress);
        continue;
      }
      renewed.push_back(it->second);
      reply.renewed.push_back(progress);
    }
    RETURN_IF_ERROR(SaveTasks(c, renewed));
    reply.drain = executor->drain_requested;
    RETURN_IF_ERROR(SaveExecutor(c, *executor));
    return reply;
  });
}

absl::Status PostgresMetadataStore::RequestDrain(const std::string& executor_id, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::Status {
    ASSIGN_OR_RETURN(Executor executor, LoadExecutor(c, executor_id));
    rules::RequestDrain(executor);
    return SaveExecutor(c, executor);
  });
}

// --- leasing ---

absl::StatusOr<std::vector<Lease>> PostgresMetadataStore::LeaseTasks(const std::string& executor_id, int max_tasks,
                                                                     absl::Duration ttl, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<std::vector<Lease>> {
    std::vector<Lease> leases;
    ASSIGN_OR_RETURN(Executor executor, LoadExecutor(c, executor_id));
    if (!rules::MayLease(executor, max_tasks)) return leases;

    ASSIGN_OR_RETURN(PgResult result, c.Exec(kLeaseCandidates, Params()
                                                                   .Time(now)
                                                                   .Text(Name(JobStateName(JobState::kQueued)))
                                                                   .Text(Name(JobStateName(JobState::kRunning)))
                                                                   .Int(executor.info.memory_bytes)
                                                                   .Text(DumpJson(Json(rules::RunnersOf(executor))))
                                                                   .Int(max_tasks)));
    std::map<std::string, JobSpec> specs;  // parsed once per job
    std::set<std::string> to_start;        // jobs this lease starts
    std::vector<Task> granted;
    for (int i = 0; i < result.Rows(); ++i) {
      const Row row{result, i};
      ASSIGN_OR_RETURN(Task task, rows::ReadTask(row));
      if (specs.count(task.job_id) == 0) {
        ASSIGN_OR_RETURN(JobSpec spec, rows::JobSpecOf(task.job_id, row.Text(rows::kTaskColumns)));
        specs.emplace(task.job_id, std::move(spec));
        if (row.Text(rows::kTaskColumns + 1) == JobStateName(JobState::kQueued) || !row.Bool(rows::kTaskColumns + 2)) {
          to_start.insert(task.job_id);
        }
      }
      if (task.shadow && task.shadow->executor_id == executor_id) continue;  // its backup goes elsewhere
      RETURN_IF_ERROR(GrantTask(task, executor_id, ttl, now));
      granted.push_back(task);
      leases.push_back(rules::MakeLease(std::move(task), specs.at(granted.back().job_id)));
    }
    // Only a job that starts with this lease is locked and written (after its tasks, the store's
    // lock order); every lease of a running job would queue on its row otherwise.
    for (const std::string& job_id : to_start) {
      ASSIGN_OR_RETURN(Job job, LoadJob(c, job_id));
      if (MarkJobStarted(job, now)) RETURN_IF_ERROR(SaveJob(c, job));
    }
    if (!leases.empty() && rules::MarkBusy(executor)) RETURN_IF_ERROR(SaveExecutor(c, executor));
    // The grants last, sent with the COMMIT.
    if (!granted.empty()) RETURN_IF_ERROR(c.ExecAndCommit(kUpdateTasks, TaskArrays(granted)));
    return leases;
  });
}

absl::StatusOr<Task> PostgresMetadataStore::CompleteTask(const std::string& executor_id, const std::string& job_id,
                                                         int64_t task_index, int attempt, int64_t records_done,
                                                         int64_t records_failed, absl::Time now) {
  std::set<std::string> settle_later;
  absl::StatusOr<Task> task = InTransaction(true, [&](Connection& c) -> absl::StatusOr<Task> {
    settle_later.clear();
    std::vector<Task> finished;
    ASSIGN_OR_RETURN(std::vector<absl::Status> outcomes,
                     FinishAttempts(
                         c, executor_id, {{job_id, task_index, attempt, records_done, records_failed}},
                         [&](Task& t, const LeaseProgress&) {
                           return ::minions::CompleteTask(t, records_done, records_failed, now);
                         },
                         now, &finished, settle_later));
    RETURN_IF_ERROR(outcomes.front());
    return finished.front();
  });
  if (task.ok()) SettleLater(settle_later, now);
  return task;
}

absl::StatusOr<std::vector<absl::Status>> PostgresMetadataStore::CompleteTasks(
    const std::string& executor_id, const std::vector<LeaseProgress>& reports, absl::Time now) {
  std::set<std::string> settle_later;
  absl::StatusOr<std::vector<absl::Status>> outcomes =
      InTransaction(true, [&](Connection& c) -> absl::StatusOr<std::vector<absl::Status>> {
        settle_later.clear();
        return FinishAttempts(
            c, executor_id, reports,
            [&](Task& t, const LeaseProgress& report) {
              return ::minions::CompleteTask(t, report, now);
            },
            now, nullptr, settle_later);
      });
  if (outcomes.ok()) SettleLater(settle_later, now);
  return outcomes;
}

absl::StatusOr<Task> PostgresMetadataStore::FailTask(const std::string& executor_id, const std::string& job_id,
                                                     int64_t task_index, int attempt, FailureClass failure,
                                                     const std::string& message, absl::Time now,
                                                     const std::vector<Chunk>& chunks) {
  std::set<std::string> settle_later;
  absl::StatusOr<Task> task = InTransaction(true, [&](Connection& c) -> absl::StatusOr<Task> {
    settle_later.clear();
    // The job is only read (for max_attempts): its row is not what this writes.
    absl::StatusOr<Job> job = ReadJobUnlocked(c, job_id);
    if (!job.ok() && !absl::IsNotFound(job.status())) return job.status();
    std::vector<Task> finished;
    ASSIGN_OR_RETURN(std::vector<absl::Status> outcomes,
                     FinishAttempts(
                         c, executor_id, {{job_id, task_index, attempt, 0, 0}},
                         [&](Task& t, const LeaseProgress&) -> absl::Status {
                           if (!job.ok()) return job.status();
                           return FailAttempt(t, attempt, chunks, failure, message, job->spec.max_attempts,
                                              options_.retry, now);
                         },
                         now, &finished, settle_later));
    RETURN_IF_ERROR(outcomes.front());
    return finished.front();
  });
  if (task.ok()) SettleLater(settle_later, now);
  return task;
}

// --- watchdog ---

absl::StatusOr<std::vector<Task>> PostgresMetadataStore::ExpireLeases(absl::Time now, int limit) {
  std::set<std::string> settle_later;
  absl::StatusOr<std::vector<Task>> expired =
      InTransaction(true, [&](Connection& c) -> absl::StatusOr<std::vector<Task>> {
        settle_later.clear();
        ASSIGN_OR_RETURN(
            PgResult result,
            c.Exec(kExpiredLeases, Params().Time(now).Limit(limit)));
        AttemptWrites writes;
        ASSIGN_OR_RETURN(writes.tasks, ReadTasks(result));
        std::map<std::string, Job> jobs;  // read for max_attempts, not locked: their rows are not written
        for (Task& task : writes.tasks) {
          auto job = jobs.find(task.job_id);
          if (job == jobs.end()) {
            ASSIGN_OR_RETURN(Job loaded, ReadJobUnlocked(c, task.job_id));
            job = jobs.emplace(task.job_id, std::move(loaded)).first;
          }
          RETURN_IF_ERROR(ExpireLease(task, job->second.spec.max_attempts, options_.retry, now));
        }
        for (const Task& task : writes.tasks) {
          if (IsTerminal(task.state)) writes.ended.push_back(&task);
        }
        RETURN_IF_ERROR(WriteAttempts(c, writes, now, &settle_later));
        return writes.tasks;
      });
  if (expired.ok()) SettleLater(settle_later, now);
  return expired;
}

absl::StatusOr<std::vector<Executor>> PostgresMetadataStore::MarkLostExecutors(absl::Time cutoff, absl::Time now) {
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<std::vector<Executor>> {
    ASSIGN_OR_RETURN(
        PgResult result,
        c.Exec(kSilentExecutors, Params().Text(Name(ExecutorStateName(ExecutorState::kLost))).Time(cutoff)));
    std::vector<Executor> lost;
    for (int i = 0; i < result.Rows(); ++i) {
      ASSIGN_OR_RETURN(Executor executor, rows::ReadExecutor(Row{result, i}));
      rules::MarkLost(executor);
      RETURN_IF_ERROR(SaveExecutor(c, executor));
      lost.push_back(std::move(executor));
    }
    return lost;
  });
}

// --- fault injection (tests) ---

void PostgresMetadataStore::InjectCommitFaultForTesting(CommitFault fault, int times) {
  absl::MutexLock lock(&fault_mu_);
  fault_ = fault;
  faults_left_ = times;
}

int PostgresMetadataStore::CommitFaultsInjectedForTesting() {
  absl::MutexLock lock(&fault_mu_);
  return faults_injected_;
}

PostgresMetadataStore::CommitFault PostgresMetadataStore::TakeCommitFault() {
  absl::MutexLock lock(&fault_mu_);
  if (faults_left_ <= 0 || fault_ == CommitFault::kNone) return CommitFault::kNone;
  --faults_left_;
  ++faults_injected_;
  return fault_;
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
