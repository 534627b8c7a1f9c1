#pragma once
// Configuration of the minions processes: one TOML file, then the environment, then flags, each
// overriding the one before. The server and the watchdog read [server], [store] and [objects];
// the executor [executor] and [availability]; the client verbs (submit, jobs, watch, ...) take
// the server's address from [executor] server when neither --server nor MINIONS_SERVER says. `minions config check` reports what is wrong in words a person can
// act on.
//
//   [server]    listen, http_listen, health_listen, tls_cert, tls_key, lease_ttl_ms, watchdog, data_dir,
//               straggler_factor, straggler_min_runtime_ms, fair_share_half_life_s, warm_wait_ms,
//               model_affinity, heartbeat_batch, heartbeat_linger_us, task_target_s, history_step_s, credential_refresh_s,
//               executor_credential_ttl_s, token_ttl_s, runner_allowlist, grpc_memory_mb,
//               idle_polls_renew, require_confined_executors, executor_approval, spot_checks, verify_wait_s
//   [store]     database   "" (SQLite in data_dir), "sqlite:/path/minions.db", "postgresql://..."
//   [objects]   url        "" (a directory in data_dir), "/path", "s3://bucket/prefix"
//               endpoint, region, path_style            (S3; credentials from AWS_* variables)
//   [executor]  server, ca, join_token_file, name, state_dir, runner, runner_threads, objects = [...], models = [...]
//   [runners]   NAME = "program arg ..." (runners declared beside the built-in llama one)
//   [gang]      address = "host:port" (this executor's gate on the gang network; none: no gangs)
//   [availability]  when the executor may use its machine: mode = "owner" | "dedicated" | "off",
//               start_idle = "10m", allow_battery = false, hours = "22-7", protected_apps = [...],
//               ... (every key: docs/availability.md; src/executor/availability_controller.h)
//
// Environment: MINIONS_CONFIG (the file), MINIONS_LISTEN, MINIONS_HTTP_LISTEN, MINIONS_HEALTH_LISTEN, MINIONS_TLS_CERT,
// MINIONS_TLS_KEY, MINIONS_CA, MINIONS_JOIN_TOKEN_FILE, MINIONS_DATA_DIR,
// MINIONS_DATABASE, MINIONS_OBJECTS, MINIONS_SERVER, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
// AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL, MINIONS_AVAILABILITY (the mode),
// MINIONS_AVAILABILITY_<KEY> (any availability key, upper case).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace minions::apps {

