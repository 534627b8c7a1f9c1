#include "server/executor_service.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "model/model_ref.h"
#include "server/call_auth.h"
#include "server/keys.h"
#include "server/proto_convert.h"

namespace minions {
namespace {

// Authorises the call as an executor and declares `executor_id`, the one its credential names.
#define EXECUTOR_OR_RETURN(context, claimed)                                        \
  absl::StatusOr<std::string> executor_or = AuthorizeExecutor(context, claimed);    \
  if (!executor_or.ok()) return ToGrpc(executor_or.status());                       \
  const std::string& executor_id = *executor_or

// Most chunk URL pairs one lease carries: an attempt that runs out writes the rest of its task as
// its last chunk (it checkpoints less often, and loses nothing).
constexpr int64_t kMaxChunkUrls = 32;

// How often a long-polling Lease looks again for work another server may have made leasable.
constexpr absl::Duration kLeasePoll = absl::Milliseconds(50);

LeaseProgress FromProto(const v1::LeaseRef& ref) {
  LeaseProgress progress{ref.job_id(), ref.task_index(), ref.attempt(), ref.records_done(), ref.records_failed(), {}};
  for (const auto& c : ref.chunks()) {
    // A chunk in a report belongs to the report's attempt, whatever it says.
    progress.chunks.push_back({ref.attempt(), c.seq(), c.begin(), c.end(), c.records_failed()});
  }
  return progress;
}

void ToProto(const LeaseProgress& p, v1::LeaseRef* ref) {
  ref->set_job_id(p.job_id);
  ref->set_task_index(p.task_index);
  ref->set_attempt(p.attempt);
  ref->set_records_done(p.records_done);
  ref->set_records_failed(p.records_failed);
}

}  // namespace

absl::Status ExecutorService::FillObjectUrls(const minions::Lease& lease, v1::TaskLease& out) {
  const Task& t = lease.task;
  auto input = blobs_->Url(lease.input_key, UrlAccess::kRead, options_.url_ttl);
  if (!input.ok()) return input.status();
  out.set_input_url(*input);
  if (!lease.model_digest.empty()) {
    // Content-addressed under the job's team: the executor verifies the digest before loading.
    auto model = blobs_->Url(keys::ModelBlob(lease.team, std::string(DigestHex(lease.model_digest))), UrlAccess::kRead,
                             options_.url_ttl);
    if (!model.ok()) return model.status();
    out.set_model_url(*model);
    out.set_model_digest(lease.model_digest);
    out.set_model_size_bytes(lease.model_size_bytes);
  }
  // One pair per chunk the attempt may write: a record per chunk at most, kMaxChunkUrls in all.
  const int first_seq = NextChunkSeq(t);
  const int64_t n_urls = std::clamp<int64_t>(t.n_records - CommittedRecords(t), 1, kMaxChunkUrls);
  for (int64_t k = 0; k < n_urls; ++k) {
    const int seq = first_seq + static_cast<int>(k);
    auto output = blobs_->Url(keys::ChunkOutput(t.job_id, t.index, t.attempt, seq), UrlAccess::kWrite, options_.url_ttl);
    if (!output.ok()) return output.status();
    auto errors = blobs_->Url(keys::ChunkErrors(t.job_id, t.index, t.attempt, seq), UrlAccess::kWrite, options_.url_ttl);
    if (!errors.ok()) return errors.status();
    v1::ChunkUrls* urls = out.add_chunk_urls();
    urls->set_output_url(*output);
    urls->set_errors_url(*errors);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ExecutorService::AuthorizeExecutor(const grpc::ServerContext* context,
                                                                const std::string& claimed) {
  absl::StatusOr<Caller> caller = AuthorizeCall(context, *auth_, Scope::kExecutor);
  if (!caller.ok()) return caller.status();
  const std::string id = caller->executor_id();
  if (id.empty()) return absl::PermissionDeniedError("this credential is bound to no executor");
  if (!claimed.empty() && claimed != id) {
    MINIONS_LOG(Warning) << "executor=" << id << " (" << context->peer() << ") called as executor " << claimed
                         << ": refused";
    return absl::PermissionDeniedError(absl::StrCat("this credential belongs to executor ", id, ", not ", claimed));
  }
  return id;
}

grpc::Status ExecutorService::Enrol(grpc::ServerContext* context, const v1::EnrolRequest* request,
                                    v1::EnrolResponse* reply) {
  absl::StatusOr<Enrolment> enrolment = identities_->Enrol(BearerToken(context), minions::FromProto(request->capabilities()));
  if (!enrolment.ok()) {
    MINIONS_LOG(Info) << "refused an enrolment from " << context->peer() << ": " << enrolment.status().message();
    return ToGrpc(enrolment.status());
  }
  MINIONS_LOG(Info) << "executor=" << enrolment->executor.id << " enrolled (" << enrolment->executor.info.name
                    << ", " << context->peer() << ") with join token " << enrolment->credential.record.created_by;
  reply->set_executor_id(enrolment->executor.id);
  reply->set_credential(enrolment->credential.text);
  reply->set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.lease_ttl));
  return grpc::Status::OK;
}

grpc::Status ExecutorService::Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                                       v1::RegisterResponse* reply) {
  EXECUTOR_OR_RETURN(context, request->executor_id());
  return ToGrpc(Register(executor_id, *request, reply));
}

