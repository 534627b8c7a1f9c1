#pragma once
// VerificationOperations: the MetadataStore's verification records (issue 38,
// docs/verification.md), written once over a RowStore (store/row_store.h): a verifier's verdict on
// one record, which quarantines the producer when it failed, in the same transaction; the
// verdicts of a job; an admin's release of a quarantined executor.
// Borrows the store. Thread-safe.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/verification.h"
#include "store/metadata_store.h"
#include "store/row_store.h"

namespace minions {

class VerificationOperations {
 public:
  VerificationOperations(RowStore& store, const StoreOptions& options) : store_(store), options_(options) {}

  absl::StatusOr<Executor> RecordVerification(const Verification& verification, absl::Time now);
  absl::StatusOr<std::vector<Verification>> ListVerifications(const std::string& job_id);
  absl::StatusOr<Executor> ReleaseExecutor(const std::string& executor_id, absl::Time now);

  // Spot checks (MetadataStore's).
  absl::StatusOr<std::vector<VerificationTask>> LeaseVerifications(const std::string& executor_id, int max_tasks,
                                                                   absl::Duration ttl, absl::Time now);
  absl::StatusOr<Executor> ReportVerifications(const std::string& verifier_id, const VerificationTask& key,
                                               const std::vector<RecordVerdict>& verdicts, absl::Time now);
  absl::StatusOr<VerificationTask> GetVerificationTask(const VerificationTask& key);
  absl::StatusOr<int64_t> CountOpenVerifications(const std::string& job_id);

  // Draws the spot checks of the chunks `after` committed beyond `before` (the same task before
  // and after a transition in the caller's transaction), whose producer is `producer`: stamps
  // each new chunk with its producer and inserts the verification tasks drawn (StoreOptions
  // spot_checks and verification). `producer_records_done`: the producer's records so far.
  static absl::Status DrawSpotChecks(RowTransaction& t, const StoreOptions& options, const Task& before, Task& after,
                                     const std::string& producer, int64_t producer_records_done, absl::Time now);

 private:
  RowStore& store_;
  const StoreOptions& options_;
};

}  // namespace minions
