#include "executor/control_plane_client.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/private_files.h"
#include "rpc/rpc.h"

namespace minions {
namespace {

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

class GrpcControlPlaneClient : public ControlPlaneClient {
 public:
  GrpcControlPlaneClient(std::shared_ptr<grpc::Channel> channel, ExecutorCredentials credentials)
      : stub_(v1::Executors::NewStub(channel)), credentials_(std::move(credentials)) {
    if (!credentials_.credential_file.empty()) {
      struct stat st;
      if (stat(credentials_.credential_file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
        // Tightened rather than refused: the file is this executor's own, in its state folder.
        MINIONS_LOG(Warning) << credentials_.credential_file << " was readable by others; now mode 0600";
        (void)chmod(credentials_.credential_file.c_str(), 0600);
      }
      credential_ = ReadFirstLine(credentials_.credential_file);
    }
  }

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request) override {
    v1::RegisterRequest to_send = request;
    if (Credential().empty()) {
      absl::StatusOr<std::string> enrolled = Enrol(request.capabilities());
      if (!enrolled.ok()) return enrolled.status();
      to_send.set_executor_id(*enrolled);
    }
    return Call(&v1::Executors::Stub::Register, to_send, v1::RegisterResponse());
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
  std::string Credential() {
    absl::MutexLock lock(&mu_);
    return credential_;
  }

  // Trades the join token for this executor's credential; returns the executor id.
  absl::StatusOr<std::string> Enrol(const v1::Capabilities& capabilities) {
    if (credentials_.join_token.empty()) {
      return absl::UnauthenticatedError(
          "this executor has no credential yet: start it with a join token (--join-token-file FILE, "
          "from `minions admin join-token` on the server)");
    }
    v1::EnrolRequest request;
    *request.mutable_capabilities() = capabilities;
    grpc::ClientContext context;
    rpc::Prepare(context, credentials_.join_token, absl::Seconds(10));
    v1::EnrolResponse reply;
    grpc::Status status = stub_->Enrol(&context, request, &reply);
    if (!status.ok()) return rpc::FromGrpc(status);
    if (!credentials_.credential_file.empty()) {
      // The id first: a credential without its id would be a credential for an unknown executor.
      std::filesystem::path folder = std::filesystem::path(credentials_.credential_file).parent_path();
      if (auto s = WritePrivateFile((folder / "executor-id").string(), reply.executor_id() + "\n"); !s.ok()) return s;
      if (auto s = WritePrivateFile(credentials_.credential_file, reply.credential() + "\n"); !s.ok()) return s;
    }
    MINIONS_LOG(Info) << "enrolled as executor=" << reply.executor_id();
    absl::MutexLock lock(&mu_);
    credential_ = reply.credential();
    return reply.executor_id();
  }

  template <typename Method, typename Request, typename Reply>
  absl::StatusOr<Reply> Call(Method method, const Request& request, Reply reply) {
    grpc::ClientContext context;
    rpc::Prepare(context, Credential(), absl::Seconds(10));
    grpc::Status status = ((*stub_).*method)(&context, request, &reply);
    if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      return absl::UnauthenticatedError(absl::StrCat(
          "the server refused this executor's credential: ", status.error_message(),
          ". To serve this pool again, remove ",
          credentials_.credential_file.empty() ? std::string("the credential") : credentials_.credential_file,
          " and start with a new join token"));
    }
    if (!status.ok()) return rpc::FromGrpc(status);
    return reply;
  }

  std::unique_ptr<v1::Executors::Stub> stub_;
  const ExecutorCredentials credentials_;
  absl::Mutex mu_;
  std::string credential_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<ControlPlaneClient> MakeGrpcControlPlaneClient(std::shared_ptr<grpc::Channel> channel,
                                                               ExecutorCredentials credentials) {
  return std::make_unique<GrpcControlPlaneClient>(std::move(channel), std::move(credentials));
}

}  // namespace minions
