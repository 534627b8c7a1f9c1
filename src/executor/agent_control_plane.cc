#include "executor/agent_control_plane.h"

#include <algorithm>
#include <utility>

#include "executor/lease_proto.h"

namespace minions {
namespace {

void RefToProto(const AttemptRef& ref, v1::LeaseRef* out) {
  out->set_job_id(ref.job_id);
  out->set_task_index(ref.task_index);
  out->set_attempt(ref.attempt);
}

// The translation only: every decision is the agent's.
// Threads: as the client underneath (thread-safe).
class GrpcAgentControlPlane : public AgentControlPlane {
 public:
  explicit GrpcAgentControlPlane(std::unique_ptr<ControlPlaneClient> client) : client_(std::move(client)) {}

  absl::StatusOr<AgentRegistration> Register(const std::string& executor_id,
                                             const v1::Capabilities& capabilities) override {
    v1::RegisterRequest request;
    request.set_executor_id(executor_id);
    *request.mutable_capabilities() = capabilities;
    auto reply = client_->Register(request);
    if (!reply.ok()) return reply.status();
    return AgentRegistration{reply->executor_id(), absl::Milliseconds(reply->lease_ttl_ms()),
                             absl::Milliseconds(std::max<int64_t>(reply->idle_heartbeat_ms(), 0)),
                             reply->idle_polls_renew()};
  }

  absl::StatusOr<AgentBeatAnswer> Heartbeat(const AgentBeat& beat) override {
    v1::HeartbeatRequest request;
    request.set_executor_id(beat.executor_id);
    request.set_state(beat.state);
    request.set_state_reason(beat.state_reason);
    for (const LeaseProgress& lease : beat.leases) ToProto(lease, request.add_leases());
    for (const AttemptRef& duty : beat.gang_duties) RefToProto(duty, request.add_gang_duties());
    v1::ModelHoldings* holdings = request.mutable_holdings();
    holdings->set_loaded(beat.model_loaded);
    for (const std::string& digest : beat.models_cached) holdings->add_cached(digest);
    auto reply = client_->Heartbeat(request);
    if (!reply.ok()) return reply.status();
    AgentBeatAnswer answer;
    for (const v1::LeaseRef& ref : reply->cancel()) answer.cancel.push_back(FromProto(ref));
    answer.renewed = reply->renewed_size();
    answer.drain = reply->drain();
    answer.reregister = reply->reregister();
    return answer;
  }

  absl::StatusOr<AgentLeaseAnswer> Lease(const AgentLeaseAsk& ask) override {
    v1::LeaseRequest request;
    request.set_executor_id(ask.executor_id);
    request.set_max_tasks(ask.max_tasks);
    if (ask.wait > absl::ZeroDuration()) request.set_wait_ms(absl::ToInt64Milliseconds(ask.wait));
    request.set_idle(ask.idle);
    request.set_reclaim(ask.reclaim);
    for (const AttemptRef& ref : ask.held) RefToProto(ref, request.add_held());
    auto reply = client_->Lease(request);
    if (!reply.ok()) return reply.status();
    AgentLeaseAnswer answer;
    for (const v1::TaskLease& lease : reply->leases()) answer.leases.push_back(FromProto(lease));
    for (const v1::GangDuty& duty : reply->gang_duties()) answer.gang_duties.push_back(FromProto(duty));
    answer.drain = reply->drain();
    answer.reregister = reply->reregister();
    answer.idle_renewed = reply->idle_renewed();
    return answer;
  }

  absl::StatusOr<std::vector<absl::Status>> CompleteBatch(const std::string& executor_id,
                                                          const std::vector<LeaseProgress>& done) override {
    v1::CompleteBatchRequest request;
    request.set_executor_id(executor_id);
    for (const LeaseProgress& progress : done) ToProto(progress, request.add_refs());
    auto reply = client_->CompleteBatch(request);
    if (!reply.ok()) return reply.status();
    std::vector<absl::Status> outcomes;
    for (size_t i = 0; i < done.size(); ++i) {
      if (i >= static_cast<size_t>(reply->outcomes_size())) {
        outcomes.push_back(absl::UnknownError("no answer"));
        continue;
      }
      const v1::Outcome& outcome = reply->outcomes(static_cast<int>(i));
      outcomes.push_back(outcome.code() == 0
                             ? absl::OkStatus()
                             : absl::Status(static_cast<absl::StatusCode>(outcome.code()), outcome.message()));
    }
    return outcomes;
  }

  absl::Status Fail(const std::string& executor_id, const LeaseProgress& progress, FailureClass failure,
                    const std::string& message) override {
    v1::FailRequest request;
    request.set_executor_id(executor_id);
    ToProto(progress, request.mutable_ref());
    request.set_failure_class(std::string(FailureClassName(failure)));
    request.set_message(message);
    return client_->Fail(request);
  }

  absl::StatusOr<std::vector<VerificationGrant>> LeaseVerifications(const std::string& executor_id,
                                                                   int max_tasks) override {
    v1::LeaseVerificationsRequest request;
    request.set_executor_id(executor_id);
    request.set_max_tasks(max_tasks);
    auto reply = client_->LeaseVerifications(request);
    if (!reply.ok()) return reply.status();
    std::vector<VerificationGrant> grants;
    for (const v1::VerificationLease& lease : reply->leases()) {
      VerificationGrant grant;
      grant.job.ref = AttemptRef{lease.ref().job_id(), lease.ref().task_index(), lease.ref().attempt()};
      grant.seq = lease.ref().seq();
      grant.job.model = lease.model();
      grant.job.runner = lease.runner();
      grant.job.runner_options_json = lease.runner_options_json();
      grant.job.model_digest = lease.model_digest();
      grant.job.model_size_bytes = lease.model_size_bytes();
      grant.job.model_url = lease.model_url();
      grant.job.expires_at = absl::FromUnixMillis(lease.lease_expires_at_ms());
      for (const v1::VerificationItem& item : lease.items()) {
        grant.items.push_back({item.record(), item.custom_id(), item.input_line(), item.output_line()});
      }
      grants.push_back(std::move(grant));
    }
    return grants;
  }

  absl::Status ReportVerifications(const std::string& executor_id, const VerificationGrant& grant,
                                   const std::vector<RecordVerdict>& verdicts) override {
    v1::ReportVerificationsRequest request;
    request.set_executor_id(executor_id);
    v1::VerificationRef* ref = request.mutable_ref();
    ref->set_job_id(grant.job.ref.job_id);
    ref->set_task_index(grant.job.ref.task_index);
    ref->set_attempt(grant.job.ref.attempt);
    ref->set_seq(grant.seq);
    for (const RecordVerdict& verdict : verdicts) {
      v1::RecordVerdict* out = request.add_verdicts();
      out->set_record(verdict.record);
      out->set_checked(verdict.checked);
      out->set_passed(verdict.passed);
      out->set_reason(verdict.reason);
    }
    return client_->ReportVerifications(request);
  }

  void InterruptLease() override { client_->InterruptLease(); }
  absl::Status CredentialRefused() const override { return client_->CredentialRefused(); }

 private:
  const std::unique_ptr<ControlPlaneClient> client_;
};

}  // namespace

std::unique_ptr<AgentControlPlane> MakeAgentControlPlane(std::unique_ptr<ControlPlaneClient> client) {
  return std::make_unique<GrpcAgentControlPlane>(std::move(client));
}

}  // namespace minions
