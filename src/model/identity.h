#pragma once
// Who may do what: teams, roles, scopes and the records of issued credentials. Plain data and pure
// rules, no I/O (the token text itself is made in identity/token.h; the records live in the
// IdentityStore). See docs/architecture.md, "Identities".
//
// Principals and roles (the design note fleet.md):
//   admin      everything: teams, credentials, any team's jobs, the fleet, drains and revocations
//   submitter  one team: submit, read, watch, fetch results of and cancel that team's jobs
//   viewer     one team: read its jobs and results, the dashboard
//   monitor    the fleet's metrics (Prometheus), no job data
//   executor   one executor: register, heartbeat, lease, report about its own leases
//   join       enrolment only: traded once (or a few times) for executor credentials

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace minions {

enum class Role { kAdmin, kSubmitter, kViewer, kMonitor, kExecutor, kJoin };

std::string_view RoleName(Role role);
std::optional<Role> ParseRole(std::string_view name);
// Roles that belong to a team (submitter, viewer); the others have none.
bool IsTeamRole(Role role);

// What a credential allows, as a bit set. Each RPC and page names the one scope it needs.
enum class Scope : uint32_t {
  kAdmin = 1u << 0,        // teams, credentials, revocations, drains; every team's jobs
  kJobsRead = 1u << 1,     // list, status, watch, tasks, results of the team's jobs
  kJobsWrite = 1u << 2,    // submit and cancel the team's jobs
  kFleetRead = 1u << 3,    // the fleet in coarse form (no other team's work)
  kMetricsRead = 1u << 4,  // /metrics
  kExecutor = 1u << 5,     // the Executors service, for the executor the credential names
  kEnrol = 1u << 6,        // trade a join token for an executor credential
  // Join gangs (docs/architecture.md, "Gangs"; docs/security.md 40.1): never a default. An admin
  // grants it on a join token (`minions admin join-token --gang`); the executor credential traded
  // for that token inherits it, and only such an executor's gang address is kept.
  kGang = 1u << 7,
};

class ScopeSet {
 public:
  constexpr ScopeSet() = default;
  constexpr explicit ScopeSet(uint32_t bits) : bits_(bits) {}
  constexpr ScopeSet(std::initializer_list<Scope> scopes) {
    for (Scope s : scopes) bits_ |= static_cast<uint32_t>(s);
  }
  bool Has(Scope scope) const { return (bits_ & static_cast<uint32_t>(scope)) != 0; }
  // Every scope of `other` is in this set.
  bool Covers(ScopeSet other) const { return (bits_ & other.bits_) == other.bits_; }
  uint32_t bits() const { return bits_; }
  bool operator==(const ScopeSet&) const = default;

 private:
  uint32_t bits_ = 0;
};

std::string_view ScopeName(Scope scope);
// "jobs:read jobs:write": space-separated names, in a fixed order (how stores keep them).
std::string ScopesToString(ScopeSet scopes);
// InvalidArgument naming the unknown scope.
absl::Status ParseScopes(std::string_view text, ScopeSet* scopes);
// The scopes a role's credentials get.
ScopeSet DefaultScopes(Role role);
// The scopes a role's credentials may be given: its defaults, and for join tokens (and the
// executor credentials traded for them) the gang scope, which an admin grants explicitly.
ScopeSet GrantableScopes(Role role);

// A team: the unit of isolation and of quotas. Its settings are set by an admin.
struct Team {
  std::string name;
  int max_priority = 10;            // its jobs' priority ceiling (a higher request is refused)
  int64_t max_active_jobs = 0;      // jobs not yet ended at once; 0: no limit
  int64_t requests_per_second = 0;  // API calls per second per server (burst: twice as many); 0: no limit
  // Fair share (model/fair_share.h): its share of the fleet is weight / the sum of the weights of
  // the teams that want work; at least 1.
  int64_t weight = 1;
  int64_t max_running_tasks = 0;    // its tasks running at once; 0: no limit
  // Bytes it may keep in the object store (0: no limit): its files (OpenAI files, uploaded and
  // inline job inputs), its models (each digest once), its jobs' published results.
  int64_t max_file_bytes = 0;
  int64_t max_model_bytes = 0;
  int64_t max_result_bytes = 0;
  // The share of its jobs' records spot-checked (docs/verification.md, "Spot checks"): 0 for the
  // fleet's (StoreOptions::verification.fraction), else kMinTeamVerifyFraction to 1. Never 0
  // for "none": a team's jobs without checks would be where a forging executor forges.
  double verify_fraction = 0;
  // What it keeps of files and results, as the store counts them (IdentityStore::ChargeTeamBytes):
  // never set by an admin (UpdateTeam keeps the stored counts). Its models' bytes are summed from
  // its registry instead.
  int64_t file_bytes = 0;
  int64_t result_bytes = 0;
  // The runners its jobs may name (docs/security.md 40.3): a job naming another is refused; empty:
  // any the server allows (ServerOptions::runner_allowlist).
  std::vector<std::string> runners;
  // Its jobs run only on executors whose runners are fully confined (Requirements::confined).
  bool require_confined = false;
  absl::Time created_at;
  bool operator==(const Team&) const = default;
};

// The object-store bytes a team is charged for (Team's limits and counts).
enum class TeamBytes { kFiles, kResults };

// The team every pool starts with (jobs of an admin who names no team go there).
inline constexpr char kDefaultTeam[] = "default";
// The largest fair-share weight an admin may give a team.
inline constexpr int64_t kMaxTeamWeight = 1000000;
// The name `minions admin join-token` gives a join token when the admin gives none.
inline constexpr char kDefaultJoinTokenName[] = "join";
struct TokenRecord;
// The owner of the executors a join token enrols (Executor::owner): the token's name when an admin
// gave one (it names the machines' owner: "alice", "lab-3"), else the token itself ("tok-...").
std::string ExecutorOwner(const TokenRecord& join);
// The least spot-check fraction a team may have (Team::verify_fraction).
inline constexpr double kMinTeamVerifyFraction = 0.01;
// InvalidArgument unless `fraction` is 0 (the fleet's) or kMinTeamVerifyFraction to 1.
absl::Status ValidateVerifyFraction(double fraction);

// InvalidArgument unless `name` is 1-63 of [a-z0-9_-], starting with a letter or digit: team names
// become object-store prefixes and metric labels.
absl::Status ValidateTeamName(std::string_view name);
// InvalidArgument unless an executor's name (what it calls itself: a host name, a label) is at
// most 100 bytes without control characters (C0, DEL, and C1 as UTF-8): names are printed on terminals and
// in logs, where an escape sequence would rewrite what an admin sees.
absl::Status ValidateExecutorName(std::string_view name);
// InvalidArgument unless a principal name is 1-100 of [A-Za-z0-9._-] and not "." or "..": names
// are object-key segments (the caller's uploads) and appear in log lines.
absl::Status ValidatePrincipalName(std::string_view name);

// An issued credential as stored: never its text, only the text's SHA-256 (identity/token.h).
struct TokenRecord {
  std::string id;           // "tok-" + 12 hex digits: shown in listings, named to revoke
  std::string secret_hash;  // hex SHA-256 of the token text
  Role role = Role::kViewer;
  std::string team;         // submitter and viewer tokens; "" otherwise
  // Who holds it: a person's or a program's name within its team ("alice", "ci"); for an executor
  // credential its executor id; for admin, monitor and join tokens a label.
  std::string principal;
  ScopeSet scopes;
  // Join tokens: trades left (each enrolment takes one). Other tokens: -1 (no limit).
  int64_t uses_left = -1;
  std::string created_by;  // the issuing token's id, or "local" (issued on the server's own data)
  absl::Time created_at;
  std::optional<absl::Time> expires_at;
  std::optional<absl::Time> last_used_at;
  std::optional<absl::Time> revoked_at;
  bool operator==(const TokenRecord&) const = default;
};

// Whether `token` may be used at `now`: Unauthenticated when revoked, expired or (join tokens)
// used up, with a message that says which, but never anything about other tokens.
absl::Status CheckUsable(const TokenRecord& token, absl::Time now);

// The executor id an executor credential is bound to ("" for other roles).
inline std::string ExecutorIdOf(const TokenRecord& token) {
  return token.role == Role::kExecutor ? token.principal : "";
}

}  // namespace minions
