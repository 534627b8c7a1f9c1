#pragma once
// The libpq layer under the PostgreSQL store: bound parameters (Params), owned results
// (PgResult, Row), one connection with its prepared statements and pipelined round trips
// (Connection), and a fixed pool of them (ConnectionPool, Borrowed).
//
// What runs a transaction on these (retries, commit verification) is pg_transaction_runner.h;
// the SQL is postgres_statements.h.
//
// - Prepared statements: each statement's text is parsed and planned once per connection, then
//   only executed; they keep their generic plans (plan_cache_mode = force_generic_plan).
// - Pipelining: BEGIN goes out with a transaction's first statement and, where nothing can fail
//   after it, COMMIT with its last (libpq pipeline mode), so a short transaction is one or two
//   round trips.
// - Errors: a failed statement is an absl::Status whose code says what the caller may do:
//   Unavailable when the transaction may be run again (the connection broke, the server is going
//   away, a serialization failure or deadlock; see IsRetryableSqlState), AlreadyExists on a unique
//   violation, Internal otherwise. The connection remembers the first error of its transaction.

#include <libpq-fe.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "store/common/store_rows.h"

namespace minions::postgres_store {

// SQLSTATEs after which the whole transaction is run again: the connection is gone or going
// (class 08, 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now, 53300
// too_many_connections), or the server aborted it to resolve a conflict (40001, 40P01). An empty
// SQLSTATE is a client-side failure: the connection broke.
bool IsRetryableSqlState(std::string_view sqlstate);

// InvalidArgument (saying what is wrong) unless `conninfo` parses as a libpq connection string.
absl::Status CheckConninfo(const std::string& conninfo);

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
  Params& Value(const store_rows::Value& value);
  // One row's values, as $n, $n+1, ...
  Params& Values(const store_rows::Values& values);
  // Rows of `columns` values each, as one array parameter per column (for unnest(...)).
  Params& Columns(const std::vector<store_rows::Values>& rows, int columns);
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
  std::optional<int64_t> OptInt(int row, int column) const {
    if (IsNull(row, column)) return std::nullopt;
    return Int(row, column);
  }
  const PGresult* get() const { return result_; }
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
  std::optional<int64_t> OptInt(int column) const { return result.OptInt(row, column); }
};

// What a connection tells of each COMMIT of a writing transaction as it goes out: a seam for
// tests, which break the connection there (a fault-injecting wrapper of the real thing,
// tests/store/pg_commit_faults.h) to show that a COMMIT cut off or unanswered happens once.
// Production passes none. Called on the thread that commits; must be thread-safe.
class CommitObserver {
 public:
  virtual ~CommitObserver() = default;
  // The COMMIT (and the statements sent with it) is about to go out on `conn`.
  virtual void BeforeCommit(PGconn* conn) = 0;
  // It went out (flushed), and its answer is not read yet.
  virtual void CommitSent(PGconn* conn) = 0;
};

