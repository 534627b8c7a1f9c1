#pragma once
// Caller: an authenticated principal as the services see it — which credential, which role and
// team, which scopes. Made only by the Authenticator (or, in tests, from a stored record). The
// one place that answers "may this caller see that team's work?".
// Plain data; any thread.

#include <optional>
#include <string>

#include "absl/time/time.h"
#include "model/identity.h"

namespace minions {

struct Caller {
  std::string token_id;
  Role role = Role::kViewer;
  std::string team;       // submitter and viewer: their team; "" otherwise
  std::string principal;  // who: a name within the team, an executor id, a label
  ScopeSet scopes;
  // The credential's lifetime: when it was issued and when it expires (none: never). An
  // executor is told from these when to rotate its credential (ExecutorService::Register).
  absl::Time issued_at = absl::InfinitePast();
  std::optional<absl::Time> expires_at;

  static Caller From(const TokenRecord& token) {
    return Caller{token.id, token.role, token.team, token.principal, token.scopes, token.created_at, token.expires_at};
  }

  bool Has(Scope scope) const { return scopes.Has(scope); }
  bool IsAdmin() const { return scopes.Has(Scope::kAdmin); }
  // The executor this credential is bound to ("" unless an executor credential).
  std::string executor_id() const { return role == Role::kExecutor ? principal : ""; }
  // Whether the caller may see (and, with jobs:write, touch) work of `job_team`: admins every
  // team's, everyone else only their own team's.
  bool SeesTeam(const std::string& job_team) const { return IsAdmin() || (!team.empty() && team == job_team); }
  // "tok-1a2b3c4d5e6f (submitter alice@search)": for log lines; never the token's text.
  std::string Describe() const {
    std::string who = principal + (team.empty() ? "" : "@" + team);
    return token_id + " (" + std::string(RoleName(role)) + " " + who + ")";
  }
};

}  // namespace minions
