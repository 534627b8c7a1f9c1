#include "store/postgres/pg_connection.h"

#include <algorithm>
#include <cstdlib>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "common/status_macros.h"

namespace minions::postgres_store {
namespace {

std::string TrimNewlines(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

bool IsRetryableSqlState(std::string_view sqlstate) {
  return sqlstate.empty() || sqlstate.substr(0, 2) == "08" || sqlstate == "57P01" || sqlstate == "57P02" ||
         sqlstate == "57P03" || sqlstate == "53300" || sqlstate == "40001" || sqlstate == "40P01";
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

// --- Connection ---

absl::Status Connection::EnsureConnected() {
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

void Connection::Close() {
  if (conn_ != nullptr) {
    if (const int pid = PQbackendPID(conn_); pid > 0) lost_backend_pid_ = pid;
    PQfinish(conn_);
  }
  conn_ = nullptr;
  prepared_.clear();  // prepared statements live and die with their session
  next_statement_ = 0;
}

absl::StatusOr<PgResult> Connection::Exec(const char* sql, const Params& params) {
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

absl::StatusOr<PgResult> Connection::ExecScript(const char* sql) {
  if (conn_ == nullptr) return Fail(nullptr, sql);
  if (begin_pending_) {
    begin_pending_ = false;
    absl::StatusOr<PgResult> begun = Check(PQexec(conn_, for_update_ ? "BEGIN; SELECT txid_current()" : "BEGIN"), sql);
    if (!begun.ok()) return begun.status();
    if (for_update_) xid_ = begun->Int(0, 0);
  }
  return Check(PQexec(conn_, sql), sql);
}

void Connection::Rollback() {
  if (conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK && PQtransactionStatus(conn_) != PQTRANS_IDLE) {
    PQclear(PQexec(conn_, "ROLLBACK"));
  }
}

void Connection::StartTransaction(bool write) {
  first_error_ = absl::OkStatus();
  retryable_ = false;
  conflicted_ = false;
  for_update_ = write;
  begin_pending_ = true;
  xid_ = 0;
  after_commit_sql_ = nullptr;
  after_commit_use_ = nullptr;
  commit_state_ = CommitState::kNotSent;
}

void Connection::AfterCommit(const char* sql, Params params, std::function<void(const PgResult&)> use) {
  after_commit_sql_ = sql;
  after_commit_params_ = std::move(params);
  after_commit_use_ = std::move(use);
}

Connection::AfterCommitStep Connection::TakeAfterCommit() {
  AfterCommitStep step{after_commit_sql_, std::move(after_commit_params_), std::move(after_commit_use_)};
  after_commit_sql_ = nullptr;
  after_commit_use_ = nullptr;
  return step;
}

void Connection::RunAfterCommit(const AfterCommitStep& step) {
  if (step.sql == nullptr || Broken()) return;
  begin_pending_ = false;  // on its own, outside any transaction
  absl::StatusOr<PgResult> answer = Exec(step.sql, step.params);
  if (answer.ok()) step.use(*answer);
}

absl::StatusOr<PgResult> Connection::Commit() {
  if (conn_ == nullptr) return Fail(nullptr, "COMMIT");
  const bool observed = commits_ != nullptr && for_update_;
  if (after_commit_sql_ == nullptr && !observed) return ExecScript("COMMIT");
  std::vector<Step> steps = {{"COMMIT"}};
  if (after_commit_sql_ != nullptr) steps.push_back({after_commit_sql_, &after_commit_params_});
  std::vector<PGresult*> results = Pipeline(steps, /*commit=*/true);
  absl::StatusOr<PgResult> committed = Answer(results[0], "COMMIT");
  if (results.size() > 1 && results[1] != nullptr) UseAfterCommit(committed.ok(), PgResult(results[1]));
  return committed;
}

absl::Status Connection::ExecAndCommit(const char* sql, const Params& params) {
  return SendEachAndCommit({{sql, &params}}).status();
}

std::vector<Connection::Step> Connection::Steps(const std::vector<Statement>& statements) {
  std::vector<Step> steps;
  steps.reserve(statements.size());
  for (const Statement& statement : statements) steps.push_back({statement.sql, &statement.params});
  return steps;
}

absl::StatusOr<std::vector<PgResult>> Connection::ExecEachAndCommit(const std::vector<Statement>& statements) {
  return SendEachAndCommit(Steps(statements));
}

absl::StatusOr<std::vector<PgResult>> Connection::SendEachAndCommit(const std::vector<Step>& statements) {
  if (begin_pending_) {  // nothing before them: BEGIN goes with the statements, COMMIT after
    if (statements.empty()) return std::vector<PgResult>{};  // nothing sent: nothing to commit
    ASSIGN_OR_RETURN(std::vector<PgResult> answers, SendEach(statements));
    // The COMMIT alone, through the path below: an answer lost is kAnswerLost (looked up by the
    // runner), never a failure that would run the transaction again.
    RETURN_IF_ERROR(SendEachAndCommit({}).status());
    return answers;
  }
  // A statement of this transaction failed already (the body went on): PostgreSQL would answer
  // this COMMIT with a ROLLBACK that reads as success.
  if (!first_error_.ok()) return first_error_;
  const char* first_sql = statements.empty() ? "COMMIT" : statements.front().sql;
  if (conn_ == nullptr) return Fail(nullptr, first_sql);
  std::vector<Step> steps = statements;
  const size_t commit = steps.size();
  steps.push_back({"COMMIT"});
  if (after_commit_sql_ != nullptr) steps.push_back({after_commit_sql_, &after_commit_params_});
  std::vector<PGresult*> results = Pipeline(steps, /*commit=*/true);
  if (results[commit] == nullptr) {  // Pipeline answers all or nothing: nothing came back
    commit_state_ = CommitState::kAnswerLost;
    return std::vector<PgResult>{};
  }
  // The first failure is the transaction's (what followed it did not run, COMMIT included).
  absl::Status failed;
  std::vector<PgResult> answers;
  for (size_t i = 0; i <= commit; ++i) {
    const char* sql = i < commit ? steps[i].sql : "COMMIT";
    if (!failed.ok()) {
      PQclear(results[i]);
      continue;
    }
    absl::StatusOr<PgResult> answer = Answer(results[i], sql);
    if (!answer.ok()) {
      failed = answer.status();
    } else if (i < commit) {
      answers.push_back(*std::move(answer));
    }
  }
  if (failed.ok()) commit_state_ = CommitState::kCommitted;
  if (results.size() > commit + 1) {
    UseAfterCommit(commit_state_ == CommitState::kCommitted, PgResult(results[commit + 1]));
  }
  if (!failed.ok()) return failed;
  return answers;
}

absl::StatusOr<PgResult> Connection::Check(PGresult* result, const char* sql) {
  ExecStatusType status = result != nullptr ? PQresultStatus(result) : PGRES_FATAL_ERROR;
  if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) return PgResult(result);
  return Fail(result, sql);
}

absl::Status Connection::Fail(PGresult* result, const char* sql) {
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
    conflicted_ = conflicted_ || sqlstate == "40P01" || sqlstate == "40001";
  } else if (sqlstate == "23505") {
    error = absl::AlreadyExistsError(text);
  } else {
    error = absl::InternalError(text);
  }
  if (first_error_.ok()) first_error_ = error;
  return error;
}

absl::StatusOr<PgResult> Connection::Answer(PGresult* result, const char* sql) {
  if (result == nullptr) return Fail(nullptr, sql);
  return Check(result, sql);
}

void Connection::UseAfterCommit(bool committed, const PgResult& answer) {
  const ExecStatusType status = PQresultStatus(answer.get());
  if (committed && (status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK)) after_commit_use_(answer);
}

std::vector<PGresult*> Connection::Pipeline(const std::vector<Step>& steps, bool commit) {
  const bool observed = commit && commits_ != nullptr && for_update_;
  if (observed) commits_->BeforeCommit(conn_);
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
  if (observed && sent) {
    while (PQflush(conn_) == 1) {
    }
    commits_->CommitSent(conn_);
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

absl::StatusOr<PgResult> Connection::BeginWith(const char* sql, const Params& params) {
  ASSIGN_OR_RETURN(std::vector<PgResult> answers, SendEach({{sql, &params}}));
  return std::move(answers.front());
}

absl::StatusOr<std::vector<PgResult>> Connection::ExecEach(const std::vector<Statement>& statements) {
  return SendEach(Steps(statements));
}

absl::StatusOr<std::vector<PgResult>> Connection::SendEach(const std::vector<Step>& statements) {
  if (statements.empty()) return std::vector<PgResult>{};
  if (conn_ == nullptr) return Fail(nullptr, statements.front().sql);
  std::vector<Step> steps;
  size_t first = 0;  // the first of `statements` among the steps
  if (begin_pending_) {
    begin_pending_ = false;
    steps.push_back({"BEGIN"});
    if (for_update_) steps.push_back({"SELECT txid_current()"});
    first = steps.size();
  }
  steps.insert(steps.end(), statements.begin(), statements.end());
  std::vector<PGresult*> results = Pipeline(steps);
  // The first failure is the transaction's; answers after it are "aborted" and say nothing.
  absl::Status failed;
  std::vector<PgResult> answers;
  for (size_t i = 0; i < results.size(); ++i) {
    PGresult* result = std::exchange(results[i], nullptr);
    const ExecStatusType status = result != nullptr ? PQresultStatus(result) : PGRES_FATAL_ERROR;
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
      if (failed.ok()) {
        failed = Fail(result, steps[std::max(i, first)].sql);
      } else if (result != nullptr) {
        PQclear(result);
      }
      continue;
    }
    if (i >= first) {
      answers.emplace_back(result);
      continue;
    }
    if (for_update_ && i == 1) xid_ = std::strtoll(PQgetvalue(result, 0, 0), nullptr, 10);
    PQclear(result);
  }
  if (!failed.ok()) return failed;
  return answers;
}

}  // namespace minions::postgres_store
