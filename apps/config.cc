#include "config.h"

#include <cstdlib>
#include <filesystem>
#include <tuple>
#include <vector>

#include <toml++/toml.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "backends.h"
#include "common/redact.h"
#include "common/host_port.h"
#include "model/model_ref.h"
#include "cli/demo.h"
#include "executor/availability_controller.h"

namespace minions::apps {
namespace {

void FromEnv(const char* name, std::string* field) {
  if (const char* value = std::getenv(name); value && *value) *field = value;
}

}  // namespace

absl::StatusOr<MinionsConfig> LoadConfig(const std::string& path_arg) {
  MinionsConfig config;
  config.data_dir = cli::MinionsHome() + "/server";
  std::string path = path_arg;
  if (path.empty()) FromEnv("MINIONS_CONFIG", &path);
  if (!path.empty()) {
    config.source = path;
    toml::table table;
    try {
      table = toml::parse_file(path);
    } catch (const toml::parse_error& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config file ", path, ": ", std::string(e.description()), " at line ", e.source().begin.line));
    }
    static const char* kSections[] = {"server", "store", "objects", "executor", "availability", "runners", "gang"};
    for (const auto& [key, value] : table) {
      bool known = false;
      for (const char* s : kSections) known |= key.str() == s;
      if (!known) {
        return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": unknown section [",
                                                       std::string(key.str()), "]; expected server, store, objects, executor, runners, availability or gang"));
      }
    }
    auto str = [&](const char* section, const char* key, std::string* field) {
      if (auto v = table[section][key].value<std::string>()) *field = *v;
    };
    str("server", "listen", &config.listen);
    str("server", "http_listen", &config.http_listen);
    str("server", "health_listen", &config.health_listen);
    str("server", "tls_cert", &config.tls_cert);
    str("server", "tls_key", &config.tls_key);
    config.legacy_token = table["server"]["token"].is_value();
    str("server", "data_dir", &config.data_dir);
    if (auto v = table["server"]["lease_ttl_ms"].value<int64_t>()) config.lease_ttl_ms = *v;
    if (auto v = table["server"]["straggler_factor"].value<double>()) config.straggler_factor = *v;
    if (auto v = table["server"]["straggler_min_runtime_ms"].value<int64_t>()) config.straggler_min_runtime_ms = *v;
    if (auto v = table["server"]["fair_share_half_life_s"].value<int64_t>()) config.fair_share_half_life_s = *v;
    if (auto v = table["server"]["warm_wait_ms"].value<int64_t>()) config.warm_wait_ms = *v;
    if (auto v = table["server"]["model_affinity"].value<bool>()) config.model_affinity = *v;
    if (auto v = table["server"]["spot_checks"].value<bool>()) config.spot_checks = *v;
    if (auto v = table["server"]["verify_wait_s"].value<int64_t>()) config.verify_wait_s = *v;
    if (auto v = table["server"]["heartbeat_batch"].value<int64_t>()) config.heartbeat_batch = *v;
    if (auto v = table["server"]["heartbeat_linger_us"].value<int64_t>()) config.heartbeat_linger_us = *v;
    if (auto v = table["server"]["idle_polls_renew"].value<bool>()) config.idle_polls_renew = *v;
    if (auto v = table["server"]["require_confined_executors"].value<bool>()) config.require_confined_executors = *v;
    if (auto v = table["server"]["executor_approval"].value<bool>()) config.executor_approval = *v;
    if (auto v = table["server"]["task_target_s"].value<int64_t>()) config.task_target_s = *v;
    if (auto v = table["server"]["history_step_s"].value<int64_t>()) config.history_step_s = *v;
    if (auto v = table["server"]["credential_refresh_s"].value<int64_t>()) config.credential_refresh_s = *v;
    if (auto v = table["server"]["executor_credential_ttl_s"].value<int64_t>()) config.executor_credential_ttl_s = *v;
    if (auto v = table["server"]["token_ttl_s"].value<int64_t>()) config.token_ttl_s = *v;
    if (auto v = table["server"]["grpc_memory_mb"].value<int64_t>()) config.grpc_memory_mb = *v;
    if (const toml::array* list = table["server"]["runner_allowlist"].as_array()) {
      for (const auto& item : *list) {
        if (auto s = item.value<std::string>()) config.runner_allowlist.push_back(*s);
      }
    }
    if (auto v = table["server"]["watchdog"].value<bool>()) config.watchdog = *v;
    str("store", "database", &config.database);
    str("objects", "url", &config.objects);
    str("objects", "endpoint", &config.s3_endpoint);
    str("objects", "region", &config.s3_region);
    if (auto v = table["objects"]["path_style"].value<bool>()) config.s3_path_style = *v;
    if (auto v = table["executor"]["server"].value<std::string>()) {
      config.server = *v;
      config.server_source = absl::StrCat("[executor] server in ", path);
    }
    str("executor", "ca", &config.ca);
    str("executor", "join_token_file", &config.join_token_file);
    str("executor", "name", &config.executor_name);
    str("executor", "state_dir", &config.executor_state_dir);
    str("executor", "runner", &config.runner);
    str("gang", "address", &config.gang_address);
    if (auto v = table["executor"]["runner_threads"].value<int64_t>()) config.runner_threads = static_cast<int>(*v);
    for (auto [key, field] : {std::pair{"objects", &config.executor_objects}, {"models", &config.executor_models}}) {
      if (const toml::array* list = table["executor"][key].as_array()) {
        for (const auto& item : *list) {
          if (auto s = item.value<std::string>()) field->push_back(*s);
        }
      } else if (auto s = table["executor"][key].value<std::string>()) {
        field->push_back(*s);
      }
    }
    if (const toml::table* runners = table["runners"].as_table()) {
      for (const auto& [key, value] : *runners) {
        std::vector<std::string> argv;
        if (auto s = value.value<std::string>()) {
          argv = absl::StrSplit(*s, ' ', absl::SkipEmpty());
        } else if (const toml::array* list = value.as_array()) {
          for (const auto& item : *list) {
            if (auto s = item.value<std::string>()) argv.push_back(*s);
          }
        }
        config.runners.emplace_back(std::string(key.str()), std::move(argv));
      }
    }
    if (const toml::table* availability = table["availability"].as_table()) {
      for (const auto& [key, value] : *availability) {
        std::string text;
        if (auto s = value.value<std::string>()) {
          text = *s;
        } else if (auto b = value.value<bool>()) {
          text = *b ? "true" : "false";
        } else if (auto d = value.value<double>()) {
          text = absl::StrCat(*d);
        } else if (const toml::array* list = value.as_array()) {
          for (const auto& item : *list) {
            if (auto s = item.value<std::string>()) absl::StrAppend(&text, text.empty() ? "" : ",", *s);
          }
        }
        config.availability.emplace_back(std::string(key.str()), text);
      }
    }
  }
  FromEnv("MINIONS_LISTEN", &config.listen);
  FromEnv("MINIONS_HTTP_LISTEN", &config.http_listen);
  FromEnv("MINIONS_HEALTH_LISTEN", &config.health_listen);
  FromEnv("MINIONS_TLS_CERT", &config.tls_cert);
  FromEnv("MINIONS_TLS_KEY", &config.tls_key);
  FromEnv("MINIONS_CA", &config.ca);
  FromEnv("MINIONS_JOIN_TOKEN_FILE", &config.join_token_file);
  FromEnv("MINIONS_DATA_DIR", &config.data_dir);
  FromEnv("MINIONS_DATABASE", &config.database);
  FromEnv("MINIONS_OBJECTS", &config.objects);
  if (const char* server = std::getenv("MINIONS_SERVER"); server && *server) {
    config.server = server;
    config.server_source = "MINIONS_SERVER";
  }
  if (const char* mode = std::getenv("MINIONS_AVAILABILITY"); mode && *mode) config.availability.emplace_back("mode", mode);
  for (const std::string& key : AvailabilitySettingNames()) {
    std::string var = absl::AsciiStrToUpper(absl::StrCat("MINIONS_AVAILABILITY_", key));
    if (const char* value = std::getenv(var.c_str()); value && *value) config.availability.emplace_back(key, value);
  }
  return config;
}

