#pragma once
// FailoverControlPlaneClient: an executor's client to a fleet of servers named by several
// addresses (`minions executor --server A,B,C`; docs/operations.md, "Several servers"). Every
// call goes to the current server. When it has answered nothing but UNAVAILABLE (refused, reset:
// nobody listens there) for `give_up_after`, it is taken as gone and the next address is used: a
// client is opened to it then (so it reads the credential an enrolment wrote meanwhile), the
// executor registers there with its last registration, and the failed call is tried there once.
// A shorter outage (a restart, a blip) is ridden out by the agent's own retries on the same
// server. The servers share one store, so the executor's leases, id and credential hold on each.
//
// Ownership: owns the clients it opened; borrows the clock.
// Threads: thread-safe (the agent's main and heartbeat threads share one); no lock is held
// during a call, so a long poll on one thread never delays a heartbeat on another.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "executor/control_plane_client.h"

namespace minions {

class FailoverControlPlaneClient : public ControlPlaneClient {
 public:
  using Opener = std::function<absl::StatusOr<std::unique_ptr<ControlPlaneClient>>(const std::string& address)>;
  static constexpr absl::Duration kDefaultGiveUpAfter = absl::Seconds(5);

  // `addresses`: at least one; the first is used first.
  FailoverControlPlaneClient(std::vector<std::string> addresses, Opener open, Clock* clock,
                             absl::Duration give_up_after = kDefaultGiveUpAfter);

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request) override;
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request) override;
  absl::StatusOr<v1::LeaseResponse> Lease(const v1::LeaseRequest& request) override;
  absl::Status Complete(const v1::CompleteRequest& request) override;
  absl::StatusOr<v1::CompleteBatchResponse> CompleteBatch(const v1::CompleteBatchRequest& request) override;
  absl::Status Fail(const v1::FailRequest& request) override;
  absl::StatusOr<v1::LeaseVerificationsResponse> LeaseVerifications(
      const v1::LeaseVerificationsRequest& request) override;
  absl::Status ReportVerifications(const v1::ReportVerificationsRequest& request) override;
  void InterruptLease() override;

  // The address calls go to now.
  std::string current_address() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Current {
    std::shared_ptr<ControlPlaneClient> client;  // null: the address could not be opened
    size_t index = 0;
  };
  Current Now() ABSL_LOCKS_EXCLUDED(mu_);
  // After a call to `used` ended with `status`: notes the server's answer and, when it has been
  // unreachable for give_up_after, moves to the next address that opens and registers. True when
  // the call should be tried again (on the server moved to).
  bool Failed(const Current& used, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  void Answered(const Current& used) ABSL_LOCKS_EXCLUDED(mu_);

  // Calls `call` on the current server, and once more on the next when it moved on.
  template <typename Result>
  Result Run(const std::function<Result(ControlPlaneClient&)>& call);

  const std::vector<std::string> addresses_;
  const Opener open_;
  Clock* clock_;
  const absl::Duration give_up_after_;
  mutable absl::Mutex mu_;
  Current current_ ABSL_GUARDED_BY(mu_);
  absl::Time unreachable_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // Future: it answers
  std::optional<v1::RegisterRequest> registration_ ABSL_GUARDED_BY(mu_);  // the last one sent
};

}  // namespace minions
