#pragma once
// The admin verbs: `minions admin team|teams|token|tokens|join-token`, `minions executors
// revoke|release`, `minions whoami`. They act through an AdminBackend: a server's Admin service (an
// admin token over the network), or the server's own data (`minions admin --data-dir` /
// `--database`: whoever can read the database is an admin already; this is how the first admin
// token is made on a pool that has none).
// Each verb prints for people by default, JSON with --json, and returns the exit code.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/client_verbs.h"
#include "minions/v1/minions.grpc.pb.h"

namespace minions::cli {

class AdminBackend {
 public:
  virtual ~AdminBackend() = default;
  virtual absl::StatusOr<v1::Team> CreateTeam(const v1::Team& team) = 0;
  virtual absl::StatusOr<v1::Team> UpdateTeam(const v1::Team& team) = 0;
  virtual absl::StatusOr<std::vector<v1::Team>> ListTeams() = 0;
  virtual absl::StatusOr<v1::IssuedToken> IssueToken(const v1::IssueTokenRequest& request) = 0;
  virtual absl::StatusOr<std::vector<v1::TokenInfo>> ListTokens(const v1::ListTokensRequest& request) = 0;
  virtual absl::StatusOr<v1::TokenInfo> RevokeToken(const std::string& token_id) = 0;
  virtual absl::StatusOr<v1::Executor> RevokeExecutor(const std::string& executor_id) = 0;
  virtual absl::StatusOr<v1::Executor> ReleaseExecutor(const std::string& executor_id) = 0;
  virtual absl::StatusOr<v1::TokenInfo> WhoAmI() = 0;
  virtual absl::StatusOr<v1::Executor> ApproveExecutor(const std::string& executor_id) = 0;
};

// The Admin service of the server `connection` names.
std::unique_ptr<AdminBackend> RemoteAdmin(const Connection& connection);

// What the verbs were asked.
struct TeamOptions {
  std::string name;
  std::optional<int> max_priority;
  std::optional<int64_t> max_active_jobs;
  std::optional<int64_t> requests_per_second;
  std::optional<int64_t> weight;
  std::optional<int64_t> max_running_tasks;
  // Sizes: bytes, or with a binary suffix (K, M, G, T: "200G"); "0": no limit.
  std::optional<std::string> max_file_bytes;
  std::optional<std::string> max_model_bytes;
  std::optional<std::string> max_result_bytes;
  std::optional<std::string> runners;  // "llama,embed"; "any": no list (those the server allows)
  std::optional<bool> require_confined;
  // The share of its jobs' records spot-checked: 0 (the fleet's) or 0.01 to 1 (the server refuses
  // anything else: checks are never off for a team).
  std::optional<double> verify_fraction;
};
// "123", "64K", "200G", "1T" (powers of 1024; an optional trailing "B" or "iB") as bytes;
// InvalidArgument otherwise.
absl::StatusOr<int64_t> ParseByteSize(const std::string& text);
struct IssueOptions {
  std::string role;
  std::string team;
  std::string name;        // who holds it
  std::string expires;     // "90d", "12h", "never"; "": the server's default (docs/security.md)
  int64_t uses = 0;        // join tokens
  std::string scopes;      // "": the role's
  std::string output;      // write the token to this file (0600) instead of standard output
};

int CreateTeam(AdminBackend& admin, const TeamOptions& options, bool json);
int UpdateTeam(AdminBackend& admin, const TeamOptions& options, bool json);
int ListTeams(AdminBackend& admin, bool json);
// The teams table of `minions admin teams` and `minions teams` (or a JSON array): one row each.
void PrintTeams(const std::vector<v1::Team>& teams, bool json);
int IssueToken(AdminBackend& admin, const IssueOptions& options, bool json);
int ListTokens(AdminBackend& admin, const std::string& team, const std::string& role, bool all, bool json);
int RevokeToken(AdminBackend& admin, const std::string& token_id, bool json);
int RevokeExecutor(AdminBackend& admin, const std::string& executor_id, bool json);
// `minions executors release ID`: lifts a quarantine (docs/verification.md) after an admin's look.
int ReleaseExecutor(AdminBackend& admin, const std::string& executor_id, bool json);
int WhoAmI(AdminBackend& admin, bool json);
// `minions executors approve ID|NAME`: a name is looked up among the pending executors of the
// fleet `connection` shows (exactly one must have it).
int ApproveExecutor(AdminBackend& admin, const Connection& connection, const std::string& executor, bool json);

// "90d", "12h", "30m" -> a duration; also absl's forms ("1h30m"). InvalidArgument otherwise.
absl::StatusOr<absl::Duration> ParseLifetime(const std::string& text);

}  // namespace minions::cli
