#include "server/call_auth.h"

#include "absl/strings/match.h"
#include "common/logging.h"

namespace minions {

std::string BearerToken(const grpc::ServerContextBase* context) {
  auto it = context->client_metadata().find("authorization");
  if (it == context->client_metadata().end()) return "";
  std::string value(it->second.data(), it->second.size());
  constexpr char kBearer[] = "Bearer ";
  if (!absl::StartsWith(value, kBearer)) return "";
  return value.substr(sizeof(kBearer) - 1);
}

absl::StatusOr<Caller> AuthorizeCall(const grpc::ServerContextBase* context, Authenticator& auth, Scope scope) {
  absl::StatusOr<Caller> caller = auth.Authorize(BearerToken(context), scope);
  if (!caller.ok() && !absl::IsUnavailable(caller.status())) {
    // The peer is gRPC's own rendering ("ipv4:10.0.0.5:51234"); the message names a credential by
    // its id at most.
    MINIONS_LOG(Info) << "refused a call from " << context->peer() << ": " << caller.status().message();
  }
  return caller;
}

}  // namespace minions
