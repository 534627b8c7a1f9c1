#pragma once
// GangOperations: the GangStore half of every MetadataStore (store/gang_store.h), written once over
// a RowStore (store/row_store.h): which executors form the gang of a task attempt, the next task a
// gang should run, and the grant of a task to a gang with its seats in one transaction. Two gangs
// formed at once that share an executor: the seats' unique executor lets one in, the other inserts
// nothing and answers FailedPrecondition.
// Lock order (where rows lock): the task, its job, the leader (as the store's: tasks, jobs,
// executors).
// Borrows the store. Thread-safe.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/gang_store.h"
#include "store/row_store.h"

namespace minions {

class GangOperations {
 public:
  explicit GangOperations(RowStore& store) : store_(store) {}

  absl::Status RecordGang(const GangLease& gang);
  absl::StatusOr<GangLease> GangOf(const std::string& executor_id);
  absl::StatusOr<std::vector<GangLease>> ListGangs();
  absl::Status EndGang(const std::string& job_id, int64_t task_index, int attempt);
  absl::StatusOr<std::optional<GangTaskRef>> NextGangTask(absl::Time now);
  absl::StatusOr<Lease> LeaseToGang(const GangLease& requested, absl::Duration ttl, absl::Time now);

 private:
  RowStore& store_;
};

}  // namespace minions