absl::Status ExecutorService::Register(const std::string& executor_id, const v1::RegisterRequest& request,
                                       v1::RegisterResponse* reply) {
  auto executor = store_->RegisterExecutor(executor_id, minions::FromProto(request.capabilities()), clock_->Now());
  if (!executor.ok()) return executor.status();
  if (executor->state == ExecutorState::kRevoked) {
    return absl::PermissionDeniedError(absl::StrCat("executor ", executor_id, " was revoked by an admin"));
  }
  MINIONS_LOG(Info) << "executor=" << executor->id << " registered (" << executor->info.name << ", "
                    << executor->info.os << ", " << executor->info.chip << ")";
  reply->set_executor_id(executor->id);
  reply->set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.lease_ttl));
  return absl::OkStatus();
}

grpc::Status ExecutorService::Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                                        v1::HeartbeatResponse* reply) {
  EXECUTOR_OR_RETURN(context, request->executor_id());
  return ToGrpc(Heartbeat(executor_id, *request, reply));
}

absl::Status ExecutorService::Heartbeat(const std::string& executor_id, const v1::HeartbeatRequest& request,
                                        v1::HeartbeatResponse* reply) {
  auto state = ParseExecutorState(request.state().empty() ? "available" : request.state());
  if (!state || *state == ExecutorState::kLost || *state == ExecutorState::kRevoked) {
    return absl::InvalidArgumentError(absl::StrCat("unknown executor state '", request.state(), "'"));
  }
  std::vector<LeaseProgress> held;
  for (const auto& ref : request.leases()) held.push_back(FromProto(ref));
  // The executor's reason is not kept: why its owner is present never leaves the machine.
  std::optional<ModelHoldings> holdings;
  if (request.has_holdings()) holdings = minions::FromProto(request.holdings());
  auto answer = chunks_.Heartbeat(executor_id, *state, "", held, options_.lease_ttl, clock_->Now(), holdings);
  if (!answer.ok()) return answer.status();
  for (const auto& c : answer->cancel) ToProto(c, reply->add_cancel());
  for (const auto& r : answer->renewed) ToProto(r, reply->add_renewed());
  reply->set_drain(answer->drain);
  reply->set_reregister(answer->unknown_executor);
  reply->set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.lease_ttl));
  return absl::OkStatus();
}

grpc::Status ExecutorService::Lease(grpc::ServerContext* context, const v1::LeaseRequest* request,
                                    v1::LeaseResponse* reply) {
  EXECUTOR_OR_RETURN(context, request->executor_id());
  return ToGrpc(Lease(executor_id, context, *request, reply));
}

