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
#include "store/row_store.h"

namespace minions {

class VerificationOperations {
 public:
  explicit VerificationOperations(RowStore& store) : store_(store) {}

  absl::StatusOr<Executor> RecordVerification(const Verification& verification, absl::Time now);
  absl::StatusOr<std::vector<Verification>> ListVerifications(const std::string& job_id);
  absl::StatusOr<Executor> ReleaseExecutor(const std::string& executor_id, absl::Time now);

 private:
  RowStore& store_;
};

}  // namespace minions
