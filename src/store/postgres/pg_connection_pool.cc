#include "store/postgres/pg_connection_pool.h"

#include <utility>

namespace minions::postgres_store {

ConnectionPool::ConnectionPool(const std::string& conninfo, int size, CommitObserver* commits) {
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < size; ++i) idle_.push_back(std::make_unique<Connection>(conninfo, commits));
}

std::unique_ptr<Connection> ConnectionPool::Acquire() {
  absl::MutexLock lock(&mu_);
  while (idle_.empty()) available_.Wait(&mu_);
  std::unique_ptr<Connection> connection = std::move(idle_.back());
  idle_.pop_back();
  return connection;
}

void ConnectionPool::Release(std::unique_ptr<Connection> connection) {
  absl::MutexLock lock(&mu_);
  idle_.push_back(std::move(connection));  // last in, first out: warm connections are reused
  available_.Signal();
}

}  // namespace minions::postgres_store
