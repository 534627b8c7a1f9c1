#pragma once
// Authorising a gRPC call: the bearer token it carries ("authorization: Bearer <token>"), checked
// by the Authenticator for the one scope the call needs. Refusals are logged with the peer and
// the credential's id, never the token's text.
// Threads: any (the Authenticator is thread-safe).

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/statusor.h"
#include "identity/authenticator.h"

namespace minions {

// The token of the call's "authorization: Bearer" header; "" when there is none.
std::string BearerToken(const grpc::ServerContextBase* context);

// The caller, when its token holds `scope` and its team is within its rate; otherwise
// Unauthenticated, PermissionDenied or ResourceExhausted with a message the caller can act on.
absl::StatusOr<Caller> AuthorizeCall(const grpc::ServerContextBase* context, Authenticator& auth, Scope scope);

}  // namespace minions
