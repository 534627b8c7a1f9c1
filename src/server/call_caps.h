#pragma once
// CallCaps: the gRPC calls in flight per peer address and per credential, each capped below the
// server's total (ServerOptions::max_threads), so that one address or one credential cannot hold
// every call the server serves at once (docs/security.md 40.2d). gRPC 1.51 has no such cap of its
// own, nor a per-method receive limit.
//
// How: a server interceptor counts each call from its headers (which CredentialGate has already
// admitted: a call without a valid credential never reaches it) to its end. A call past a cap is
// not counted; the interceptor marks it in its metadata (kOverCapHeader) and AuthorizeCall, the
// first line of every handler, refuses it RESOURCE_EXHAUSTED before the handler does anything (its
// message, at most max_message_bytes, has been read). Loopback peers are not capped per address
// (a pool's executors all call from 127.0.0.1); every credential is.
// Threads: thread-safe; gRPC makes one interceptor per call, on any thread.

#include <grpcpp/support/server_interceptor.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace grpc {
class ServerContextBase;
}

namespace minions {

// The metadata the interceptor adds to a call over a cap; its value names the cap.
inline constexpr char kOverCapHeader[] = "minions-over-cap";

struct CallCapOptions {
  int64_t per_peer = 0;        // calls in flight from one address (not loopback); 0: no cap
  int64_t per_credential = 0;  // calls in flight with one credential; 0: no cap
};

class CallCaps final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallCaps(CallCapOptions options) : options_(options) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override;

  // One call from `peer` (gRPC's rendering, "ipv4:10.0.0.5:51234") with `token`: "" when it is
  // admitted (counted until Ended), else which cap it is past ("peer", "credential").
  std::string_view Admit(const std::string& peer, const std::string& token) ABSL_LOCKS_EXCLUDED(mu_);
  void Ended(const std::string& peer, const std::string& token) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls in flight now from `peer`'s address, and with `token`.
  int64_t FromPeer(const std::string& peer) const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t WithCredential(const std::string& token) const ABSL_LOCKS_EXCLUDED(mu_);

  const CallCapOptions& options() const { return options_; }

 private:
  const CallCapOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int64_t> peers_ ABSL_GUARDED_BY(mu_);   // by address, without port
  absl::flat_hash_map<size_t, int64_t> credentials_ ABSL_GUARDED_BY(mu_);  // by the token's hash
};

// The address of gRPC's peer string without its port ("ipv4:10.0.0.5:51234" -> "ipv4:10.0.0.5",
// "ipv6:[::1]:80" -> "ipv6:[::1]"); "" for a loopback or Unix-socket peer (not capped per address).
std::string PeerAddress(std::string_view peer);

// ResourceExhausted when the interceptor marked the call over a cap (saying which); OK otherwise.
absl::Status OverCapRefusal(const grpc::ServerContextBase* context);

}  // namespace minions