namespace {

// Adds a problem for each (key, path, remedy) whose path is set but is not a file.
void AddMissingFiles(const std::vector<std::tuple<const char*, std::string, const char*>>& files,
                     std::vector<std::string>& problems) {
  for (const auto& [key, path, remedy] : files) {
    std::error_code ec;
    if (path.empty() || std::filesystem::is_regular_file(path, ec)) continue;
    problems.push_back(absl::StrCat(key, " names ", path, ", which ",
                                    std::filesystem::exists(path, ec) ? "is not a file" : "does not exist", " (",
                                    remedy, ")"));
  }
}

}  // namespace

std::vector<std::string> CheckExecutorFiles(const MinionsConfig& config) {
  std::vector<std::string> problems;
  AddMissingFiles({{"executor.ca", config.ca, "copy the pool's CA certificate there"},
                   {"executor.join_token_file", config.join_token_file,
                    "an admin writes one: minions admin join-token -o FILE"}},
                  problems);
  return problems;
}

namespace {

// A server setting that must lie in [low, high]: the problem names it, its value and `advice`.
void CheckRange(absl::string_view key, int64_t value, int64_t low, int64_t high, absl::string_view advice,
                std::vector<std::string>& problems) {
  if (value < low || value > high) problems.push_back(absl::StrCat("server.", key, " is ", value, "; ", advice));
}

}  // namespace

