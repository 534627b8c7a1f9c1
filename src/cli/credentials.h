#pragma once
// Where a client finds its credential and the pool's CA, so that people type neither. In order:
//   token: --token-file or MINIONS_TOKEN_FILE; else --token or MINIONS_TOKEN (visible to other
//          users of the machine in the process list or environment: prefer a file); the macOS Keychain (a
//          generic password of service "minions", account the server address: `security
//          add-generic-password -s minions -a HOST:PORT -w`); for a server on this machine, the
//          admin token a local pool or server minted into its data folder
//          (~/.minions/pool/admin-token, ~/.minions/server/admin-token), only to the very
//          server that minted it: its port and process, recorded beside the token (PATH.server),
//          must match, so another local listener never receives it.
//   CA:    --ca; MINIONS_CA.
// Token files must not be readable by others (mode 0600 or stricter), like ssh keys.
// Threads: any.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace minions::cli {

// The first line of a token file; FailedPrecondition when the file is readable by its group or by
// others, InvalidArgument when it cannot be read or is empty.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Writes `token` to `path` (created 0600, replaced atomically; its folder created 0700).
absl::Status WriteTokenFile(const std::string& path, const std::string& token);

// The token the macOS Keychain holds for `server`; NotFound when none (or not on macOS).
absl::StatusOr<std::string> KeychainToken(const std::string& server);

// The admin-token files of local pools and servers under `minions_home`, for a loopback server.
std::vector<std::string> LocalAdminTokenFiles(const std::string& minions_home);

// Records, beside the admin-token file `token_path` (as TOKEN_PATH.server, 0600), the loopback
// address the server that minted it listens on and its process id.
absl::Status WriteTokenServer(const std::string& token_path, const std::string& address, int64_t pid);
// Whether the admin token at `token_path` may be sent to `server`: its record says a loopback
// address with the same port, and the process it names still runs. False without a record (an
// older pool), so a token is never sent to a listener it was not minted for (docs/security.md,
// 40.7c): any local user may open a loopback port.
bool TokenBelongsTo(const std::string& token_path, const std::string& server);

}  // namespace minions::cli
