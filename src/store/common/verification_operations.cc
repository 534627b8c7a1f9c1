#include "store/common/verification_operations.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "store/common/row_access.h"

namespace minions {

absl::StatusOr<Executor> VerificationOperations::RecordVerification(const Verification& verification,
                                                                    absl::Time now) {
  if (verification.producer_id == verification.verifier_id) {
    return absl::InvalidArgumentError("an executor cannot verify its own answers");
  }
  if (verification.custom_id.empty()) return absl::InvalidArgumentError("a verification names the record it checked");
  Verification row = verification;
  row.at = now;
  if (row.passed) row.reason.clear();
  if (row.reason.size() > kMaxVerificationReason) row.reason.resize(kMaxVerificationReason);
  return RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::StatusOr<Executor> {
    // Lock order: executors (in id order), then jobs.
    ASSIGN_OR_RETURN(Rows rows, t.Read(RowKeys{.executors = {row.producer_id, row.verifier_id}}));
    auto producer = rows.executors.find(row.producer_id);
    if (producer == rows.executors.end()) return row_access::NoExecutor(row.producer_id);
    if (!rows.executors.contains(row.verifier_id)) return row_access::NoExecutor(row.verifier_id);
    ASSIGN_OR_RETURN(Job job, row_access::LoadJob(t, row.job_id, Locking::kNone));
    (void)job;
    RETURN_IF_ERROR(t.InsertVerification(row));
    if (row.passed) return producer->second;
    Quarantine(producer->second, row);
    RETURN_IF_ERROR(t.Update(RowWrites{.executors = {producer->second}}, /*last=*/true));
    return producer->second;
  });
}

absl::StatusOr<std::vector<Verification>> VerificationOperations::ListVerifications(const std::string& job_id) {
  return RunTransaction(store_, TransactionKind::kRead,
                        [&](RowTransaction& t) -> absl::StatusOr<std::vector<Verification>> {
                          RETURN_IF_ERROR(row_access::LoadJob(t, job_id, Locking::kNone).status());
                          return t.VerificationsOfJob(job_id);
                        });
}

absl::StatusOr<Executor> VerificationOperations::ReleaseExecutor(const std::string& executor_id, absl::Time now) {
  (void)now;
  return RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::StatusOr<Executor> {
    ASSIGN_OR_RETURN(Executor executor, row_access::LoadExecutor(t, executor_id));
    RETURN_IF_ERROR(Release(executor));
    RETURN_IF_ERROR(t.Update(RowWrites{.executors = {executor}}, /*last=*/true));
    return executor;
  });
}

}  // namespace minions
