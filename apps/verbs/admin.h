#pragma once
// `minions admin` (teams and credentials, over the network with an admin token or on the server's
// own data) and `minions pki` (a private CA for a pool's TLS).

#include <string>

#include "CLI/CLI.hpp"
#include "cli/admin_verbs.h"
#include "identity/pki.h"
#include "verbs/shared.h"

namespace minions::apps {

// `admin` (over the network with an admin token, or on the server's own data) and `pki`.
struct AdminVerbs {
  std::string admin_data_dir, admin_database;
  minions::cli::TeamOptions team_options;
  minions::cli::IssueOptions issue;
  std::string token_id, token_team, token_role;
  bool all_tokens = false;
  minions::cli::IssueOptions join_issue;
  minions::pki::InitOptions pki_options;
  CLI::App* admin_cmd = nullptr;
  CLI::App* team_create_cmd = nullptr;
  CLI::App* team_set_cmd = nullptr;
  CLI::App* teams_cmd = nullptr;
  CLI::App* token_issue_cmd = nullptr;
  CLI::App* token_revoke_cmd = nullptr;
  CLI::App* tokens_cmd = nullptr;
  CLI::App* join_cmd = nullptr;
  CLI::App* pki_init_cmd = nullptr;
};

void AddAdminVerbs(CLI::App& app, SharedFlags* shared, AdminVerbs* a);
// Runs the `admin` verb parsed: on the server's own data (no token needed: whoever reads the
// database is its admin), or over the network with an admin token.
int RunAdminVerb(const AdminVerbs& a, const SharedFlags& shared);
int RunPkiInit(const minions::pki::InitOptions& pki_options);

}  // namespace minions::apps