absl::Status ExecutorService::Lease(const std::string& executor_id, const grpc::ServerContext* context,
                                    const v1::LeaseRequest& request_ref, v1::LeaseResponse* reply) {
  const v1::LeaseRequest* request = &request_ref;
  int max_tasks = std::clamp(request->max_tasks(), 1, 64);
  // Long poll: retry when notified of new work here, and every kLeasePoll for work that arrived
  // through another server. Bounded, so a stuck executor call never outlives its usefulness.
  const absl::Duration wait = absl::Milliseconds(std::clamp<int64_t>(request->wait_ms(), 0, 30000));
  const absl::Time deadline = clock_->Now() + wait;
  absl::Time now;
  absl::StatusOr<std::vector<minions::Lease>> leases;
  while (true) {
    uint64_t generation;
    {
      absl::MutexLock lock(&work_mu_);
      generation = work_generation_;
    }
    now = clock_->Now();
    leases = store_->LeaseTasks(executor_id, max_tasks, options_.lease_ttl, now);
    if (!leases.ok()) return leases.status();
    if (!leases->empty() || (context && context->IsCancelled()) || now >= deadline) break;
    absl::MutexLock lock(&work_mu_);
    auto notified = [&] {
      work_mu_.AssertHeld();
      return work_generation_ != generation || stopping_;
    };
    clock_->AwaitWithDeadline(work_mu_, absl::Condition(&notified), std::min(deadline, now + kLeasePoll));
    if (stopping_) break;
  }
  reply->set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.lease_ttl));
  for (const minions::Lease& lease : *leases) {
    const Task& t = lease.task;
    v1::TaskLease* out = reply->add_leases();
    absl::Status urls = FillObjectUrls(lease, *out);
    if (!urls.ok()) {
      // An error reply carries no leases, so hand back every task granted by this call (not just
      // this one): the executor never learns of them, and letting their leases expire would count
      // a failure against each. Preempted: straight back to pending, not counted.
      for (const minions::Lease& granted : *leases) {
        const Task& g = granted.task;
        (void)store_->FailTask(executor_id, g.job_id, g.index, g.attempt, FailureClass::kPreempted,
                               "the server could not produce object URLs", now);
      }
      reply->clear_leases();
      return urls;
    }
    out->mutable_ref()->set_job_id(t.job_id);
    out->mutable_ref()->set_task_index(t.index);
    out->mutable_ref()->set_attempt(t.attempt);
    out->set_first_record(t.first_record);
    out->set_n_records(t.n_records);
    out->set_byte_begin(t.byte_begin);
    out->set_byte_end(t.byte_end);
    out->set_resume_from(CommittedRecords(t));
    out->set_model(lease.job_model);
    out->set_runner(lease.runner.empty() ? "llama" : lease.runner);
    out->set_runner_options_json(DumpJson(lease.runner_options));
    out->set_lease_expires_at_ms(absl::ToUnixMillis(lease.expires_at));
    MINIONS_LOG(Debug) << "job=" << t.job_id << " task=" << t.index << " attempt=" << t.attempt
                       << " executor=" << executor_id << " leased";
  }
  if (metrics_) {
    for (const minions::Lease& lease : *leases) metrics_->LeaseGranted(lease.task, now);
  }
  return absl::OkStatus();
}

void ExecutorService::NotifyWork() {
  absl::MutexLock lock(&work_mu_);
  ++work_generation_;
}

void ExecutorService::Shutdown() {
  absl::MutexLock lock(&work_mu_);
  stopping_ = true;
}

grpc::Status ExecutorService::Complete(grpc::ServerContext* context, const v1::CompleteRequest* request,
                                       v1::CompleteResponse*) {
  EXECUTOR_OR_RETURN(context, request->executor_id());
  return ToGrpc(Complete(executor_id, *request));
}

