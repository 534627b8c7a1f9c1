#include "model/identity.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace minions {
namespace {

constexpr std::string_view kRoles[] = {"admin", "submitter", "viewer", "monitor", "executor", "join"};

struct ScopeEntry {
  Scope scope;
  std::string_view name;
};
constexpr ScopeEntry kScopes[] = {
    {Scope::kAdmin, "admin"},          {Scope::kJobsRead, "jobs:read"},       {Scope::kJobsWrite, "jobs:write"},
    {Scope::kFleetRead, "fleet:read"}, {Scope::kMetricsRead, "metrics:read"}, {Scope::kExecutor, "executor"},
    {Scope::kEnrol, "enrol"},          {Scope::kGang, "gang"},
};

bool IsNameChar(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_'; }

}  // namespace

std::string_view RoleName(Role role) { return kRoles[static_cast<int>(role)]; }

std::optional<Role> ParseRole(std::string_view name) {
  for (size_t i = 0; i < std::size(kRoles); ++i) {
    if (kRoles[i] == name) return static_cast<Role>(i);
  }
  return std::nullopt;
}

bool IsTeamRole(Role role) { return role == Role::kSubmitter || role == Role::kViewer; }

std::string_view ScopeName(Scope scope) {
  for (const auto& entry : kScopes) {
    if (entry.scope == scope) return entry.name;
  }
  return "?";
}

std::string ScopesToString(ScopeSet scopes) {
  std::string out;
  for (const auto& entry : kScopes) {
    if (scopes.Has(entry.scope)) absl::StrAppend(&out, out.empty() ? "" : " ", std::string(entry.name));
  }
  return out;
}

absl::Status ParseScopes(std::string_view text, ScopeSet* scopes) {
  uint32_t bits = 0;
  for (absl::string_view name : absl::StrSplit(absl::string_view(text.data(), text.size()), ' ', absl::SkipEmpty())) {
    bool known = false;
    for (const auto& entry : kScopes) {
      if (entry.name == std::string_view(name.data(), name.size())) {
        bits |= static_cast<uint32_t>(entry.scope);
        known = true;
      }
    }
    if (!known) return absl::InvalidArgumentError(absl::StrCat("unknown scope '", std::string(name), "'"));
  }
  *scopes = ScopeSet(bits);
  return absl::OkStatus();
}

ScopeSet DefaultScopes(Role role) {
  switch (role) {
    case Role::kAdmin:
      return {Scope::kAdmin, Scope::kJobsRead, Scope::kJobsWrite, Scope::kFleetRead, Scope::kMetricsRead};
    case Role::kSubmitter:
      return {Scope::kJobsRead, Scope::kJobsWrite, Scope::kFleetRead};
    case Role::kViewer:
      return {Scope::kJobsRead, Scope::kFleetRead};
    case Role::kMonitor:
      return {Scope::kMetricsRead, Scope::kFleetRead};
    case Role::kExecutor:
      return {Scope::kExecutor};
    case Role::kJoin:
      return {Scope::kEnrol};
  }
  return {};
}

ScopeSet GrantableScopes(Role role) {
  ScopeSet scopes = DefaultScopes(role);
  if (role == Role::kJoin || role == Role::kExecutor) scopes = ScopeSet(scopes.bits() | static_cast<uint32_t>(Scope::kGang));
  return scopes;
}

absl::Status ValidateTeamName(std::string_view name) {
  bool ok = !name.empty() && name.size() <= 63 && name[0] != '-' && name[0] != '_';
  for (char c : name) ok = ok && IsNameChar(c);
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "team name '", std::string(name.substr(0, 80)),
        "' is not valid: use 1-63 lower-case letters, digits, '-' or '_', starting with a letter or digit"));
  }
  return absl::OkStatus();
}

std::string ExecutorOwner(const TokenRecord& join) {
  return join.principal.empty() || join.principal == kDefaultJoinTokenName ? join.id : join.principal;
}

absl::Status ValidateVerifyFraction(double fraction) {
  // Written so that NaN fails too.
  if (fraction == 0 || (fraction >= kMinTeamVerifyFraction && fraction <= 1)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "a team's verify fraction is 0 (the fleet's) or between ", kMinTeamVerifyFraction,
      " and 1: spot checks are never off for a team (a forging executor would forge where they are)"));
}

absl::Status ValidateExecutorName(std::string_view name) {
  bool ok = name.size() <= 100;  // "" is an executor that gave no name (shown by its id)
  for (size_t i = 0; ok && i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    const bool c1 = c == 0xc2 && i + 1 < name.size() && static_cast<unsigned char>(name[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(name[i + 1]) <= 0x9f;
    ok = c >= 0x20 && c != 0x7f && !c1;
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        "an executor's name must be at most 100 bytes without control characters (a host name or a label)");
  }
  return absl::OkStatus();
}

absl::Status ValidatePrincipalName(std::string_view name) {
  bool ok = !name.empty() && name.size() <= 100 && name != "." && name != "..";
  for (char c : name) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                c == '-');
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        "a token's holder name must be 1-100 of [A-Za-z0-9._-] (who holds it: a person, a program, a machine)");
  }
  return absl::OkStatus();
}

absl::Status CheckUsable(const TokenRecord& token, absl::Time now) {
  if (token.revoked_at) {
    return absl::UnauthenticatedError(absl::StrCat("token ", token.id, " was revoked"));
  }
  if (token.expires_at && now >= *token.expires_at) {
    if (token.role == Role::kExecutor) {
      // Executors rotate their credential before it expires (Executors.RotateCredential); one
      // that was away past its expiry must enrol again.
      return absl::UnauthenticatedError(absl::StrCat(
          "executor credential ", token.id, " expired at ", absl::FormatTime(*token.expires_at, absl::UTCTimeZone()),
          " (an executor rotates its credential before it expires; one that was away longer enrols again "
          "with a new join token)"));
    }
    return absl::UnauthenticatedError(absl::StrCat("token ", token.id, " has expired"));
  }
  if (token.role == Role::kJoin && token.uses_left <= 0) {
    return absl::UnauthenticatedError(absl::StrCat("join token ", token.id, " is used up"));
  }
  return absl::OkStatus();
}

}  // namespace minions
