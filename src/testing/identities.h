#pragma once
// What tests of the services do with IdentityAdmin again and again: make the teams they submit as,
// and issue the tokens they call with.

#include <initializer_list>
#include <string>

#include "identity/identity_admin.h"
#include "testing/must.h"

namespace minions::testing {

// What IdentityAdmin::Issue is asked for a token of `role` for `principal` of `team`.
inline IssueRequest TokenRequest(Role role, const std::string& team, const std::string& principal) {
  IssueRequest request;
  request.role = role;
  request.team = team;
  request.principal = principal;
  return request;
}

// The text of a fresh token of `role` for `principal` of `team` (issued by "local"); a failure
// ends the test.
inline std::string IssueText(IdentityAdmin& identities, Role role, const std::string& team,
                             const std::string& principal) {
  return Must(identities.Issue(TokenRequest(role, team, principal), "local")).text;
}

// Creates each of `names` as a team whose jobs may ask for a priority up to `max_priority`; a
// failure ends the test.
inline void CreateTeams(IdentityAdmin& identities, std::initializer_list<const char*> names, int max_priority = 10) {
  for (const char* name : names) {
    Team team;
    team.name = name;
    team.max_priority = max_priority;
    Must(identities.CreateTeam(team));
  }
}

}  // namespace minions::testing
