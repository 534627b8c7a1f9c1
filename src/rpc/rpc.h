#pragma once
// The gRPC plumbing shared by the server, the executor and the client verbs: channels, the bearer
// token, and absl::Status <-> grpc::Status (the codes are the same numbers). TLS: rpc/tls.h.

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

// What a channel carries, for its transport settings.
enum class ChannelUse {
  kClient,    // a person's or a program's calls: inputs, model parts and results, large messages
  kExecutor,  // an executor's control calls: small messages, one connection of thousands
};

// gRPC's bandwidth-delay probe (BDP), off on the server's connections (server.cc) and executors'
// channels. On a connection that receives data it sends a PING and keeps a timer armed until the
// next one, so a server with 10,000 executors answered pings at the rate of their heartbeats and
// held 10,000 more timers: dear on Debian's gRPC, built with its debug checks, which walk a pending
// timer's hash chain at every timer set and cancel, and every outstanding operation of the
// process's one completion queue, under its lock, at every completion. Off: the fleet simulator's
// server took 10-37 % less CPU, its 10,000 clients 23-35 % less, and the heartbeat p99 fell two- to
// fivefold, to 55-74 ms (docs/benchmarks.md, "Tenth round"). What it costs: the probe grows
// receive windows on long fat links, so a large message sent *to the server* over a long round
// trip arrives slower (a 56 MB inline input over 20 ms: 1.4-1.9 s with it, 2.4-3.1 s without).
// Clients keep it: what they receive in bulk (results) is where it helps them.
inline constexpr bool kServerBdpProbe = false;

// The channel arguments of every channel to a server (`use` picks the probe, above).
inline grpc::ChannelArguments ChannelArgs(ChannelUse use = ChannelUse::kClient) {
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
  if (use == ChannelUse::kExecutor) args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);  // see kServerBdpProbe
  return args;
}

// A plain-text channel (loopback; rpc/tls.h OpenChannel chooses TLS or refuses otherwise).
inline std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, ChannelUse use = ChannelUse::kClient) {
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), ChannelArgs(use));
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
