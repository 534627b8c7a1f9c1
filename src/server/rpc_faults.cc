#include "server/rpc_faults.h"

#include <grpcpp/server_context.h>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace minions {
namespace {

std::string CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    default:
      return absl::StrCat(static_cast<int>(code));
  }
}

// Reports its call's status to RpcFaults as the status is sent. One per call, made by gRPC.
class RpcFaultInterceptor : public grpc::experimental::Interceptor {
 public:
  RpcFaultInterceptor(grpc::experimental::ServerRpcInfo* info, RpcFaults* faults) : info_(info), faults_(faults) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    using Type = grpc::experimental::ServerRpcInfo::Type;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr &&
        (info_->type() == Type::UNARY || info_->type() == Type::SERVER_STREAMING)) {
      // The call's one request did not decode (bytes that are no such message, or none): gRPC
      // answers it INTERNAL itself, before any handler or credential check. The caller's doing,
      // not a fault of this server's, and anyone who reaches the port could send it.
      undecodable_ = true;
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) && !undecodable_) {
      const grpc::Status status = methods->GetSendStatus();
      if (RpcFaults::IsFault(status.error_code())) {
        const char* method = info_->method();
        grpc::ServerContextBase* context = info_->server_context();
        faults_->Answered(method ? method : "?", status, context ? context->peer() : "");
      }
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* const info_;  // gRPC's, outlives this interceptor
  RpcFaults* const faults_;
  bool undecodable_ = false;  // (a call's hook points run one after another, never at once)
};

}  // namespace

RpcFaults::RpcFaults(Clock* clock, metrics::Registry* registry)
    : clock_(clock),
      faults_(registry->AddCounterFamily(
          "minions_rpc_faults_total",
          "gRPC calls this server answered with a fault of its own (its store or blob store unreachable or "
          "failing, a bug), by method and code: INTERNAL, UNKNOWN, DATA_LOSS, UNAVAILABLE, DEADLINE_EXCEEDED. "
          "Refusals of bad or unauthorised calls are not counted. The server logs the first of a method's "
          "faults, then at most one line a minute per method.",
          {"method", "code"})) {}

bool RpcFaults::IsFault(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::DATA_LOSS:
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return true;
    default:
      return false;
  }
}

bool RpcFaults::Answered(std::string_view method, const grpc::Status& status, std::string_view peer) {
  if (!IsFault(status.error_code())) return false;
  const std::string code = CodeName(status.error_code());
  faults_->With({std::string(method), code})->Increment();
  const absl::Time now = clock_->Now();
  int64_t unlogged;
  {
    absl::MutexLock lock(&mu_);
    auto it = logs_.find(method);
    if (it == logs_.end()) it = logs_.emplace(std::string(method), MethodLog{}).first;
    MethodLog& log = it->second;
    if (now < log.last_line + kLogEvery) {
      ++log.unlogged;
      return false;
    }
    unlogged = log.unlogged;
    log.last_line = now;
    log.unlogged = 0;
  }
  MINIONS_LOG(Warning) << "gRPC " << method << " from " << peer << " answered " << code << ": "
                       << status.error_message()
                       << (unlogged > 0 ? absl::StrCat(" (and ", unlogged, " more of its faults since the last line about it; "
                                                       "minions_rpc_faults_total counts them all)")
                                        : "");
  return true;
}

grpc::experimental::Interceptor* RpcFaultInterceptors::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new RpcFaultInterceptor(info, faults_);
}

}  // namespace minions
