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

struct IssueRequest {
  Role role = Role::kViewer;
  std::string team;       // submitter and viewer tokens
  std::string principal;  // who holds it ("alice", "ci", "prometheus", "laptops-batch-3")
  std::optional<absl::Duration> ttl;  // none: no expiry (join tokens: 24 h)
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

  // `require_approval`: executors that enrol are pending (no leases) until an admin approves
  // them (ServerOptions::require_executor_approval).
  IdentityAdmin(IdentityStore* store, Clock* clock, bool require_approval = false)
      : store_(store), clock_(clock), require_approval_(require_approval) {}

  // Limits a new team gets where its creator set none (0): safe for a pool, generous for a team's
  // honest work; each is changed with `minions admin team set` (0 there: no limit). Documented
  // in docs/operations.md, "Fair share and quotas" (docs/security.md, 40.5b).
  static constexpr int64_t kDefaultMaxActiveJobs = 1000;
  static constexpr int64_t kDefaultRequestsPerSecond = 200;
  static constexpr int64_t kDefaultMaxRunningTasks = 1000;

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

 private:
  // InvalidArgument for a bad name or a negative limit.
  static absl::Status ValidateTeam(const Team& team);
  IdentityStore* store_;
  Clock* clock_;
  bool require_approval_;
};

}  // namespace minions