std::vector<std::string> CheckConfig(const MinionsConfig& config, bool connect) {
  std::vector<std::string> problems;
  const bool tls = !config.tls_cert.empty() || !config.tls_key.empty();
  if (config.legacy_token) {
    problems.push_back(
        "server.token is no longer used: every caller has its own token now (`minions admin token issue`; a "
        "server mints an admin token into its data folder when the pool has none). Remove the key");
  }
  if (config.listen.find(':') == std::string::npos) {
    problems.push_back(absl::StrCat("server.listen '", config.listen, "' needs a port, like 0.0.0.0:7070"));
  } else if (!IsLoopbackAddress(config.listen) && !tls) {
    problems.push_back(absl::StrCat("server.listen is ", config.listen,
                                    " (reachable from other machines) but the server has no TLS certificate: set "
                                    "server.tls_cert and server.tls_key (`minions pki init` makes them)"));
  }
  if (!config.http_listen.empty() && config.http_listen != "off" && config.http_listen.find(':') != std::string::npos &&
      !IsLoopbackAddress(config.http_listen) && !tls) {
    problems.push_back(absl::StrCat("server.http_listen is ", config.http_listen,
                                    " (reachable from other machines) but the server has no TLS certificate: set "
                                    "server.tls_cert and server.tls_key, or serve HTTP on 127.0.0.1"));
  }
  if (tls && (config.tls_cert.empty() || config.tls_key.empty())) {
    problems.push_back("TLS needs both server.tls_cert and server.tls_key");
  }
  // The files it names must be there: a server would otherwise fail later, at its first TLS call.
  AddMissingFiles({{"server.tls_cert", config.tls_cert, "`minions pki init` makes it"},
                   {"server.tls_key", config.tls_key, "`minions pki init` makes it"}},
                  problems);
  if (config.straggler_factor < 1.0) {
    problems.push_back(absl::StrCat("server.straggler_factor is ", config.straggler_factor,
                                    "; it must be at least 1 (a backup for a task slower than the median)"));
  }
  if (config.straggler_min_runtime_ms < 0) problems.push_back("server.straggler_min_runtime_ms must be 0 or more");
  if (!config.http_listen.empty() && config.http_listen != "off" &&
      config.http_listen.find(':') == std::string::npos) {
    problems.push_back(absl::StrCat("server.http_listen '", config.http_listen,
                                    "' needs a port, like 127.0.0.1:7080 (or \"off\" for no HTTP port)"));
  }
  CheckRange("fair_share_half_life_s", config.fair_share_half_life_s, 60, 365 * 86400,
             "use between 60 (a minute) and 31536000 (a year); 86400 (a day) is the default",
             problems);
  CheckRange("heartbeat_batch", config.heartbeat_batch, 1, 10000,
             "use between 1 (each heartbeat its own transaction) and 10000; 256 is the default",
             problems);
  CheckRange("heartbeat_linger_us", config.heartbeat_linger_us, 0, 100000,
             "use between 0 (never wait) and 100000 (0.1 s); 2000 is the default",
             problems);
  CheckRange("credential_refresh_s", config.credential_refresh_s, 1, 3600,
             "use between 1 and 3600 seconds; 300 is the default",
             problems);
  // An executor rotates its credential half-way through its life, and an exchanged one works on
  // for 10 minutes: a lifetime under an hour would mostly be rotation.
  if (config.executor_credential_ttl_s != 0) {
    CheckRange("executor_credential_ttl_s", config.executor_credential_ttl_s, 3600, 3650 * 86400,
               "use 0 (never expire) or between 3600 and 315360000 seconds; 2592000 (30 days) is the default",
               problems);
  }
  for (const std::string& runner : config.runner_allowlist) {
    if (absl::Status valid = ValidateRunnerName(runner); !valid.ok()) {
      problems.push_back(absl::StrCat("server.runner_allowlist: ", valid.message()));
    }
  }
  if (config.grpc_memory_mb != 0) {
    CheckRange("grpc_memory_mb", config.grpc_memory_mb, 32, int64_t{1} << 20,
               "use 0 (no quota) or between 32 and 1048576 MiB; 1024 is the default", problems);
  }
  CheckRange("verify_wait_s", config.verify_wait_s, 0, 86400,
             "use between 0 and 86400 seconds a finished job waits for its open spot checks; 600 is the default",
             problems);
  CheckRange("token_ttl_s", config.token_ttl_s, 0, 3650 * 86400,
             "use 0 (team tokens never expire unless issued with --expires) or up to 315360000 "
             "seconds; 7776000 (90 days) is the default",
             problems);
  CheckRange("task_target_s", config.task_target_s, 1, 86400,
             "use between 1 and 86400 seconds a task; 60 is the default",
             problems);
  CheckRange("history_step_s", config.history_step_s, 1, 3600,
             "use between 1 and 3600 seconds between the dashboard's history points; 15 is the default",
             problems);
  CheckRange("warm_wait_ms", config.warm_wait_ms, 0, 600000,
             "use between 0 (no waiting for a warm executor) and 600000; 3000 is the default",
             problems);
  CheckRange("lease_ttl_ms", config.lease_ttl_ms, 300, 600000,
             "use between 300 and 600000 (9000 is the default)",
             problems);
  if (!config.database.empty() && !absl::StartsWith(config.database, "postgres://") &&
      !absl::StartsWith(config.database, "postgresql://") && !absl::StartsWith(config.database, "sqlite:")) {
    // The string may carry a password (mysql://user:secret@host/db): it is shown redacted.
    problems.push_back(absl::StrCat("store.database '", RedactSecrets(config.database),
                                    "' is neither postgresql://... nor sqlite:/path/to/minions.db"));
  }
  if (absl::StartsWith(config.database, "postgres")) {
    if (std::string problem = PostgresTransportProblem(config.database); !problem.empty()) problems.push_back(problem);
  }
  if (absl::StartsWith(config.objects, "s3://")) {
    if (config.objects.size() <= 5) problems.push_back("objects.url 's3://' names no bucket: use s3://bucket/prefix");
    if (!std::getenv("AWS_ACCESS_KEY_ID") || !std::getenv("AWS_SECRET_ACCESS_KEY")) {
      problems.push_back("objects.url is S3 but AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are not set");
    }
  }
  if (config.runner_threads < 0) problems.push_back("executor.runner_threads must be 0 (automatic) or more");
  AvailabilityOptions availability;
  for (const auto& [key, value] : config.availability) {
    if (auto s = ApplyAvailabilitySetting(key, value, &availability); !s.ok()) problems.push_back(std::string(s.message()));
  }
  if (connect && problems.empty()) {
    RealClock clock;
    auto backends = OpenBackends(config, &clock);
    if (!backends.ok()) {
      problems.push_back(std::string(backends.status().message()));
    } else {
      auto listed = backends->blobs->List("minions-config-check/");
      if (!listed.ok()) {
        problems.push_back(absl::StrCat("the object store cannot be listed: ", listed.status().message()));
      }
      auto jobs = backends->store->ListJobs(JobFilter{std::nullopt, "", 1});
      if (!jobs.ok()) problems.push_back(absl::StrCat("the database cannot be read: ", jobs.status().message()));
      // The servers on one database share one object store (a server with another refuses to start).
      auto recorded = backends->store->RecordedObjectStore();
      if (!recorded.ok()) {
        problems.push_back(absl::StrCat("the database cannot be read: ", recorded.status().message()));
      } else if (auto agreed = CheckObjectStore(*recorded, backends->object_store); !agreed.ok()) {
        problems.push_back(std::string(agreed.message()));
      }
    }
  }
  return problems;
}

}  // namespace minions::apps
