#pragma once
// The gang link's handshake (docs/architecture.md, "Gangs"; docs/security.md, finding 40.1):
// llama.cpp's RPC protocol has no authentication, so before a single RPC byte is forwarded to a
// member's rpc-server, the member's gate and the leader prove to each other that they hold the
// secret the server minted for this gang attempt (and handed to the leader with its lease, to
// each member with its duty). The secret never crosses the wire:
//
//   gate   -> leader: "MGANG/1\n" + 32 random bytes (nonce_m)
//   leader -> gate:   "MGANG/1\n" + 32 random bytes (nonce_l) + HMAC-SHA256(secret, "leader" nonce_m nonce_l)
//   gate   -> leader: HMAC-SHA256(secret, "member" nonce_m nonce_l)
//
// A peer without the secret (a raw rpc client, another gang's leader, the previous attempt's
// leader) cannot answer the gate's fresh nonce, and a recorded exchange is worth nothing on the
// next connection. The member's answer lets the leader refuse an impostor member (one that would
// otherwise receive the model's tensors and the prompts' activations). The stream after the
// handshake is not encrypted: the gang network is the operator's, and docs/security.md says so.
//
// Pure functions on a connected, blocking or non-blocking socket; any thread.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace minions {

// The member's side, on an accepted connection: sends the challenge and checks the answer.
// PermissionDenied when the peer does not prove `secret` (also for an empty `secret`: a gate
// without a secret admits nobody); DeadlineExceeded/Unavailable when it says nothing in time.
absl::Status AdmitLeader(int fd, absl::string_view secret, absl::Duration timeout);

// The leader's side, on a connection to a member's gate: answers its challenge and checks the
// member's proof. PermissionDenied when the member does not prove `secret`.
absl::Status ProveLeader(int fd, absl::string_view secret, absl::Duration timeout);

}  // namespace minions
