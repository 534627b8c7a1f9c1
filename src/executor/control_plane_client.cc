#include "executor/control_plane_client.h"

#include "rpc/rpc.h"

namespace minions {
namespace {

class GrpcControlPlaneClient : public ControlPlaneClient {
 public:
  GrpcControlPlaneClient(const std::string& address, std::string token)
      : stub_(v1::Executors::NewStub(rpc::MakeChannel(address))), token_(std::move(token)) {}

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request) override {
    return Call(&v1::Executors::Stub::Register, request, v1::RegisterResponse());
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request) override {
    return Call(&v1::Executors::Stub::Heartbeat, request, v1::HeartbeatResponse());
  }
  absl::StatusOr<v1::LeaseResponse> Lease(const v1::LeaseRequest& request) override {
    return Call(&v1::Executors::Stub::Lease, request, v1::LeaseResponse());
  }
  absl::Status Complete(const v1::CompleteRequest& request) override {
    return Call(&v1::Executors::Stub::Complete, request, v1::CompleteResponse()).status();
  }
  absl::StatusOr<v1::CompleteBatchResponse> CompleteBatch(const v1::CompleteBatchRequest& request) override {
    return Call(&v1::Executors::Stub::CompleteBatch, request, v1::CompleteBatchResponse());
  }
  absl::Status Fail(const v1::FailRequest& request) override {
    return Call(&v1::Executors::Stub::Fail, request, v1::FailResponse()).status();
  }

 private:
  template <typename Method, typename Request, typename Reply>
  absl::StatusOr<Reply> Call(Method method, const Request& request, Reply reply) {
    grpc::ClientContext context;
    rpc::Prepare(context, token_, absl::Seconds(10));
    grpc::Status status = ((*stub_).*method)(&context, request, &reply);
    if (!status.ok()) return rpc::FromGrpc(status);
    return reply;
  }

  std::unique_ptr<v1::Executors::Stub> stub_;
  std::string token_;
};

}  // namespace

std::unique_ptr<ControlPlaneClient> MakeGrpcControlPlaneClient(const std::string& address, const std::string& token) {
  return std::make_unique<GrpcControlPlaneClient>(address, token);
}

}  // namespace minions
