#pragma once
// ExecutorOperations: the MetadataStore's executors (metadata_store.h), written once over a
// RowStore (store/row_store.h): registering, reading, heartbeats (several executors' in one
// transaction, on the backend's heartbeat connection), drains, and the watchdog's lost executors.
// Lock order (where rows lock): a heartbeat batch's tasks (in key order), then its executors (in id
// order), as completions lock them, so batches and completions cannot deadlock.
// Borrows the store and the id source. Thread-safe.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/common/id_generator.h"
#include "store/metadata_store.h"
#include "store/row_store.h"

namespace minions {

class ExecutorOperations {
 public:
  ExecutorOperations(RowStore& store, const StoreOptions& options, IdGenerator& ids)
      : store_(store), options_(options), ids_(ids) {}

  absl::StatusOr<Executor> RegisterExecutor(const std::string& executor_id, const ExecutorInfo& info, absl::Time now);
  absl::StatusOr<Executor> GetExecutor(const std::string& executor_id);
  absl::StatusOr<std::vector<Executor>> ListExecutors();
  absl::StatusOr<std::vector<HeartbeatReply>> Heartbeats(const std::vector<HeartbeatCall>& calls, absl::Duration ttl,
                                                         absl::Time now);
  absl::Status RequestDrain(const std::string& executor_id, absl::Time now);
  absl::StatusOr<std::vector<Executor>> MarkLostExecutors(absl::Time cutoff, absl::Time now);

 private:
  RowStore& store_;
  const StoreOptions& options_;
  IdGenerator& ids_;
};

}  // namespace minions
