#include "store/postgres/pg_transaction_runner.h"

#include <algorithm>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "store/postgres/pg_connection_pool.h"

namespace minions::postgres_store {
namespace {

constexpr absl::Duration kFirstBackoff = absl::Milliseconds(20);
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);

constexpr char kTxidStatus[] = "SELECT txid_status($1)";
// Ends the server process of a lost connection that still runs transaction $2 (its 32-bit xid is
// the low half of txid_current()'s), waiting up to 5 s for it to go: until it notices that its
// client is gone (a closed socket, or TCP keepalive on a network that vanished) the transaction is
// "in progress" and holds its locks. The xid check makes sure the process is that one still.
constexpr char kEndLostBackend[] =
    "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
    "WHERE pid = $1 AND backend_xid::text::bigint = $2::bigint % 4294967296";

// A bit of jitter, so that servers that lost the database together do not retry in lockstep.
absl::Duration Jittered(absl::Duration backoff) {
  static thread_local std::mt19937 random(std::random_device{}());
  return backoff * (0.5 + std::uniform_real_distribution<double>(0, 1)(random));
}

}  // namespace

TransactionRunner::TransactionRunner(std::unique_ptr<ConnectionPool> pool, Clock* clock)
    : pool_(std::move(pool)), clock_(clock) {}

TransactionRunner::~TransactionRunner() = default;

bool TransactionRunner::Backoff(absl::Duration& backoff, absl::Time deadline) {
  const absl::Duration wait = Jittered(backoff);
  if (clock_->Now() + wait > deadline) return false;
  clock_->SleepFor(wait);
  backoff = std::min(backoff * 2, kMaxBackoff);
  return true;
}

absl::StatusOr<bool> TransactionRunner::WasCommitted(Connection& c, int64_t xid, absl::Time deadline) {
  absl::Duration backoff = kFirstBackoff;
  absl::Status last_error;
  const int lost_backend = c.lost_backend_pid();  // where the transaction ran, if its session was closed
  bool ended_lost_backend = false;
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
        if (lost_backend > 0 && !ended_lost_backend) {
          // Its process has not noticed yet: end it (once), then ask again at once. An error
          // (no right to end it, an older PostgreSQL) leaves the waiting below to settle it.
          ended_lost_backend = true;
          c.StartTransaction(false);
          (void)c.Exec(kEndLostBackend, Params().Int(lost_backend).Int(xid));
          c.Rollback();
          continue;
        }
      } else {
        last_error = status.status();
        if (!c.retryable()) return last_error;
      }
    } else {
      last_error = connected;
    }
    if (!Backoff(backoff, deadline)) {
      // The retry window ran out here rather than in Run (the last try's backend was still
      // ending, or the database was gone): the same giving up, saying what is not known.
      return absl::UnavailableError(absl::StrCat("PostgreSQL unavailable; gave up after ",
                                                 absl::FormatDuration(kRetryWindow),
                                                 " of tries: cannot learn whether a transaction committed: ",
                                                 last_error.ok() ? "it was still in progress" : last_error.message()));
    }
  }
}

absl::Status TransactionRunner::Run(bool write, absl::FunctionRef<absl::Status(Connection&)> body) {
  Borrowed borrowed(pool_.get());
  Connection& c = *borrowed;
  const absl::Time deadline = clock_->Now() + kRetryWindow;
  absl::Duration backoff = kFirstBackoff;
  absl::Status last_error;
  for (int tries = 0;; ++tries) {
    if (tries > 0 && !Backoff(backoff, deadline)) {
      return absl::UnavailableError(absl::StrCat("PostgreSQL unavailable; gave up after ", tries, " tries in ",
                                                 absl::FormatDuration(kRetryWindow), ": ", last_error.message()));
    }
    if (absl::Status connected = c.EnsureConnected(); !connected.ok()) {
      last_error = connected;
      continue;
    }
    c.StartTransaction(write);
    const absl::Status answered = body(c);
    if (c.commit_state() == Connection::CommitState::kCommitted) return absl::OkStatus();
    if (c.commit_state() == Connection::CommitState::kAnswerLost) {
      // Its last statement and COMMIT went out together and no answer came back.
      const Connection::AfterCommitStep after = c.TakeAfterCommit();
      absl::StatusOr<bool> was_committed = WasCommitted(c, c.xid(), deadline);
      if (!was_committed.ok()) return was_committed.status();
      if (*was_committed) {
        c.RunAfterCommit(after);
        return absl::OkStatus();
      }
      last_error = absl::UnavailableError("the connection broke before a COMMIT was answered");
      continue;  // it rolled back: run it again
    }
    if (c.retryable()) {  // the body's answer was made on a broken or aborted transaction
      if (c.conflicted()) conflicts_retried_.fetch_add(1, std::memory_order_relaxed);
      last_error = c.first_error();
      c.Rollback();
      continue;
    }
    if (!answered.ok() || !c.first_error().ok()) {
      c.Rollback();
      if (answered.ok()) return c.first_error();  // a query failed but the body went on
      return absl::OkStatus();                    // the body's own error stands
    }
    if (c.begin_pending()) return absl::OkStatus();  // it sent nothing: nothing to commit
    const int64_t xid = c.xid();
    absl::StatusOr<PgResult> committed = c.Commit();
    if (committed.ok()) return absl::OkStatus();
    last_error = committed.status();
    if (!c.retryable()) {
      c.Rollback();
      return committed.status();
    }
    if (c.conflicted()) conflicts_retried_.fetch_add(1, std::memory_order_relaxed);
    if (!write) continue;
    const Connection::AfterCommitStep after = c.TakeAfterCommit();
    absl::StatusOr<bool> was_committed = WasCommitted(c, xid, deadline);
    if (!was_committed.ok()) return was_committed.status();
    if (*was_committed) {
      c.RunAfterCommit(after);
      return absl::OkStatus();
    }
    // It rolled back: run it again.
  }
}

}  // namespace minions::postgres_store
