#pragma once
// Authorising a gRPC call: the bearer token it carries ("authorization: Bearer <token>"), checked
// by the Authenticator for the one scope the call needs. Refusals are logged with the peer and
// the credential's id, never the token's text, and at a bounded rate (one line a second, with
// the count of those not written), so that a flood of refused calls cannot flood the log.
// Threads: any (the Authenticator is thread-safe).

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include <string>

#include "absl/status/statusor.h"
#include "identity/authenticator.h"

namespace minions {

// The token of the call's "authorization: Bearer" header; "" when there is none.
std::string BearerToken(const grpc::ServerContextBase* context);

// The caller, when its token holds `scope` and its team is within its rate; otherwise
// Unauthenticated, PermissionDenied or ResourceExhausted with a message the caller can act on
// (ResourceExhausted too for a call past its address's or credential's cap: server/call_caps.h).
absl::StatusOr<Caller> AuthorizeCall(const grpc::ServerContextBase* context, Authenticator& auth, Scope scope);

// Refuses a call whose metadata carries no valid credential before its message is read: gRPC runs
// an auth metadata processor in the transport's auth filter, when the call's headers arrive, so a
// refused call's message (up to the receive limit: hundreds of MB) is never received or held.
// The scope and the rate are still checked by each handler (AuthorizeCall). Installed on TLS and
// plain text alike (rpc::ServerCredentials: plain text is gRPC's local credentials, which take a
// processor); IsBlocking: it may ask the store, on gRPC's processor threads.
class CredentialGate final : public grpc::AuthMetadataProcessor {
 public:
  explicit CredentialGate(Authenticator* auth) : auth_(auth) {}
  bool IsBlocking() const override { return true; }
  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context, OutputMetadata* consumed,
                       OutputMetadata* response) override;

 private:
  Authenticator* auth_;
};

}  // namespace minions