absl::Status ExecutorService::Complete(const std::string& executor_id, const v1::CompleteRequest& request) {
  const auto& ref = request.ref();
  auto outcomes = chunks_.CompleteTasks(executor_id, {FromProto(ref)}, clock_->Now());
  if (!outcomes.ok()) return outcomes.status();
  if (!outcomes->at(0).ok()) {
    MINIONS_LOG(Info) << "job=" << ref.job_id() << " task=" << ref.task_index() << " attempt=" << ref.attempt()
                      << " executor=" << executor_id << " completion refused: " << outcomes->at(0).message();
    return outcomes->at(0);
  }
  if (metrics_) metrics_->AttemptCompleted(executor_id, FromProto(ref), clock_->Now());
  auto job = store_->GetJob(ref.job_id());
  if (job.ok() && job->state == JobState::kFinalizing && job_ready_) job_ready_(job->id);
  return absl::OkStatus();
}

grpc::Status ExecutorService::CompleteBatch(grpc::ServerContext* context, const v1::CompleteBatchRequest* request,
                                            v1::CompleteBatchResponse* reply) {
  EXECUTOR_OR_RETURN(context, request->executor_id());
  return ToGrpc(CompleteBatch(executor_id, *request, reply));
}

absl::Status ExecutorService::CompleteBatch(const std::string& executor_id, const v1::CompleteBatchRequest& request_ref,
                                            v1::CompleteBatchResponse* reply) {
  const v1::CompleteBatchRequest* request = &request_ref;
  std::vector<LeaseProgress> reports;
  for (const auto& ref : request->refs()) reports.push_back(FromProto(ref));
  auto outcomes = chunks_.CompleteTasks(executor_id, reports, clock_->Now());
  if (!outcomes.ok()) return outcomes.status();
  std::set<std::string> jobs;
  for (size_t i = 0; i < outcomes->size(); ++i) {
    const absl::Status& outcome = (*outcomes)[i];
    v1::Outcome* out = reply->add_outcomes();
    out->set_code(static_cast<int>(outcome.code()));
    out->set_message(std::string(outcome.message()));
    if (outcome.ok()) {
      jobs.insert(reports[i].job_id);
      if (metrics_) metrics_->AttemptCompleted(executor_id, reports[i], clock_->Now());
    } else {
      MINIONS_LOG(Info) << "job=" << reports[i].job_id << " task=" << reports[i].task_index
                        << " attempt=" << reports[i].attempt << " executor=" << executor_id
                        << " completion refused: " << outcome.message();
    }
  }
  for (const auto& job_id : jobs) {
    auto job = store_->GetJob(job_id);
    if (job.ok() && job->state == JobState::kFinalizing && job_ready_) job_ready_(job->id);
  }
  return absl::OkStatus();
}

grpc::Status ExecutorService::Fail(grpc::ServerContext* context, const v1::FailRequest* request, v1::FailResponse*) {
  EXECUTOR_OR_RETURN(context, request->executor_id());
  return ToGrpc(Fail(executor_id, *request));
}

absl::Status ExecutorService::Fail(const std::string& executor_id, const v1::FailRequest& request) {
  auto failure = ParseFailureClass(request.failure_class());
  if (!failure) {
    return absl::InvalidArgumentError(absl::StrCat("failure_class must be retryable, permanent or preempted, not '",
                                                   request.failure_class(), "'"));
  }
  const auto& ref = request.ref();
  auto task = chunks_.FailTask(executor_id, ref.job_id(), ref.task_index(), ref.attempt(), *failure,
                               request.message(), clock_->Now(), FromProto(ref).chunks);
  if (!task.ok()) return task.status();
  if (metrics_) metrics_->AttemptFailed(executor_id, *task, *failure, clock_->Now());
  MINIONS_LOG(Info) << "job=" << ref.job_id() << " task=" << ref.task_index() << " attempt=" << ref.attempt()
                    << " executor=" << executor_id << " " << request.failure_class() << ": " << request.message()
                    << " -> " << TaskStateName(task->state);
  if (task->state == TaskState::kPending) NotifyWork();
  auto job = store_->GetJob(ref.job_id());
  if (job.ok() && job->state == JobState::kFinalizing && job_ready_) job_ready_(job->id);
  return absl::OkStatus();
}

}  // namespace minions
