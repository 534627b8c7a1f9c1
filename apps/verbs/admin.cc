#include "verbs/admin.h"

#include <cstdio>
#include <memory>

#include "absl/strings/str_join.h"
#include "model/identity.h"
#include "backends.h"
#include "config.h"
#include "identity_setup.h"

namespace minions::apps {

void AddAdminVerbs(CLI::App& app, SharedFlags* shared, AdminVerbs* a) {
  auto* admin_cmd = a->admin_cmd =
      app.add_subcommand("admin", "teams and credentials (an admin token, or --data-dir/--database)");
  admin_cmd->require_subcommand(1);
  AddConnection(admin_cmd, &shared->connection, nullptr);  // its --config is below
  admin_cmd->add_option("--data-dir", a->admin_data_dir, "act on this server's own data instead of over the network");
  admin_cmd->add_option("--database", a->admin_database, "... or on this database (postgresql://..., sqlite:/path)");
  admin_cmd->add_option("--config", shared->config_path, "... or on the database of this config file");
  admin_cmd->add_flag("--json", shared->json, "JSON output");
  minions::cli::TeamOptions& team_options = a->team_options;
  auto* team_cmd = admin_cmd->add_subcommand("team", "create or change a team");
  team_cmd->require_subcommand(1);
  auto add_team_options = [&](CLI::App* cmd) {
    cmd->add_option("name", team_options.name, "team name (lower case letters, digits, - and _)")->required();
    cmd->add_option("--max-priority", team_options.max_priority, "its jobs' priority ceiling (new teams: 10)");
    cmd->add_option("--max-queued-jobs,--max-active-jobs", team_options.max_active_jobs,
                    "its jobs not yet ended (queued or running) at once; a submit over it is refused (0: no limit)");
    cmd->add_option("--weight", team_options.weight, "fair-share weight, 1 or more (new teams: 1)");
    cmd->add_option("--max-running", team_options.max_running_tasks, "its tasks running at once (0: no limit)");
    cmd->add_option("--requests-per-second", team_options.requests_per_second,
                    "API calls per second per server (0: no limit)");
    cmd->add_option("--max-file-bytes", team_options.max_file_bytes,
                    "bytes of files and job inputs it keeps, e.g. 200G (new teams: 100G; 0: no limit)");
    cmd->add_option("--max-model-bytes", team_options.max_model_bytes,
                    "bytes of models it keeps, each digest once, e.g. 1T (new teams: 500G; 0: no limit)");
    cmd->add_option("--max-result-bytes", team_options.max_result_bytes,
                    "bytes of its jobs' results kept, e.g. 200G (new teams: 100G; 0: no limit)");
    cmd->add_option("--runners", team_options.runners,
                    "the runners its jobs may name, comma-separated, e.g. llama,embed (any: those the server allows)");
    cmd->add_option("--require-confined", team_options.require_confined,
                    "true: its jobs run only on executors whose runners are fully confined (new teams: false)");
    cmd->add_option("--verify-fraction", team_options.verify_fraction,
                    "the share of its jobs' records other executors re-score, 0.01 to 1 (0: the fleet's, "
                    "server.spot_checks; never off)");
  };
  auto* team_create_cmd = a->team_create_cmd = team_cmd->add_subcommand("create", "create a team");
  add_team_options(team_create_cmd);
  auto* team_set_cmd = a->team_set_cmd = team_cmd->add_subcommand("set", "change a team's settings");
  add_team_options(team_set_cmd);
  auto* teams_cmd = a->teams_cmd = admin_cmd->add_subcommand("teams", "list the teams: fair-share weight, share, usage, running tasks, quotas");
  minions::cli::IssueOptions& issue = a->issue;
  auto* token_cmd = admin_cmd->add_subcommand("token", "issue or revoke a token");
  token_cmd->require_subcommand(1);
  auto* token_issue_cmd = a->token_issue_cmd = token_cmd->add_subcommand("issue", "issue a token (shown once)");
  token_issue_cmd->add_option("--role", issue.role, "admin, submitter, viewer, monitor or join")->required();
  token_issue_cmd->add_option("--team", issue.team, "the team of a submitter or viewer");
  token_issue_cmd->add_option("--name", issue.name, "who will hold it (alice, ci, prometheus)")->required();
  token_issue_cmd->add_option("--expires", issue.expires, "lifetime: 90d, 12h or never (default: submitter and viewer tokens the server's token_ttl, 90d; join tokens 24h; others never)");
  token_issue_cmd->add_option("--uses", issue.uses, "join tokens: how many executors may enrol with it (default 1)");
  token_issue_cmd->add_option("--scopes", issue.scopes, "fewer scopes than the role's, e.g. \"jobs:read\"");
  token_issue_cmd->add_option("-o,--output", issue.output, "write the token to this file (mode 0600)");
  auto* token_revoke_cmd = a->token_revoke_cmd = token_cmd->add_subcommand("revoke", "revoke a token now");
  token_revoke_cmd->add_option("id", a->token_id, "token id (tok-...)")->required();
  auto* tokens_cmd = a->tokens_cmd = admin_cmd->add_subcommand("tokens", "list tokens (never their text)");
  tokens_cmd->add_option("--team", a->token_team, "only this team's");
  tokens_cmd->add_option("--role", a->token_role, "only this role's");
  tokens_cmd->add_flag("--all", a->all_tokens, "revoked ones too");
  minions::cli::IssueOptions& join_issue = a->join_issue;
  join_issue.role = "join";
  join_issue.name = kDefaultJoinTokenName;
  auto* join_cmd = a->join_cmd = admin_cmd->add_subcommand("join-token", "issue a token executors enrol with");
  join_cmd->add_option("--uses", join_issue.uses, "how many executors may enrol with it (default 1)");
  join_cmd->add_option("--expires", join_issue.expires, "lifetime (default 24h)");
  join_cmd->add_option("--name", join_issue.name,
                       "who owns the machines it is for: their executors count as one owner, and spot checks go "
                       "to another owner's executors first (default: each join token is an owner of its own)");
  join_cmd->add_option("-o,--output", join_issue.output, "write the token to this file (mode 0600)");
  join_cmd->add_flag_callback(
      "--gang", [&join_issue] { join_issue.scopes = "enrol gang"; },
      "the executors it enrols may join gangs (lend memory to other machines' jobs over the gang network)");

  // The connection and --json flags of `admin` may come after its verbs too.
  for (CLI::App* cmd : {team_cmd, team_create_cmd, team_set_cmd, teams_cmd, token_cmd, token_issue_cmd,
                        token_revoke_cmd, tokens_cmd, join_cmd}) {
    cmd->fallthrough();
  }

  minions::pki::InitOptions& pki_options = a->pki_options;
  auto* pki_cmd = app.add_subcommand("pki", "a private certificate authority for a pool's TLS");
  pki_cmd->require_subcommand(1);
  auto* pki_init_cmd = a->pki_init_cmd =
      pki_cmd->add_subcommand("init", "make a CA (if none) and a server certificate signed by it");
  pki_init_cmd->add_option("--dir", pki_options.dir, "where the files go")->required();
  pki_init_cmd->add_option("--host", pki_options.hosts,
                           "a name or address clients dial (repeat; localhost, 127.0.0.1 and this host's name are added)");
}

int RunAdminVerb(const AdminVerbs& a, const SharedFlags& shared) {
  std::unique_ptr<minions::cli::AdminBackend> admin;
  minions::apps::Backends local;
  minions::RealClock clock;
  if (!a.admin_data_dir.empty() || !a.admin_database.empty() || !shared.config_path.empty()) {
    auto config = minions::apps::LoadConfig(shared.config_path);
    if (!config.ok()) {
      fprintf(stderr, "error: %s\n", std::string(config.status().message()).c_str());
      return 1;
    }
    if (!a.admin_data_dir.empty()) config->data_dir = a.admin_data_dir;
    if (!a.admin_database.empty()) config->database = a.admin_database;
    auto backends = minions::apps::OpenBackends(*config, &clock);
    if (!backends.ok()) {
      fprintf(stderr, "error: %s\n", std::string(backends.status().message()).c_str());
      return 1;
    }
    local = std::move(*backends);
    admin = minions::apps::LocalAdmin(local.store.get(), &clock);
  } else {
    admin = minions::cli::RemoteAdmin(shared.connection);
  }
  const bool json = shared.json;
  if (a.team_create_cmd->parsed()) return minions::cli::CreateTeam(*admin, a.team_options, json);
  if (a.team_set_cmd->parsed()) return minions::cli::UpdateTeam(*admin, a.team_options, json);
  if (a.teams_cmd->parsed()) return minions::cli::ListTeams(*admin, json);
  if (a.token_issue_cmd->parsed()) return minions::cli::IssueToken(*admin, a.issue, json);
  if (a.token_revoke_cmd->parsed()) return minions::cli::RevokeToken(*admin, a.token_id, json);
  if (a.tokens_cmd->parsed()) return minions::cli::ListTokens(*admin, a.token_team, a.token_role, a.all_tokens, json);
  if (a.join_cmd->parsed()) return minions::cli::IssueToken(*admin, a.join_issue, json);
  return 1;
}

int RunPkiInit(const minions::pki::InitOptions& pki_options) {
  auto files = minions::pki::Init(pki_options, absl::Now());
  if (!files.ok()) {
    fprintf(stderr, "error: %s\n", std::string(files.status().message()).c_str());
    return 1;
  }
  printf("%s %s\nserver certificate %s (key %s) for %s\n"
         "  server:     minions server --tls-cert %s --tls-key %s ...\n"
         "  clients and executors: --ca %s (or MINIONS_CA); keep %s on this machine\n",
         files->ca_created ? "made the CA" : "kept the CA", files->ca_cert.c_str(), files->server_cert.c_str(),
         files->server_key.c_str(), absl::StrJoin(minions::pki::ServerNames(pki_options.hosts), ", ").c_str(),
         files->server_cert.c_str(), files->server_key.c_str(), files->ca_cert.c_str(), files->ca_key.c_str());
  return 0;
}

}  // namespace minions::apps
