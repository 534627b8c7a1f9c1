// ExecutorService's credential rotation (docs/security.md, "Credential lifetimes"): an executor
// exchanges its credential, while it is still usable, for a new one, so that credentials can
// expire without an operator re-enrolling the fleet. Kept apart from executor_service.cc, which
// holds the work calls.

#include <algorithm>

#include "common/logging.h"
#include "server/executor_service.h"
#include "server/proto_convert.h"

namespace minions {

std::optional<absl::Duration> ExecutorService::RotateIn(const Caller& caller) const {
  const absl::Time at = identities_->RotateAt(caller.issued_at, caller.expires_at);
  if (at == absl::InfiniteFuture()) return std::nullopt;
  return std::max(at - clock_->Now(), absl::ZeroDuration());
}

grpc::Status ExecutorService::RotateCredential(grpc::ServerContext* context, const v1::RotateCredentialRequest* request,
                                               v1::RotateCredentialResponse* reply) {
  Caller caller;
  absl::StatusOr<std::string> executor_id = AuthorizeExecutor(context, request->executor_id(), &caller);
  if (!executor_id.ok()) return ToGrpc(executor_id.status());
  absl::StatusOr<IssuedToken> issued = identities_->RotateExecutorCredential(*executor_id, caller.token_id);
  if (!issued.ok()) {
    MINIONS_LOG(Warning) << "executor=" << *executor_id << " could not rotate credential " << caller.token_id << ": "
                         << issued.status().message();
    return ToGrpc(issued.status());
  }
  // Read again on this server's next call with it: its expiry is now the grace's end.
  auth_->Forget(caller.token_id);
  const absl::Time now = clock_->Now();
  const absl::Time old_expires = now + identities_->policy().rotation_grace;
  MINIONS_LOG(Info) << "executor=" << *executor_id << " exchanged credential " << caller.token_id << " for "
                    << issued->record.id;
  reply->set_credential(issued->text);
  if (issued->record.expires_at) reply->set_expires_at_ms(absl::ToUnixMillis(*issued->record.expires_at));
  if (std::optional<absl::Duration> in = RotateIn(Caller::From(issued->record))) {
    reply->set_rotates(true);
    reply->set_rotate_in_ms(absl::ToInt64Milliseconds(*in));
  }
  const absl::Time old_end = caller.expires_at ? std::min(*caller.expires_at, old_expires) : old_expires;
  reply->set_old_expires_at_ms(absl::ToUnixMillis(old_end));
  return grpc::Status::OK;
}

}  // namespace minions