struct MinionsConfig {
  // [server]
  std::string listen = "127.0.0.1:7070";
  // /metrics, /healthz, /readyz and the web dashboard; "off" (or "") serves no HTTP.
  std::string http_listen = "127.0.0.1:7080";
  // /healthz and /readyz alone, on a listener of their own that no load on http_listen can
  // starve (what a load balancer or kubelet should probe); "" none.
  std::string health_listen;
  // TLS for both ports (required unless both are on loopback): `minions pki init` makes them.
  std::string tls_cert;
  std::string tls_key;
  // Set when the file still carries the shared secret of old: refused with a message.
  bool legacy_token = false;
  int64_t lease_ttl_ms = 9000;
  // Stragglers: near a job's end, a task running `straggler_factor` times its peers' median and
  // at least `straggler_min_runtime_ms` gets a backup attempt elsewhere.
  double straggler_factor = 3.0;
  int64_t straggler_min_runtime_ms = 30000;
  // Fair share between teams (docs/architecture.md, "Scheduling order"): past usage halves every
  // this many seconds (HTCondor's default, a day).
  int64_t fair_share_half_life_s = 86400;
  // Placement: a job's tasks wait this long after submission for an executor that holds its model
  // before a cold one may take them (delay scheduling).
  int64_t warm_wait_ms = 3000;
  // Model affinity: prefer executors warm for a job's model, and the warm wait above. false (for
  // benchmarks and operators comparing placements) turns both off: StoreOptions::model_affinity.
  bool model_affinity = true;
  // Spot checks (docs/verification.md): committed chunks have records drawn for another executor
  // to re-score, and a job publishes only once they are reported: StoreOptions::spot_checks. Off by
  // default until executors that re-score are the whole fleet (an executor that does not ask for
  // verification work leaves drawn checks open, and their jobs wait for them).
  bool spot_checks = false;
  // How long a job whose tasks have all ended waits for its open spot checks before it publishes
  // without them (ServerOptions::verify_wait): a one-executor pool has nobody to judge them.
  int64_t verify_wait_s = 600;
  // The most executors' heartbeats written in one store transaction (group commit); 1: each alone.
  int64_t heartbeat_batch = 256;
  // How long a batch of heartbeats under steady load waits for more (ServerOptions::heartbeat_linger).
  int64_t heartbeat_linger_us = 2000;
  // An idle executor's long poll stands for its idle heartbeat (ServerOptions::idle_polls_renew);
  // false: idle executors heartbeat at the idle pace (a fleet behind servers of mixed versions).
  bool idle_polls_renew = true;
  // Lease work only to executors whose runners run under Landlock and seccomp (macOS:
  // sandbox-exec) (ServerOptions::require_confined_executors).
  bool require_confined_executors = false;
  // Enrolled executors wait for an admin's approval (ServerOptions::require_executor_approval).
  bool executor_approval = false;
  // Jobs submitted without a shard size get tasks that run about this long, from the measured
  // throughput of their model and runner (model/task_sizing.h).
  int64_t task_target_s = 60;
  // The dashboard's history: a point every this many seconds, recorded in the store
  // (ServerOptions::history_step).
  int64_t history_step_s = 15;
  // How long a server keeps a credential it looked up before reading it again (revocations are
  // read in one batch every 2 s whatever this is: identity/authenticator.h).
  int64_t credential_refresh_s = 300;
  // Credential lifetimes (ServerOptions::executor_credential_ttl, team_token_ttl); 0: never.
  int64_t executor_credential_ttl_s = 30 * 86400;
  int64_t token_ttl_s = 90 * 86400;
  // gRPC's memory quota (ServerOptions::grpc_memory_bytes), MiB; 0: none.
  int64_t grpc_memory_mb = 1024;
  // The runner names executors may offer (ServerOptions::runner_allowlist); empty: any.
  std::vector<std::string> runner_allowlist;
  bool watchdog = true;
  std::string data_dir;  // default: ~/.minions/server
  // The OpenAI API (src/openai): folders whose *.gguf files are its models (by file name, without
  // .gguf), and the largest file it takes.
  std::vector<std::string> openai_model_dirs;
  int64_t openai_max_file_bytes = int64_t{256} << 20;
  // [store]
  std::string database;
  // [objects]
  std::string objects;
  std::string s3_endpoint;
  std::string s3_region;
  bool s3_path_style = true;
  // [executor] (the client verbs use `server` too)
  std::string server = "127.0.0.1:7070";
  std::string ca;               // the pool's CA certificate (TLS)
  std::string join_token_file;  // enrolment, when the executor has no credential yet
  std::string server_source = "the default";  // or "MINIONS_SERVER", "[executor] server in FILE"
  std::string executor_name;
  std::string executor_state_dir;
  // Where this executor's object URLs may point (origins, or folders for a pool on one machine)
  // and where it loads models from (executor/url_policy.h, executor/model_access.h).
  std::vector<std::string> executor_objects;
  std::vector<std::string> executor_models;
  std::string runner;
  int runner_threads = 0;
  // [runners] NAME = "program arg ..." (or ["program", "arg", ...]): runners the executor offers
  // beside the built-in llama one; a job names one with --runner NAME.
  std::vector<std::pair<std::string, std::vector<std::string>>> runners;
  // [availability]: settings by name, in the order they apply (file, then environment).
  std::vector<std::pair<std::string, std::string>> availability;
  // [gang] address = "host:port": this executor's member gate on the network the operator names
  // for gangs (docs/operations.md, "Gangs"); "": it joins no gang.
  std::string gang_address;

  std::string source;  // the file it came from, for messages
};

// Reads `path` (empty: $MINIONS_CONFIG, or no file), then applies the environment.
absl::StatusOr<MinionsConfig> LoadConfig(const std::string& path);

// Problems found in the configuration; with `connect`, also tries the database and the object store.
std::vector<std::string> CheckConfig(const MinionsConfig& config, bool connect);
// `config check`'s own: the executor's files the configuration names (executor.ca,
// executor.join_token_file) that are not there (a server sharing the file does not need them).
std::vector<std::string> CheckExecutorFiles(const MinionsConfig& config);

}  // namespace minions::apps
