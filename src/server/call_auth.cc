#include "server/call_auth.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "server/call_caps.h"

namespace minions {
namespace {
constexpr char kBearer[] = "Bearer ";
}  // namespace

std::string BearerToken(const grpc::ServerContextBase* context) {
  auto it = context->client_metadata().find("authorization");
  if (it == context->client_metadata().end()) return "";
  std::string value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, kBearer)) return "";
  return value.substr(sizeof(kBearer) - 1);
}

namespace {

// Logs a refusal, at most one line a second; the lines not written are counted into the next.
void LogRefusal(const std::string& peer, absl::string_view why) {
  static absl::Mutex mu(absl::kConstInit);
  static absl::Time last = absl::InfinitePast();
  static int64_t skipped = 0;
  int64_t also = 0;
  {
    absl::MutexLock lock(&mu);
    const absl::Time now = absl::Now();
    if (now - last < absl::Seconds(1)) {
      ++skipped;
      return;
    }
    last = now;
    also = skipped;
    skipped = 0;
  }
  // The peer is gRPC's own rendering ("ipv4:10.0.0.5:51234"); the message names a credential by
  // its id at most.
  MINIONS_LOG(Info) << "refused a call from " << peer << ": " << why
                    << (also > 0 ? absl::StrCat(" (and ", also, " other refusals in the last second or more)") : "");
}

}  // namespace

absl::StatusOr<Caller> AuthorizeCall(const grpc::ServerContextBase* context, Authenticator& auth, Scope scope) {
  // Past its address's or its credential's calls in flight (call_caps.h): refused before anything.
  if (absl::Status over = OverCapRefusal(context); !over.ok()) {
    LogRefusal(context->peer(), over.message());
    return over;
  }
  absl::StatusOr<Caller> caller = auth.Authorize(BearerToken(context), scope);
  if (!caller.ok() && !absl::IsUnavailable(caller.status())) LogRefusal(context->peer(), caller.status().message());
  return caller;
}

grpc::Status CredentialGate::Process(const InputMetadata& metadata, grpc::AuthContext* context, OutputMetadata*,
                                     OutputMetadata*) {
  std::string token;
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    std::string value(it->second.data(), it->second.size());
    if (absl::StartsWith(value, kBearer)) token = value.substr(sizeof(kBearer) - 1);
  }
  absl::StatusOr<Caller> caller = auth_->Authenticate(token);
  if (caller.ok()) return grpc::Status::OK;
  if (absl::IsUnavailable(caller.status())) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(caller.status().message()));
  }
  std::string peer = "a client";
  if (context != nullptr) {
    for (const auto& property : context->FindPropertyValues("peer")) peer.assign(property.data(), property.size());
  }
  LogRefusal(peer, caller.status().message());
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(caller.status().message()));
}

}  // namespace minions
