#pragma once
// IdentityAdmin: what may be done to teams and credentials — create and tune teams, issue and
// revoke tokens, trade a join token for an executor credential, cut an executor off. The checks
// live here once; the Admin gRPC service (an admin token over the network) and `minions admin
// --data-dir` (on the server's own data, for the first admin token) both call it.
//
// A token's text exists only in the value Issue/Enrol return: it is shown once to whoever asked,
// and the store keeps its SHA-256.
//
// Ownership: borrows the store and the clock. Threads: thread-safe (the store is).

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "model/types.h"
#include "store/identity_store.h"

namespace minions {

// How long credentials live, and whether enrolment waits for an admin (server config:
// docs/security.md, "Credential lifetimes"). Zero durations: never expire.
struct IdentityPolicy {
  // Executors that enrol are pending (no leases) until an admin approves them
  // (ServerOptions::require_executor_approval).
  bool require_approval = false;
  // An executor credential expires this long after it is issued (at enrolment or rotation). The
  // executor exchanges it for a new one once half of that has passed (Executors.RotateCredential),
  // so only an executor away for more than half of it must enrol again.
  absl::Duration executor_credential_ttl = absl::Hours(24 * 30);
  // Submitter and viewer tokens issued without a lifetime expire after this.
  absl::Duration team_token_ttl = absl::Hours(24 * 90);
  // After a rotation the old credential works this much longer: for calls and streams opened
  // with it, and for other servers, which keep a credential's record up to 5 minutes
  // (AuthenticatorOptions::refresh_ttl).
  absl::Duration rotation_grace = absl::Minutes(10);
};

struct IssueRequest {
  Role role = Role::kViewer;
  std::string team;       // submitter and viewer tokens
  std::string principal;  // who holds it ("alice", "ci", "prometheus", "laptops-batch-3")
  // None: the default (join tokens 24 h, submitter and viewer tokens IdentityPolicy::team_token_ttl,
  // others never); InfiniteDuration: never, said explicitly.
  std::optional<absl::Duration> ttl;
  int64_t uses = 0;                   // join tokens: how many executors may enrol with it (0: 1)
  std::optional<ScopeSet> scopes;     // narrower than the role's; none: the role's
};

struct IssuedToken {
  TokenRecord record;
  std::string text;  // shown once; never stored or logged
};

struct Enrolment {
  Executor executor;
  IssuedToken credential;
};

class IdentityAdmin {
 public:
  // Join tokens that say nothing expire after this.
  static constexpr absl::Duration kDefaultJoinTtl = absl::Hours(24);

  IdentityAdmin(IdentityStore* store, Clock* clock, IdentityPolicy policy = {})
      : store_(store), clock_(clock), policy_(policy) {}

  // Limits a new team gets where its creator set none (0): safe for a pool, generous for a team's
  // honest work; each is changed with `minions admin team set` (0 there: no limit). Documented
  // in docs/operations.md, "Fair share and quotas" (docs/security.md, 40.5b).
  static constexpr int64_t kDefaultMaxActiveJobs = 1000;
  static constexpr int64_t kDefaultRequestsPerSecond = 200;
  static constexpr int64_t kDefaultMaxRunningTasks = 1000;
  // Bytes kept in the object store: files and job inputs, models (each digest once), results.
  static constexpr int64_t kDefaultMaxFileBytes = int64_t{100} << 30;
  static constexpr int64_t kDefaultMaxModelBytes = int64_t{500} << 30;
  static constexpr int64_t kDefaultMaxResultBytes = int64_t{100} << 30;

  // A new team; its unset limits (0) take the defaults above.
  absl::StatusOr<Team> CreateTeam(Team team);
  absl::StatusOr<Team> UpdateTeam(const Team& team);

  // Issues a credential on behalf of `issued_by` (a token id, or "local" on the server's own data).
  // InvalidArgument for what cannot be issued: an executor credential (those come from
  // enrolment), a team role without a team (or another role with one), a bad name, scopes
  // beyond the role's, a join token with uses but no positive count.
  absl::StatusOr<IssuedToken> Issue(const IssueRequest& request, const std::string& issued_by);

  // Trades the join token `join_text` for a new executor and its credential; the executor is
  // pending when approval is required.
  absl::StatusOr<Enrolment> Enrol(const std::string& join_text, const ExecutorInfo& info);

  // Exchanges executor `executor_id`'s usable credential `token_id` for a new one of the policy's
  // lifetime; the old one works on for the policy's grace, then expires. Unauthenticated when the
  // old one is expired or revoked, or the executor revoked (IdentityStore::RotateCredential).
  absl::StatusOr<IssuedToken> RotateExecutorCredential(const std::string& executor_id, const std::string& token_id);

  // When the holder of an executor credential issued at `issued_at` and expiring at `expires_at`
  // should exchange it: half-way through its life; at once for one that never expires while the
  // policy gives executor credentials a lifetime (one enrolled before lifetimes, or before the
  // admin set one); never (InfiniteFuture) otherwise.
  absl::Time RotateAt(absl::Time issued_at, std::optional<absl::Time> expires_at) const;

  const IdentityPolicy& policy() const { return policy_; }

 private:
  // InvalidArgument for a bad name or a negative limit.
  static absl::Status ValidateTeam(const Team& team);
  IdentityStore* store_;
  Clock* clock_;
  const IdentityPolicy policy_;
};

}  // namespace minions