// One libpq connection, (re)made on demand. Not thread-safe: the pool hands it to one thread at a
// time. Remembers the first error of the current transaction, and whether it calls for a retry.
class Connection {
 public:
  // `commits` (borrowed; null in production) is told of each writing transaction's COMMIT.
  explicit Connection(std::string conninfo, CommitObserver* commits = nullptr)
      : conninfo_(std::move(conninfo)), commits_(commits) {}
  ~Connection() { Close(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Connects unless connected and idle (outside any transaction).
  absl::Status EnsureConnected();
  void Close();
  bool Broken() const { return conn_ == nullptr || PQstatus(conn_) != CONNECTION_OK; }

  // One statement with $n parameters (extended protocol). The first statement of a transaction
  // goes out together with its BEGIN (see StartTransaction).
  absl::StatusOr<PgResult> Exec(const char* sql, const Params& params = Params());
  // A statement and its parameters, for the calls that send several at once.
  struct Statement {
    const char* sql;
    Params params;
  };
  // Several statements in one round trip (libpq's pipeline mode; the first of a transaction with
  // its BEGIN), run one after another in order: their answers, in order. The first failure is the
  // answer (the statements after it did not run). Worth it where a transaction's statements do
  // not depend on each other's answers: under load each round trip waits for two wake-ups.
  absl::StatusOr<std::vector<PgResult>> ExecEach(const std::vector<Statement>& statements);
  // Constant text of one or more statements, no parameters (simple protocol); the last result.
  absl::StatusOr<PgResult> ExecScript(const char* sql);
  // Ends the current transaction, if any, ignoring errors (they are already recorded).
  void Rollback();

  // Per transaction.
  // Starts a transaction. BEGIN is not sent yet: it goes out with the first statement, in one
  // round trip (libpq's pipeline mode), and a writing transaction also takes its id then, so that
  // a COMMIT whose answer is lost can be looked up afterwards instead of being run twice.
  void StartTransaction(bool write);
  // True while the transaction has sent nothing (there is nothing to commit).
  bool begin_pending() const { return begin_pending_; }
  // The id of the current writing transaction (0 before its first statement).
  int64_t xid() const { return xid_; }
  // The server process of the last session this connection closed (0: none known): a transaction
  // whose connection was lost may still be "in progress" there until it notices.
  int lost_backend_pid() const { return lost_backend_pid_; }

  // Set by a transaction's body: a statement to run right after its COMMIT (sent together with
  // it, so in the same round trip), and what to do with the answer. Nothing happens to it when
  // the COMMIT fails or its answer is lost.
  void AfterCommit(const char* sql, Params params, std::function<void(const PgResult&)> use);
  // When a COMMIT's answer was lost: the after-commit statement, taken to run (RunAfterCommit)
  // once it is known that the transaction committed.
  struct AfterCommitStep {
    const char* sql = nullptr;
    Params params;
    std::function<void(const PgResult&)> use;
  };
  AfterCommitStep TakeAfterCommit();
  void RunAfterCommit(const AfterCommitStep& step);

  // Whether the transaction's COMMIT went out (ExecAndCommit sends it with the last statement).
  enum class CommitState { kNotSent, kCommitted, kAnswerLost };
  CommitState commit_state() const { return commit_state_; }

  // COMMIT, and the after-commit statement if there is one. The answer is COMMIT's.
  absl::StatusOr<PgResult> Commit();

  // The transaction's last statement, sent with its COMMIT (and the after-commit statement) in
  // one round trip; the answer to the statement is not kept. An error is the statement's or the
  // COMMIT's (the transaction did not commit); when the answers were lost, commit_state() says so
  // and the caller must find out whether it committed.
  absl::Status ExecAndCommit(const char* sql, const Params& params);
  // As ExecAndCommit, for several statements, their answers kept (in order). When the COMMIT's
  // answer was lost (commit_state() kAnswerLost) it is OK, and empty unless the statements were
  // answered before the COMMIT went out (the transaction's first ones): the caller's transaction
  // runner finds out whether it committed.
  absl::StatusOr<std::vector<PgResult>> ExecEachAndCommit(const std::vector<Statement>& statements);

  const absl::Status& first_error() const { return first_error_; }
  bool retryable() const { return retryable_; }
  // The server aborted this transaction to resolve a conflict with another: a deadlock or a
  // serialization failure (40P01, 40001).
  bool conflicted() const { return conflicted_; }
  // In a writing transaction, loads lock the rows they read.
  bool for_update() const { return for_update_; }

 private:
  absl::StatusOr<PgResult> Check(PGresult* result, const char* sql);
  absl::Status Fail(PGresult* result, const char* sql);

  // A pipeline step's answer as Exec gives it (nullptr: none came, the connection broke).
  absl::StatusOr<PgResult> Answer(PGresult* result, const char* sql);
  void UseAfterCommit(bool committed, const PgResult& answer);

  // One statement of a pipeline: constant text, with `params` (a prepared statement) or without
  // (sent as is).
  struct Step {
    const char* sql;
    const Params* params = nullptr;
  };

  // Sends `steps` and a sync at once (libpq's pipeline mode) and reads their answers, in order:
  // one result per step, nullptr for a step that got none (the connection broke). New prepared
  // statements are prepared on the way; a failed PREPARE is its step's answer.
  // `commit`: the steps carry a writing transaction's COMMIT (the commit observer hears of it).
  std::vector<PGresult*> Pipeline(const std::vector<Step>& steps, bool commit = false);

  // The pipeline steps of `statements` (pointing into them).
  static std::vector<Step> Steps(const std::vector<Statement>& statements);
  // BEGIN, the transaction id (writing transactions) and the transaction's first statement.
  absl::StatusOr<PgResult> BeginWith(const char* sql, const Params& params);
  // `statements` in one pipeline, after BEGIN (and the transaction id) when the transaction has
  // sent nothing yet: their answers, or the first failure.
  absl::StatusOr<std::vector<PgResult>> SendEach(const std::vector<Step>& statements);
  // `statements`, COMMIT and the after-commit statement in one pipeline (ExecEachAndCommit).
  absl::StatusOr<std::vector<PgResult>> SendEachAndCommit(const std::vector<Step>& statements);

  const std::string conninfo_;
  CommitObserver* const commits_;
  PGconn* conn_ = nullptr;
  std::map<std::string, std::string> prepared_;  // statement text -> prepared name, this session
  absl::Status first_error_;
  bool retryable_ = false;
  bool conflicted_ = false;
  bool for_update_ = false;
  bool begin_pending_ = false;
  int64_t xid_ = 0;
  int lost_backend_pid_ = 0;
  std::string lost_message_;  // why the last unfinished pipeline failed
  int next_statement_ = 0;    // names prepared statements
  const char* after_commit_sql_ = nullptr;
  Params after_commit_params_;
  std::function<void(const PgResult&)> after_commit_use_;
  CommitState commit_state_ = CommitState::kNotSent;
};

// A fixed set of connections (made lazily by their users, re-made when broken); Acquire waits for
// a free one. Thread-safe.
class ConnectionPool {
 public:
  // `commits` (borrowed; null in production): Connection's.
  ConnectionPool(const std::string& conninfo, int size, CommitObserver* commits = nullptr);
  std::unique_ptr<Connection> Acquire() ABSL_LOCKS_EXCLUDED(mu_);
  void Release(std::unique_ptr<Connection> connection) ABSL_LOCKS_EXCLUDED(mu_);

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
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;
  Connection& operator*() { return *connection_; }
  Connection* operator->() { return connection_.get(); }

 private:
  ConnectionPool* pool_;
  std::unique_ptr<Connection> connection_;
};

}  // namespace minions::postgres_store
