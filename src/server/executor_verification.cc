// ExecutorService's spot-check calls (proto: Executors.LeaseVerifications and
// ReportVerifications; docs/verification.md, "Spot checks"), apart from the task calls in
// executor_service.cc.

#include <algorithm>
#include <utility>

#include "common/logging.h"
#include "server/executor_service.h"
#include "server/proto_convert.h"
#include "server/spot_checks.h"

namespace minions {
namespace {

// The most verification tasks one call leases: each is small, and a verifier reports each soon.
constexpr int kMaxVerificationLeases = 4;

}  // namespace

grpc::Status ExecutorService::LeaseVerifications(grpc::ServerContext* context,
                                                 const v1::LeaseVerificationsRequest* request,
                                                 v1::LeaseVerificationsResponse* reply) {
  absl::StatusOr<std::string> executor_id = AuthorizeExecutor(context, request->executor_id());
  if (!executor_id.ok()) return ToGrpc(executor_id.status());
  return ToGrpc(LeaseVerifications(*executor_id, *request, reply));
}

grpc::Status ExecutorService::ReportVerifications(grpc::ServerContext* context,
                                                  const v1::ReportVerificationsRequest* request,
                                                  v1::ReportVerificationsResponse*) {
  absl::StatusOr<std::string> executor_id = AuthorizeExecutor(context, request->executor_id());
  if (!executor_id.ok()) return ToGrpc(executor_id.status());
  return ToGrpc(ReportVerifications(*executor_id, *request));
}

absl::StatusOr<std::vector<v1::VerificationItem>> ExecutorService::VerificationItems(const VerificationTask& check,
                                                                                     minions::Lease* job_lease) {
  ASSIGN_OR_RETURN(Job job, store_->GetJob(check.job_id));
  ASSIGN_OR_RETURN(Task task, store_->GetTask(check.job_id, check.task_index));
  ASSIGN_OR_RETURN(std::vector<v1::VerificationItem> items,
                   ReadVerificationItems(*blobs_, job.spec.input_key, task, check, options_.max_chunk_bytes));
  if (job_lease != nullptr) *job_lease = MakeLease(std::move(task), job.spec);
  return items;
}

absl::Status ExecutorService::LeaseVerifications(const std::string& executor_id,
                                                 const v1::LeaseVerificationsRequest& request,
                                                 v1::LeaseVerificationsResponse* reply) {
  // Spot checks off: nothing to lease, and nothing read (an idle agent asks between its polls).
  if (!options_.spot_checks) return absl::OkStatus();
  const int max_tasks = std::clamp(request.max_tasks(), 1, kMaxVerificationLeases);
  ASSIGN_OR_RETURN(std::vector<VerificationTask> checks,
                   store_->LeaseVerifications(executor_id, max_tasks, options_.lease_ttl, clock_->Now()));
  for (const VerificationTask& check : checks) {
    minions::Lease job;
    absl::StatusOr<std::vector<v1::VerificationItem>> items = VerificationItems(check, &job);
    if (!items.ok()) {
      // Not sent: its lease lapses and it is tried again later (the object store was away), or
      // it is ended when its chunk is redone.
      MINIONS_LOG(Warning) << "job=" << check.job_id << " task=" << check.task_index << " attempt=" << check.attempt
                           << " chunk " << check.seq << ": cannot send its spot check to executor=" << executor_id
                           << ": " << items.status().message();
      continue;
    }
    v1::VerificationLease lease;
    absl::Status filled = FillVerificationLease(*blobs_, options_.url_ttl, job, check, *std::move(items), lease);
    if (!filled.ok()) {
      MINIONS_LOG(Warning) << "job=" << check.job_id << ": cannot make the model URL of a spot check: "
                           << filled.message();
      continue;
    }
    *reply->add_leases() = std::move(lease);
  }
  return absl::OkStatus();
}

absl::Status ExecutorService::ReportVerifications(const std::string& executor_id,
                                                  const v1::ReportVerificationsRequest& request) {
  const VerificationTask key = VerificationKey(request.ref());
  const absl::Time now = clock_->Now();
  ASSIGN_OR_RETURN(VerificationTask check, store_->GetVerificationTask(key));
  // Refused before the object store is read for it; the store checks again as it writes.
  if (check.verifier_id != executor_id || !check.lease_expires_at || *check.lease_expires_at <= now) {
    return absl::PermissionDeniedError(absl::StrCat("executor ", executor_id,
                                                    " does not hold the lease of this verification task"));
  }
  if (static_cast<size_t>(request.verdicts_size()) != check.records.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the task has ", check.records.size(), " records; ",
                                                   request.verdicts_size(), " verdicts were reported"));
  }
  // The records' custom_ids as the job's input says them, never as the verifier does.
  ASSIGN_OR_RETURN(std::vector<v1::VerificationItem> items, VerificationItems(check, nullptr));
  std::vector<RecordVerdict> verdicts;
  for (int i = 0; i < request.verdicts_size(); ++i) {
    const v1::RecordVerdict& v = request.verdicts(i);
    const std::string& custom_id = items[static_cast<size_t>(i)].custom_id();
    if (custom_id.empty()) {
      // The input line is not JSON, so its answer is an error line, which the chunk checks
      // judged: no verifier's word on it counts, and none may hold the job back.
      verdicts.push_back(RecordVerdict{v.record(), "", false, false, "the record has no custom_id"});
      continue;
    }
    verdicts.push_back(RecordVerdict{v.record(), custom_id, v.checked(), v.passed(), v.reason()});
  }
  ASSIGN_OR_RETURN(Executor producer, store_->ReportVerifications(executor_id, check, verdicts, now));
  if (producer.state == ExecutorState::kQuarantined) {
    MINIONS_LOG(Warning) << "executor=" << producer.id << " quarantined: " << producer.state_reason;
    WorkArrived();  // its records in unpublished jobs are pending again, for others
  }
  if (!check.disputed_verifier.empty()) {
    // An arbitration: it upheld the producer's quarantine, or overruled the verifier.
    absl::StatusOr<Executor> verifier = store_->GetExecutor(check.disputed_verifier);
    if (verifier.ok() && verifier->state == ExecutorState::kQuarantined) {
      MINIONS_LOG(Warning) << "executor=" << verifier->id << " quarantined: " << verifier->state_reason;
      WorkArrived();  // the producer it accused is back, and its own records are pending again
    }
  }
  // The job's last open spot check: it may publish now rather than at the next sweep.
  if (absl::StatusOr<int64_t> open = store_->CountOpenVerifications(check.job_id);
      open.ok() && *open == 0 && job_ready_) {
    job_ready_(check.job_id);
  }
  return absl::OkStatus();
}

}  // namespace minions
