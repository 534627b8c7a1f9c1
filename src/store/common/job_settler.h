#pragma once
// JobSettler: ends attempts and settles the jobs whose last task they ended — the MetadataStore
// contract's settling (metadata_store.h), written once for every backend. A job whose tasks have
// all ended and that is still queued or running becomes finalizing, or failed when no task
// succeeded (model SettleJob). When that happens depends on the backend (RowStore::settling): in
// the transaction that ended the last task (one writer at a time), or in a transaction of its own
// right after that one commits (concurrent completers cannot see each other's counts before);
// JobsToFinalize's sweep (SweepUnsettled) settles what a process that died in between left.
// Borrows the RowStore; holds no state of its own. Thread-safe.

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/row_store.h"

namespace minions {

// What one call's transaction ended, for settling: reset at the start of each run of its body (a
// backend may run it again).
struct Settlement {
  std::set<std::string> later;          // Settling::kAfterCommit: jobs to settle once it committed
  std::vector<std::string> finalizing;  // Settling::kInTransaction: jobs it settled to finalizing
  void Reset() {
    later.clear();
    finalizing.clear();
  }
};

class JobSettler {
 public:
  explicit JobSettler(RowStore& store) : store_(store) {}

  // Adds each terminal task of writes.tasks to its job's counts (model CountTerminalTask).
  static void CountEnded(AttemptWrites& writes, absl::Time now);

  // Writes `writes` (RowTransaction::EndAttempts) and settles the jobs it ended the last task of:
  // here (Settling::kInTransaction) or once the transaction has committed (Settle). Nothing is
  // written when `writes` is empty.
  absl::Status EndAndSettle(RowTransaction& t, const AttemptWrites& writes, absl::Time now, Settlement& settlement);
  // Writes `writes` where no job can settle (its job has ended, or no task ended).
  static absl::Status EndOnly(RowTransaction& t, const AttemptWrites& writes, absl::Time now);

  // After the transaction of `settlement` committed: settles its jobs left for later (in a
  // transaction of their own; best effort: what it misses, the sweep settles) and answers every job
  // it settled to finalizing, sorted.
  std::vector<std::string> Settle(const Settlement& settlement, absl::Time now);

  // Settles job `job_id` if all its tasks have ended and it has not settled; locks it only then.
  // Whether it became finalizing.
  absl::StatusOr<bool> SettleIfDone(RowTransaction& t, const std::string& job_id, absl::Time now);
  // JobsToFinalize's sweep: settles, as of `now`, every job left unsettled.
  absl::Status SweepUnsettled(RowTransaction& t, absl::Time now);

 private:
  RowStore& store_;
};

}  // namespace minions
