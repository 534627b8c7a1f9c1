#pragma once
// TransactionRunner: runs a body of statements as one PostgreSQL transaction on a pooled
// connection, and runs it again when the database broke it off.
//
// - Retries: a transaction that fails because the connection broke (SQLSTATE class 08, no
//   SQLSTATE at all, 57P01-57P03 shutdown/startup, 53300 too many connections) or on a
//   serialization failure or deadlock (40001, 40P01) is rolled back and run again (reconnecting
//   first when the connection broke), with jittered exponential backoff from 20 ms to 1 s, for up
//   to 30 seconds; then it is Unavailable.
// - Commit verification: a COMMIT whose answer was lost is not blindly retried: writing
//   transactions note their transaction id (taken with BEGIN), and after reconnecting the runner
//   asks txid_status() whether it committed (tests break the connection at a COMMIT through the
//   pool's CommitObserver, pg_connection.h, to exercise both outcomes).
// - Time: the retry window and every backoff are on the Clock it is given, so a test can run the
//   30 seconds of retries in a moment.
// Owns the connection pool; borrows the clock. Thread-safe: any thread may run transactions; each
// waits for a free connection.

#include <atomic>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace minions::postgres_store {

class Connection;      // pg_connection.h
class ConnectionPool;

class TransactionRunner {
 public:
  // How long a transaction the database broke off is retried before it is Unavailable.
  static constexpr absl::Duration kRetryWindow = absl::Seconds(30);

  TransactionRunner(std::unique_ptr<ConnectionPool> pool, Clock* clock);
  ~TransactionRunner();
  TransactionRunner(const TransactionRunner&) = delete;
  TransactionRunner& operator=(const TransactionRunner&) = delete;

  // Runs `body(connection)` inside BEGIN ... COMMIT on a pooled connection, rolling back when it
  // returns an error, and running it again (see the header comment) when the connection broke or
  // the server aborted it. In a `write` transaction every row loaded is locked FOR UPDATE (the
  // body asks Connection::for_update()). The body's result is absl::Status or absl::StatusOr<T>;
  // it is the answer unless the transaction itself failed (then that failure is).
  template <typename Body>
  auto InTransaction(bool write, Body&& body) -> decltype(body(std::declval<Connection&>())) {
    using Result = decltype(body(std::declval<Connection&>()));
    std::optional<Result> result;
    absl::Status failed = Run(write, [&](Connection& c) -> absl::Status {
      result.emplace(body(c));
      if constexpr (std::is_same_v<Result, absl::Status>) {
        return *result;
      } else {
        return result->status();
      }
    });
    if (!failed.ok()) return Result(std::move(failed));
    return *std::move(result);
  }

  // Times the server aborted a transaction of this runner to resolve a conflict (a deadlock, a
  // serialization failure), since the runner began; each was run again while the retry window
  // allowed. The store's lock order should keep it at 0 (tests, metrics).
  int64_t conflicts_retried() const { return conflicts_retried_.load(std::memory_order_relaxed); }

 private:
  // Runs the attempts. OK: the body's last answer stands (it committed, or it failed on its own
  // and was rolled back, or it sent nothing); otherwise the transaction failed with this error.
  absl::Status Run(bool write, absl::FunctionRef<absl::Status(Connection&)> body);
  // After a COMMIT whose answer was lost: did transaction `xid` commit? Asks (reconnecting) until
  // `deadline`.
  absl::StatusOr<bool> WasCommitted(Connection& c, int64_t xid, absl::Time deadline);
  // Waits out a backoff (doubling it for next time); false when that would pass `deadline`.
  bool Backoff(absl::Duration& backoff, absl::Time deadline);

  const std::unique_ptr<ConnectionPool> pool_;
  Clock* const clock_;
  std::atomic<int64_t> conflicts_retried_{0};
};

}  // namespace minions::postgres_store
