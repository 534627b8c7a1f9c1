#pragma once
// ControlPlaneClient: the executor's side of the Executors service — the transport seam. The real
// one speaks gRPC; tests substitute a fake that talks to a server in the same process.
// Threads: thread-safe (the agent's main and heartbeat threads share one).

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "minions/v1/minions.grpc.pb.h"

namespace minions {

class ControlPlaneClient {
 public:
  virtual ~ControlPlaneClient() = default;
  virtual absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request) = 0;
  virtual absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request) = 0;
  virtual absl::StatusOr<v1::LeaseResponse> Lease(const v1::LeaseRequest& request) = 0;
  virtual absl::Status Complete(const v1::CompleteRequest& request) = 0;
  virtual absl::StatusOr<v1::CompleteBatchResponse> CompleteBatch(const v1::CompleteBatchRequest& request) = 0;
  virtual absl::Status Fail(const v1::FailRequest& request) = 0;
  // Spot checks (docs/verification.md): verification tasks for this executor, and its verdicts.
  // Default: Unimplemented (a client that does not speak them; the agent then asks no more).
  virtual absl::StatusOr<v1::LeaseVerificationsResponse> LeaseVerifications(const v1::LeaseVerificationsRequest&) {
    return absl::UnimplementedError("this client does not lease verification tasks");
  }
  virtual absl::Status ReportVerifications(const v1::ReportVerificationsRequest&) {
    return absl::UnimplementedError("this client does not report verifications");
  }
  // Ends a Lease call now waiting (a long poll) early, from any thread: it returns Cancelled,
  // and the caller, not knowing whether tasks were granted, reclaims them on its next lease. A
  // call that has not started yet is not affected. Default: nothing to interrupt.
  virtual void InterruptLease() {}
  // Non-OK once the server refused this executor's credential (UNAUTHENTICATED: revoked or
  // expired): the executor then stops for good (docs/security.md, 40.7j). Default: never.
  virtual absl::Status CredentialRefused() const { return absl::OkStatus(); }
};

// Who the executor is to the server. An executor's identity is its credential (an executor
// token, mne_...), kept in `credential_file` (mode 0600, in its state folder). Without one, the
// first Register enrols: it trades `join_token` (once) for a server-named executor id and its
// credential, writes both into the state folder (credential_file and the executor-id file next to
// it), then registers as that executor. The credential is never put in the environment.
struct ExecutorCredentials {
  std::string credential_file;  // "": keep the credential in memory only (enrols at every start)
  std::string join_token;       // used when there is no credential yet
};

// The gRPC client on `channel` (rpc/tls.h OpenChannel).
std::unique_ptr<ControlPlaneClient> MakeGrpcControlPlaneClient(std::shared_ptr<grpc::Channel> channel,
                                                               ExecutorCredentials credentials);

}  // namespace minions
