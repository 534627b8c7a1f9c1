#pragma once
// ConnectionPool: a fixed set of PostgreSQL connections (pg_connection.h), made lazily by their
// users and re-made when broken; Borrowed, one borrowed for a scope. Owns the connections.
// Thread-safe: Acquire waits for a free one.

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "store/postgres/pg_connection.h"

namespace minions::postgres_store {

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
