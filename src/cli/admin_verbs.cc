#include "cli/admin_verbs.h"

#include <cstdio>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "cli/credentials.h"
#include "cli/model_verbs.h"
#include "cli/output.h"
#include "common/logging.h"
#include "rpc/rpc.h"

namespace minions::cli {
namespace {

std::string When(int64_t ms) {
  if (ms <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M", absl::FromUnixMillis(ms), absl::LocalTimeZone());
}

std::string Limit(int64_t value) { return value > 0 ? absl::StrCat(value) : "none"; }

std::string Percent(double fraction) { return absl::StrFormat("%.1f%%", 100 * fraction); }

// A team's spot-check fraction as people read it: "2.0%", or the fleet's.
std::string VerifyFraction(double fraction) { return fraction > 0 ? Percent(fraction) : "fleet's"; }

// "12 GiB/100 GiB": what a team keeps of a kind of bytes, and its limit.
std::string BytesOf(int64_t used, int64_t limit) {
  return absl::StrCat(HumanBytes(used), "/", limit > 0 ? HumanBytes(limit) : "none");
}

void PrintTeam(const v1::Team& t) {
  printf("%-20s %6lld %8s %8s %14.0f %12.2f %8lld %12s %12s %12d %14s %22s %22s %22s %8s\n", t.name().c_str(),
         static_cast<long long>(t.weight()), Percent(t.usage().target_share()).c_str(),
         Percent(t.usage().usage_share()).c_str(), t.usage().usage_device_seconds(),
         t.usage().device_seconds() / 3600, static_cast<long long>(t.usage().running_tasks()), Limit(t.max_running_tasks()).c_str(),
         Limit(t.max_active_jobs()).c_str(), t.max_priority(), Limit(t.requests_per_second()).c_str(),
         BytesOf(t.file_bytes(), t.max_file_bytes()).c_str(), BytesOf(t.model_bytes(), t.max_model_bytes()).c_str(),
         BytesOf(t.result_bytes(), t.max_result_bytes()).c_str(), VerifyFraction(t.verify_fraction()).c_str());
}

class RemoteAdminBackend : public AdminBackend {
 public:
  explicit RemoteAdminBackend(const Connection& connection) : client_(connection) {}

  absl::StatusOr<v1::Team> CreateTeam(const v1::Team& team) override {
    v1::CreateTeamRequest request;
    *request.mutable_team() = team;
    return Call(&v1::Admin::Stub::CreateTeam, request, v1::Team());
  }
  absl::StatusOr<v1::Team> UpdateTeam(const v1::Team& team) override {
    v1::UpdateTeamRequest request;
    *request.mutable_team() = team;
    return Call(&v1::Admin::Stub::UpdateTeam, request, v1::Team());
  }
  absl::StatusOr<std::vector<v1::Team>> ListTeams() override {
    auto reply = Call(&v1::Admin::Stub::ListTeams, v1::ListTeamsRequest(), v1::ListTeamsResponse());
    if (!reply.ok()) return reply.status();
    return std::vector<v1::Team>(reply->teams().begin(), reply->teams().end());
  }
  absl::StatusOr<v1::IssuedToken> IssueToken(const v1::IssueTokenRequest& request) override {
    return Call(&v1::Admin::Stub::IssueToken, request, v1::IssuedToken());
  }
  absl::StatusOr<std::vector<v1::TokenInfo>> ListTokens(const v1::ListTokensRequest& request) override {
    auto reply = Call(&v1::Admin::Stub::ListTokens, request, v1::ListTokensResponse());
    if (!reply.ok()) return reply.status();
    return std::vector<v1::TokenInfo>(reply->tokens().begin(), reply->tokens().end());
  }
  absl::StatusOr<v1::TokenInfo> RevokeToken(const std::string& token_id) override {
    v1::RevokeTokenRequest request;
    request.set_token_id(token_id);
    return Call(&v1::Admin::Stub::RevokeToken, request, v1::TokenInfo());
  }
  absl::StatusOr<v1::Executor> RevokeExecutor(const std::string& executor_id) override {
    v1::RevokeExecutorRequest request;
    request.set_executor_id(executor_id);
    return Call(&v1::Admin::Stub::RevokeExecutor, request, v1::Executor());
  }
  absl::StatusOr<v1::Executor> ReleaseExecutor(const std::string& executor_id) override {
    v1::ReleaseExecutorRequest request;
    request.set_executor_id(executor_id);
    return Call(&v1::Admin::Stub::ReleaseExecutor, request, v1::Executor());
  }
  absl::StatusOr<v1::TokenInfo> WhoAmI() override {
    return Call(&v1::Admin::Stub::WhoAmI, v1::WhoAmIRequest(), v1::TokenInfo());
  }
  absl::StatusOr<v1::Executor> ApproveExecutor(const std::string& executor_id) override {
    v1::ApproveExecutorRequest request;
    request.set_executor_id(executor_id);
    return Call(&v1::Admin::Stub::ApproveExecutor, request, v1::Executor());
  }

 private:
  template <typename Method, typename Request, typename Reply>
  absl::StatusOr<Reply> Call(Method method, const Request& request, Reply reply) {
    return client_.Call(method, request, std::move(reply));
  }

  ServiceClient<v1::Admin> client_;
};

absl::StatusOr<v1::Team> TeamOf(const TeamOptions& options, v1::Team base) {
  base.set_name(options.name);
  struct Size {
    const std::optional<std::string>& text;
    void (v1::Team::*set)(int64_t);
  };
  for (const Size& size : {Size{options.max_file_bytes, &v1::Team::set_max_file_bytes},
                           Size{options.max_model_bytes, &v1::Team::set_max_model_bytes},
                           Size{options.max_result_bytes, &v1::Team::set_max_result_bytes}}) {
    if (!size.text) continue;
    absl::StatusOr<int64_t> bytes = ParseByteSize(*size.text);
    if (!bytes.ok()) return bytes.status();
    (base.*size.set)(*bytes);
  }
  if (options.max_priority) base.set_max_priority(*options.max_priority);
  if (options.max_active_jobs) base.set_max_active_jobs(*options.max_active_jobs);
  if (options.requests_per_second) base.set_requests_per_second(*options.requests_per_second);
  if (options.weight) base.set_weight(*options.weight);
  if (options.max_running_tasks) base.set_max_running_tasks(*options.max_running_tasks);
  if (options.runners) {
    base.clear_runners();
    if (*options.runners != "any") {
      for (absl::string_view runner : absl::StrSplit(*options.runners, ',', absl::SkipWhitespace())) {
        base.add_runners(std::string(absl::StripAsciiWhitespace(runner)));
      }
    }
  }
  if (options.require_confined) base.set_require_confined(*options.require_confined);
  if (options.verify_fraction) base.set_verify_fraction(*options.verify_fraction);
  base.clear_usage();
  base.clear_file_bytes();
  base.clear_model_bytes();
  base.clear_result_bytes();
  return base;
}

std::string ByteLimit(int64_t value) { return value > 0 ? HumanBytes(value) : "none"; }

int PrintTeamResult(const absl::StatusOr<v1::Team>& team, bool json, const char* verb) {
  if (!team.ok()) return Fail(team.status());
  return PrintAnswer(*team, json, [&](const v1::Team& t) {
    printf("team %s %s: weight %lld, running tasks %s, queued jobs %s, priority at most %d, requests per second %s, "
           "files %s, models %s, results %s, spot checks %s, runners %s%s\n",
           t.name().c_str(), verb, static_cast<long long>(t.weight()), Limit(t.max_running_tasks()).c_str(),
           Limit(t.max_active_jobs()).c_str(), t.max_priority(), Limit(t.requests_per_second()).c_str(),
           ByteLimit(t.max_file_bytes()).c_str(), ByteLimit(t.max_model_bytes()).c_str(),
           ByteLimit(t.max_result_bytes()).c_str(), VerifyFraction(t.verify_fraction()).c_str(),
           t.runners().empty() ? "any" : absl::StrJoin(t.runners(), ",").c_str(),
           t.require_confined() ? ", confined executors only" : "");
  });
}

}  // namespace

std::unique_ptr<AdminBackend> RemoteAdmin(const Connection& connection) {
  return std::make_unique<RemoteAdminBackend>(connection);
}

absl::StatusOr<absl::Duration> ParseLifetime(const std::string& text) {
  absl::Duration d;
  int64_t days = 0;
  if (text.size() > 1 && text.back() == 'd' && absl::SimpleAtoi(text.substr(0, text.size() - 1), &days) && days > 0) {
    return absl::Hours(24 * days);
  }
  if (absl::ParseDuration(text, &d) && d > absl::ZeroDuration()) return d;
  return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a lifetime such as 90d, 12h or 30m"));
}

absl::StatusOr<int64_t> ParseByteSize(const std::string& text) {
  absl::string_view digits = text;
  for (absl::string_view unit : {"iB", "B"}) {
    if (digits.size() > unit.size() && absl::EndsWith(digits, unit)) {
      digits.remove_suffix(unit.size());
      break;
    }
  }
  int shift = 0;
  if (!digits.empty()) {
    switch (absl::ascii_toupper(static_cast<unsigned char>(digits.back()))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      default: break;
    }
    if (shift > 0) digits.remove_suffix(1);
  }
  int64_t value = 0;
  if (digits.empty() || !absl::SimpleAtoi(digits, &value) || value < 0 ||
      value > (std::numeric_limits<int64_t>::max() >> shift)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a size such as 500M, 200G or 0 (no limit)"));
  }
  return value << shift;
}

int CreateTeam(AdminBackend& admin, const TeamOptions& options, bool json) {
  v1::Team team;
  team.set_max_priority(10);
  team.set_weight(1);
  absl::StatusOr<v1::Team> asked = TeamOf(options, team);
  if (!asked.ok()) return Fail(asked.status());
  return PrintTeamResult(admin.CreateTeam(*asked), json, "created");
}

int UpdateTeam(AdminBackend& admin, const TeamOptions& options, bool json) {
  auto teams = admin.ListTeams();
  if (!teams.ok()) return Fail(teams.status());
  for (const v1::Team& team : *teams) {
    if (team.name() != options.name) continue;
    absl::StatusOr<v1::Team> asked = TeamOf(options, team);
    if (!asked.ok()) return Fail(asked.status());
    return PrintTeamResult(admin.UpdateTeam(*asked), json, "updated");
  }
  return Fail(absl::NotFoundError(absl::StrCat("no team ", options.name, " (create it: minions admin team create ",
                                               options.name, ")")));
}

int ListTeams(AdminBackend& admin, bool json) {
  auto teams = admin.ListTeams();
  if (!teams.ok()) return Fail(teams.status());
  PrintTeams(*teams, json);
  return 0;
}

void PrintTeams(const std::vector<v1::Team>& teams, bool json) {
  if (json) {
    PrintJsonArray(teams);
    return;
  }
  printf("%-20s %6s %8s %8s %14s %12s %8s %12s %12s %12s %14s %22s %22s %22s %8s\n", "TEAM", "WEIGHT", "SHARE", "USED",
         "USAGE (DEV-S)", "DEVICE-HOURS", "RUNNING", "MAX RUNNING", "MAX QUEUED", "MAX PRIORITY", "REQUESTS/S",
         "FILES/MAX", "MODELS/MAX", "RESULTS/MAX", "VERIFY");
  for (const v1::Team& team : teams) PrintTeam(team);
}

int IssueToken(AdminBackend& admin, const IssueOptions& options, bool json) {
  v1::IssueTokenRequest request;
  request.set_role(options.role);
  request.set_team(options.team);
  request.set_principal(options.name);
  request.set_uses(options.uses);
  request.set_scopes(options.scopes);
  if (!options.expires.empty()) {
    if (options.expires == "never") {
      request.set_no_expiry(true);
    } else {
      auto ttl = ParseLifetime(options.expires);
      if (!ttl.ok()) return Fail(ttl.status());
      request.set_ttl_ms(absl::ToInt64Milliseconds(*ttl));
    }
  }
  auto issued = admin.IssueToken(request);
  if (!issued.ok()) return Fail(issued.status());
  const v1::TokenInfo& info = issued->info();
  if (!options.output.empty()) {
    if (auto s = WriteTokenFile(options.output, issued->token()); !s.ok()) return Fail(s);
  }
  if (json) {
    v1::IssuedToken shown = *issued;
    if (!options.output.empty()) shown.clear_token();
    printf("%s\n", ToJson(shown).c_str());
    return 0;
  }
  // The token alone on standard output (for scripts); what it is on standard error.
  if (options.output.empty()) printf("%s\n", issued->token().c_str());
  fprintf(stderr, "issued %s: %s %s%s%s%s; %s\n", info.id().c_str(), info.role().c_str(), info.principal().c_str(),
          info.team().empty() ? "" : ("@" + info.team()).c_str(),
          info.expires_at_ms() > 0 ? (", expires " + When(info.expires_at_ms())).c_str() : "",
          info.role() == "join" ? absl::StrCat(", ", info.uses_left(), " use(s)").c_str() : "",
          options.output.empty() ? "it is shown this once: keep it in a 0600 file or the Keychain"
                                 : ("written to " + options.output + " (mode 0600)").c_str());
  return 0;
}

int ListTokens(AdminBackend& admin, const std::string& team, const std::string& role, bool all, bool json) {
  v1::ListTokensRequest request;
  request.set_team(team);
  request.set_role(role);
  request.set_include_revoked(all);
  auto tokens = admin.ListTokens(request);
  if (!tokens.ok()) return Fail(tokens.status());
  if (json) {
    PrintJsonArray(*tokens);
    return 0;
  }
  printf("%-16s %-9s %-24s %-16s %-16s %-16s %s\n", "TOKEN", "ROLE", "HOLDER", "CREATED", "EXPIRES", "LAST USED",
         "STATE");
  for (const v1::TokenInfo& t : *tokens) {
    std::string holder = t.principal() + (t.team().empty() ? "" : "@" + t.team());
    std::string state = t.revoked_at_ms() > 0 ? "revoked " + When(t.revoked_at_ms())
                        : (t.expires_at_ms() > 0 && t.expires_at_ms() <= absl::ToUnixMillis(absl::Now())) ? "expired"
                        : t.role() == "join" ? absl::StrCat(t.uses_left(), " use(s) left")
                                             : "active";
    printf("%-16s %-9s %-24s %-16s %-16s %-16s %s\n", t.id().c_str(), t.role().c_str(), holder.c_str(),
           When(t.created_at_ms()).c_str(), When(t.expires_at_ms()).c_str(), When(t.last_used_at_ms()).c_str(),
           state.c_str());
  }
  return 0;
}

int RevokeToken(AdminBackend& admin, const std::string& token_id, bool json) {
  auto token = admin.RevokeToken(token_id);
  if (!token.ok()) return Fail(token.status());
  return PrintAnswer(*token, json, [](const v1::TokenInfo& t) { printf("token %s revoked\n", t.id().c_str()); });
}

int RevokeExecutor(AdminBackend& admin, const std::string& executor_id, bool json) {
  auto executor = admin.RevokeExecutor(executor_id);
  if (!executor.ok()) return Fail(executor.status());
  return PrintAnswer(*executor, json, [](const v1::Executor& e) {
    printf("executor %s revoked: its credentials no longer work and its tasks went back to pending\n", e.id().c_str());
  });
}

int ReleaseExecutor(AdminBackend& admin, const std::string& executor_id, bool json) {
  auto executor = admin.ReleaseExecutor(executor_id);
  if (!executor.ok()) return Fail(executor.status());
  return PrintAnswer(*executor, json, [](const v1::Executor& e) {
    printf("executor %s released from quarantine: it may lease again\n", e.id().c_str());
  });
}

// An executor id, or the id of the one pending executor named `name` (an admin approves what
// `minions executors` shows, usually by name).
absl::StatusOr<std::string> PendingExecutorId(const Connection& connection, const std::string& name) {
  if (absl::StartsWith(name, "exe-")) return name;
  absl::StatusOr<std::vector<v1::Executor>> fleet = JobsClient(connection).Executors();
  if (!fleet.ok()) return fleet.status();
  std::vector<std::string> ids;
  for (const v1::Executor& e : *fleet) {
    if (e.name() == name && e.state() == "pending") ids.push_back(e.id());
  }
  if (ids.size() == 1) return ids[0];
  if (ids.empty()) {
    return absl::NotFoundError(absl::StrCat("no pending executor is named '", name,
                                            "' (`minions executors` lists them; approve by id: exe-...)"));
  }
  return absl::FailedPreconditionError(absl::StrCat(ids.size(), " pending executors are named '", name,
                                                    "': approve one by its id (", absl::StrJoin(ids, ", "), ")"));
}

int ApproveExecutor(AdminBackend& admin, const Connection& connection, const std::string& executor, bool json) {
  absl::StatusOr<std::string> id = PendingExecutorId(connection, executor);
  if (!id.ok()) return Fail(id.status());
  auto approved = admin.ApproveExecutor(*id);
  if (!approved.ok()) return Fail(approved.status());
  return PrintAnswer(*approved, json, [](const v1::Executor& e) {
    printf("executor %s (%s) approved: it may take work now\n", e.id().c_str(),
           EscapeControlCharacters(e.name()).c_str());
  });
}

int WhoAmI(AdminBackend& admin, bool json) {
  auto me = admin.WhoAmI();
  if (!me.ok()) return Fail(me.status());
  return PrintAnswer(*me, json, [](const v1::TokenInfo& t) {
    printf("%s: %s %s%s (scopes: %s)\n", t.id().c_str(), t.role().c_str(), t.principal().c_str(),
           t.team().empty() ? "" : ("@" + t.team()).c_str(), t.scopes().c_str());
  });
}

}  // namespace minions::cli
