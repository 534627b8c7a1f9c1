#pragma once
// `minions server`, `minions watchdog` and `minions config check`: the processes that keep the
// pool's state, and the check of their configuration.

#include <cstdint>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "verbs/shared.h"

namespace minions::apps {

// `server`, `watchdog` and `config check`. Flags override the environment, which overrides the
// config file (see apps/config.h).
struct ProcessVerbs {
  std::string flag_listen, flag_http_listen, flag_data_dir, flag_database, flag_objects, flag_tls_cert, flag_tls_key;
  int64_t flag_ttl_ms = 0, flag_straggler_ms = -1, flag_half_life_s = 0, flag_warm_wait_ms = -1,
          flag_heartbeat_batch = 0, flag_heartbeat_linger_us = -1, flag_task_target_s = 0, flag_history_step_s = 0, flag_credential_refresh_s = 0;
  std::vector<std::string> flag_openai_model_dirs;
  int64_t flag_openai_max_file_bytes = 0;
  bool no_watchdog = false;
  bool no_model_affinity = false;
  bool spot_checks = false;
  bool no_idle_poll_renewals = false;
  bool require_confined_executors = false;
  bool require_approval = false;
  std::string watchdog_http_listen;  // watchdog --http-listen
  bool connect = false;              // config check --connect
  CLI::App* server_cmd = nullptr;
  CLI::App* watchdog_cmd = nullptr;
  CLI::App* config_check_cmd = nullptr;
};

void AddProcessVerbs(CLI::App& app, SharedFlags* shared, ProcessVerbs* p);

// Runs `server`, `watchdog` or `config check`, whichever was parsed.
int RunProcessVerb(const ProcessVerbs& p, const std::string& config_path);

}  // namespace minions::apps
