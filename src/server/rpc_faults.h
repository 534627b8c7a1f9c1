#pragma once
// RpcFaults: what the server tells its operator about calls it answered with a fault of its own
// (its store unreachable or refusing a statement, a bug): INTERNAL, UNKNOWN, DATA_LOSS,
// UNAVAILABLE, DEADLINE_EXCEEDED. Its callers hear of such a fault, but an executor's logs are on
// another person's machine: a server whose lease query failed on every call (a schema it does
// not expect, say) kept its whole fleet idle and said nothing. Now each fault is counted in
// minions_rpc_faults_total{method, code}, and logged: the first of a method's faults at once,
// later ones at most once a minute per method, with how many came in between, so that a store
// that is down does not flood the log with a line per call.
//
// Refusals (bad input, no permission, fenced, not found, rate limits, a caller's own deadline or
// cancel) are the caller's business and are not counted here; nor is the INTERNAL that gRPC
// itself answers a request whose bytes do not decode.
//
// RpcFaultInterceptors: the gRPC server interceptor that reports every call's status to an
// RpcFaults, so that every service's every method is covered in one place.
//
// Ownership: borrows the clock and the registry (both must outlive it).
// Threads: thread-safe; Answered runs on whichever gRPC thread sends a call's status.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include <grpcpp/support/server_interceptor.h>
#include <grpcpp/support/status.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "metrics/metrics.h"

namespace minions {

class RpcFaults {
 public:
  // At most one line per method per this long after its first fault.
  static constexpr absl::Duration kLogEvery = absl::Minutes(1);

  RpcFaults(Clock* clock, metrics::Registry* registry);

  // Whether `code` is a fault of the server's own rather than a refusal of the call.
  static bool IsFault(grpc::StatusCode code);

  // `method` (gRPC's full name, "/minions.v1.Executors/Lease") was answered with `status` by
  // `peer`. Counts and logs it if it is a fault. Returns whether a line was logged (for tests).
  bool Answered(std::string_view method, const grpc::Status& status, std::string_view peer) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct MethodLog {
    absl::Time last_line = absl::InfinitePast();
    int64_t unlogged = 0;  // faults since that line
  };

  Clock* const clock_;
  metrics::Family<metrics::Counter>* const faults_;
  absl::Mutex mu_;
  std::map<std::string, MethodLog, std::less<>> logs_ ABSL_GUARDED_BY(mu_);
};

// The factory gRPC asks for an interceptor per call (grpc::ServerBuilder::experimental()
// .SetInterceptorCreators). Each interceptor reports its call's status as it is sent.
class RpcFaultInterceptors : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcFaultInterceptors(RpcFaults* faults) : faults_(faults) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override;

 private:
  RpcFaults* const faults_;
};

}  // namespace minions
