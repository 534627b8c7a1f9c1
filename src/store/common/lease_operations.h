#pragma once
// LeaseOperations: the MetadataStore's leasing (metadata_store.h), written once over a RowStore
// (store/row_store.h): several executors' Lease calls granted in one transaction, each exactly as
// it would be granted alone just after the ones before it (their grants taken, fair-share ranks
// and quotas counting them), and the teams' fair-share standing.
// What a lease may take is picked by the backend's candidate query (RowTransaction::
// LeaseCandidates: an index over the placement rules); whether it takes it is decided here
// (store_rules MayPlace, a team's running-task allowance, a backup never on its shadow's executor).
// Lock order (where rows lock): the executors (in id order), the teams with a quota, the tasks
// (skipped when another transaction holds them, never waited for), the jobs that start, then the
// grants' teams; only a job that starts with the batch is written, so leases of a running job do
// not queue on its row.
// Borrows the store and the options. Thread-safe.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/metadata_store.h"
#include "store/row_store.h"

namespace minions {

class LeaseOperations {
 public:
  using Answers = std::vector<absl::StatusOr<std::vector<Lease>>>;

  LeaseOperations(RowStore& store, const StoreOptions& options) : store_(store), options_(options) {}

  absl::StatusOr<Answers> LeaseMany(const std::vector<LeaseAsk>& asks, absl::Duration ttl, absl::Time now);
  absl::StatusOr<std::vector<TeamUsage>> ListTeamUsage(absl::Time now);

 private:
  class Batch;  // one batch's grants so far (lease_operations.cc)

  RowStore& store_;
  const StoreOptions& options_;
};

}  // namespace minions
