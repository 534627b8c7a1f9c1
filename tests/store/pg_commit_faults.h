#pragma once
// CommitFaults: a fault-injecting wrapper around a real PostgreSQL connection, in the way of
// LevelDB's fault-injection Env: passed to PostgresMetadataStore::Open (or a ConnectionPool) as
// its CommitObserver (pg_connection.h), it breaks the connection's socket at the next writing
// transaction's COMMIT, as a network or a server would:
// - kConnectionLostBeforeCommit: before the COMMIT goes out. The server rolls the transaction
//   back; the store must run it again.
// - kAnswerLost: once the COMMIT went out, before its answer is read. The transaction commits;
//   the store must find that out, not run it again.
// Thread-safe (the store commits on its callers' threads).

#include <sys/socket.h>

#include <libpq-fe.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "store/postgres/pg_connection.h"

namespace minions::testing {

class CommitFaults : public postgres_store::CommitObserver {
 public:
  enum class Fault { kNone, kConnectionLostBeforeCommit, kAnswerLost };

  // The next `times` COMMITs of writing transactions go wrong as `fault` says (kNone: none do).
  void Arm(Fault fault, int times = 1) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    fault_ = fault;
    left_ = times;
  }
  // How many COMMITs went wrong so far.
  int injected() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return injected_;
  }

  void BeforeCommit(PGconn* conn) override {
    if (Take(Fault::kConnectionLostBeforeCommit)) Break(conn);
  }
  void CommitSent(PGconn* conn) override {
    if (Take(Fault::kAnswerLost)) Break(conn);
  }

 private:
  // Both directions of the socket end here: what is sent already still reaches the server.
  static void Break(PGconn* conn) {
    if (conn != nullptr) shutdown(PQsocket(conn), SHUT_RDWR);
  }
  bool Take(Fault at) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (fault_ != at || left_ <= 0) return false;
    --left_;
    ++injected_;
    return true;
  }

  absl::Mutex mu_;
  Fault fault_ ABSL_GUARDED_BY(mu_) = Fault::kNone;
  int left_ ABSL_GUARDED_BY(mu_) = 0;
  int injected_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace minions::testing
