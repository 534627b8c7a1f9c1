#pragma once
// The gRPC plumbing shared by the server, the executor and the client verbs: channels, the bearer
// token, and absl::Status <-> grpc::Status (the codes are the same numbers).

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace minions::rpc {

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// How FromGrpc's message begins when the server could not be reached.
inline constexpr char kUnreachable[] = "cannot reach the Minions server";

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(std::string(kUnreachable) + ": " + s.error_message());
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

inline std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  // A failed connection makes the channel resolve its target again before it reconnects, and by
  // default a name is resolved at most once in 30 s: without this, a client of a restarted server
  // failed for 5-30 s after the server was back (the chaos suite's server restarts), long enough
  // for every lease to run out.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 250);
  // Reconnect quickly after a server restart instead of backing off for up to two minutes.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // A failed connection makes the channel resolve its target again before it reconnects, and by
  // default a name is resolved at most once in 30 s: without this, a client of a restarted server
  // failed for 5-30 s after the server was back (the chaos suite's server restarts), long enough
  // for every lease to run out.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 250);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// Sets the token and a deadline on a call.
inline void Prepare(grpc::ClientContext& context, const std::string& token,
                    absl::Duration timeout = absl::Seconds(30)) {
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  if (timeout != absl::InfiniteDuration()) {
    context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  }
}

}  // namespace minions::rpc
