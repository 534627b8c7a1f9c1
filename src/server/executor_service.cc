#include "server/executor_service.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/auth.h"
#include "server/keys.h"
#include "server/proto_convert.h"

namespace minions {
namespace {

#define RETURN_IF_UNAUTHENTICATED(context)                    \
  do {                                                        \
    grpc::Status _auth = CheckToken(context, options_.token); \
    if (!_auth.ok()) return _auth;                            \
  } while (0)

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

grpc::Status ExecutorService::Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                                       v1::RegisterResponse* reply) {
  RETURN_IF_UNAUTHENTICATED(context);
  auto executor = store_->RegisterExecutor(request->executor_id(), minions::FromProto(request->capabilities()),
                                           clock_->Now());
  if (!executor.ok()) return ToGrpc(executor.status());
  MINIONS_LOG(Info) << "executor=" << executor->id << " registered (" << executor->info.name << ", "
                    << executor->info.os << ", " << executor->info.chip << ")";
  reply->set_executor_id(executor->id);
  reply->set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.lease_ttl));
  return grpc::Status::OK;
}

grpc::Status ExecutorService::Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                                        v1::HeartbeatResponse* reply) {
  RETURN_IF_UNAUTHENTICATED(context);
  auto state = ParseExecutorState(request->state().empty() ? "available" : request->state());
  if (!state || *state == ExecutorState::kLost) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("unknown executor state '", request->state(), "'"));
  }
  std::vector<LeaseProgress> held;
  for (const auto& ref : request->leases()) held.push_back(FromProto(ref));
  auto answer = chunks_.Heartbeat(request->executor_id(), *state, request->state_reason(), held,
                                  options_.lease_ttl, clock_->Now());
  if (!answer.ok()) return ToGrpc(answer.status());
  for (const auto& c : answer->cancel) ToProto(c, reply->add_cancel());
  for (const auto& r : answer->renewed) ToProto(r, reply->add_renewed());
  reply->set_drain(answer->drain);
  reply->set_reregister(answer->unknown_executor);
  reply->set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.lease_ttl));
  return grpc::Status::OK;
}

grpc::Status ExecutorService::Lease(grpc::ServerContext* context, const v1::LeaseRequest* request,
                                    v1::LeaseResponse* reply) {
  RETURN_IF_UNAUTHENTICATED(context);
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
    leases = store_->LeaseTasks(request->executor_id(), max_tasks, options_.lease_ttl, now);
    if (!leases.ok()) return ToGrpc(leases.status());
    if (!leases->empty() || context->IsCancelled() || now >= deadline) break;
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
        (void)store_->FailTask(request->executor_id(), g.job_id, g.index, g.attempt, FailureClass::kPreempted,
                               "the server could not produce object URLs", now);
      }
      reply->clear_leases();
      return ToGrpc(urls);
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
    out->set_runner("llama");
    out->set_runner_options_json(DumpJson(lease.runner_options));
    out->set_lease_expires_at_ms(absl::ToUnixMillis(lease.expires_at));
    MINIONS_LOG(Debug) << "job=" << t.job_id << " task=" << t.index << " attempt=" << t.attempt
                       << " executor=" << request->executor_id() << " leased";
  }
  if (metrics_) {
    for (const minions::Lease& lease : *leases) metrics_->LeaseGranted(lease.task, now);
  }
  return grpc::Status::OK;
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
  RETURN_IF_UNAUTHENTICATED(context);
  const auto& ref = request->ref();
  auto outcomes = chunks_.CompleteTasks(request->executor_id(), {FromProto(ref)}, clock_->Now());
  if (!outcomes.ok()) return ToGrpc(outcomes.status());
  if (!outcomes->at(0).ok()) {
    MINIONS_LOG(Info) << "job=" << ref.job_id() << " task=" << ref.task_index() << " attempt=" << ref.attempt()
                      << " executor=" << request->executor_id() << " completion refused: " << outcomes->at(0).message();
    return ToGrpc(outcomes->at(0));
  }
  if (metrics_) metrics_->AttemptCompleted(request->executor_id(), FromProto(ref), clock_->Now());
  auto job = store_->GetJob(ref.job_id());
  if (job.ok() && job->state == JobState::kFinalizing && job_ready_) job_ready_(job->id);
  return grpc::Status::OK;
}

grpc::Status ExecutorService::CompleteBatch(grpc::ServerContext* context, const v1::CompleteBatchRequest* request,
                                            v1::CompleteBatchResponse* reply) {
  RETURN_IF_UNAUTHENTICATED(context);
  std::vector<LeaseProgress> reports;
  for (const auto& ref : request->refs()) reports.push_back(FromProto(ref));
  auto outcomes = chunks_.CompleteTasks(request->executor_id(), reports, clock_->Now());
  if (!outcomes.ok()) return ToGrpc(outcomes.status());
  std::set<std::string> jobs;
  for (size_t i = 0; i < outcomes->size(); ++i) {
    const absl::Status& outcome = (*outcomes)[i];
    v1::Outcome* out = reply->add_outcomes();
    out->set_code(static_cast<int>(outcome.code()));
    out->set_message(std::string(outcome.message()));
    if (outcome.ok()) {
      jobs.insert(reports[i].job_id);
      if (metrics_) metrics_->AttemptCompleted(request->executor_id(), reports[i], clock_->Now());
    } else {
      MINIONS_LOG(Info) << "job=" << reports[i].job_id << " task=" << reports[i].task_index
                        << " attempt=" << reports[i].attempt << " executor=" << request->executor_id()
                        << " completion refused: " << outcome.message();
    }
  }
  for (const auto& job_id : jobs) {
    auto job = store_->GetJob(job_id);
    if (job.ok() && job->state == JobState::kFinalizing && job_ready_) job_ready_(job->id);
  }
  return grpc::Status::OK;
}

grpc::Status ExecutorService::Fail(grpc::ServerContext* context, const v1::FailRequest* request, v1::FailResponse*) {
  RETURN_IF_UNAUTHENTICATED(context);
  auto failure = ParseFailureClass(request->failure_class());
  if (!failure) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("failure_class must be retryable, permanent or preempted, not '",
                                     request->failure_class(), "'"));
  }
  const auto& ref = request->ref();
  auto task = chunks_.FailTask(request->executor_id(), ref.job_id(), ref.task_index(), ref.attempt(), *failure,
                               request->message(), clock_->Now(), FromProto(ref).chunks);
  if (!task.ok()) return ToGrpc(task.status());
  if (metrics_) metrics_->AttemptFailed(request->executor_id(), *task, *failure, clock_->Now());
  MINIONS_LOG(Info) << "job=" << ref.job_id() << " task=" << ref.task_index() << " attempt=" << ref.attempt()
                    << " executor=" << request->executor_id() << " " << request->failure_class() << ": "
                    << request->message() << " -> " << TaskStateName(task->state);
  if (task->state == TaskState::kPending) NotifyWork();
  auto job = store_->GetJob(ref.job_id());
  if (job.ok() && job->state == JobState::kFinalizing && job_ready_) job_ready_(job->id);
  return grpc::Status::OK;
}

}  // namespace minions
