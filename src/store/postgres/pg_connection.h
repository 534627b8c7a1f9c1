#pragma once
// Connection: one libpq connection of the PostgreSQL store, with its prepared statements and
// pipelined round trips, on the layer's parameters (pg_params.h) and results (pg_result.h); a
// fixed pool of them is pg_connection_pool.h.
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

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/postgres/pg_params.h"
#include "store/postgres/pg_result.h"

namespace minions::postgres_store {

// SQLSTATEs after which the whole transaction is run again: the connection is gone or going
// (class 08, 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now, 53300
// too_many_connections), or the server aborted it to resolve a conflict (40001, 40P01). An empty
// SQLSTATE is a client-side failure: the connection broke.
bool IsRetryableSqlState(std::string_view sqlstate);

// InvalidArgument (saying what is wrong) unless `conninfo` parses as a libpq connection string.
absl::Status CheckConninfo(const std::string& conninfo);

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

}  // namespace minions::postgres_store
