#pragma once
// ControlPlaneClient: the executor's side of the Executors service — the transport seam. The real
// one speaks gRPC; tests substitute a fake that talks to a server in the same process.
// Threads: thread-safe (the agent's main and heartbeat threads share one).

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
};

std::unique_ptr<ControlPlaneClient> MakeGrpcControlPlaneClient(const std::string& address, const std::string& token);

}  // namespace minions
