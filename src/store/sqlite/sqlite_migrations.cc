#include "store/sqlite/sqlite_migrations.h"

namespace minions::sqlite_store {
namespace {

// Times are INTEGER unix microseconds (NULL when unset); states are the names from model/types.h;
// JSON columns hold model/json_codec.h's forms. jobs.priority, jobs.min_memory_bytes and
// jobs.runner copy fields of jobs.spec so the lease query can filter and order without parsing
// JSON; the spec stays the source of truth and is written together with them.
constexpr char kInitialSchema[] = R"sql(
CREATE TABLE jobs (
  id               TEXT PRIMARY KEY,
  team             TEXT NOT NULL,
  state            TEXT NOT NULL,
  spec             TEXT NOT NULL,
  priority         INTEGER NOT NULL,
  min_memory_bytes INTEGER NOT NULL,
  runner           TEXT NOT NULL,
  total_records    INTEGER NOT NULL DEFAULT 0,
  completed_records INTEGER NOT NULL DEFAULT 0,
  failed_records   INTEGER NOT NULL DEFAULT 0,
  n_tasks          INTEGER NOT NULL DEFAULT 0,
  tasks_done       INTEGER NOT NULL DEFAULT 0,
  tasks_succeeded  INTEGER NOT NULL DEFAULT 0,
  error            TEXT NOT NULL DEFAULT '',
  output_key       TEXT NOT NULL DEFAULT '',
  errors_key       TEXT NOT NULL DEFAULT '',
  manifest_key     TEXT NOT NULL DEFAULT '',
  created_at       INTEGER NOT NULL,
  updated_at       INTEGER NOT NULL,
  started_at       INTEGER,
  finished_at      INTEGER
);
-- The lease query: runnable jobs, highest priority first, then oldest.
CREATE INDEX jobs_runnable ON jobs (state, priority DESC, created_at);
-- ListJobs (newest first, optionally by team) and JobsToFinalize.
CREATE INDEX jobs_by_created ON jobs (created_at);
CREATE INDEX jobs_by_team ON jobs (team, created_at);

CREATE TABLE tasks (
  job_id           TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  idx              INTEGER NOT NULL,
  first_record     INTEGER NOT NULL,
  n_records        INTEGER NOT NULL,
  byte_begin       INTEGER NOT NULL,
  byte_end         INTEGER NOT NULL,
  state            TEXT NOT NULL,
  attempt          INTEGER NOT NULL DEFAULT 0,
  failures         INTEGER NOT NULL DEFAULT 0,
  preemptions      INTEGER NOT NULL DEFAULT 0,
  executor_id      TEXT NOT NULL DEFAULT '',
  lease_expires_at INTEGER,
  not_before       INTEGER,
  records_done     INTEGER NOT NULL DEFAULT 0,
  records_failed   INTEGER NOT NULL DEFAULT 0,
  last_error       TEXT NOT NULL DEFAULT '',
  started_at       INTEGER,
  finished_at      INTEGER,
  PRIMARY KEY (job_id, idx)
);
-- The lease query: pending tasks whose backoff is over.
CREATE INDEX tasks_leasable ON tasks (state, not_before);
-- The lease reaper: running tasks by expiry.
CREATE INDEX tasks_expiry ON tasks (state, lease_expires_at);

CREATE TABLE executors (
  id                TEXT PRIMARY KEY,
  info              TEXT NOT NULL,
  state             TEXT NOT NULL,
  state_reason      TEXT NOT NULL DEFAULT '',
  registered_at     INTEGER NOT NULL,
  last_heartbeat_at INTEGER NOT NULL,
  drain_requested   INTEGER NOT NULL DEFAULT 0,
  records_done      INTEGER NOT NULL DEFAULT 0
);
-- MarkLostExecutors.
CREATE INDEX executors_by_heartbeat ON executors (state, last_heartbeat_at);
)sql";

// CountTasks and ListRunningTasks: running tasks by job and by executor.
constexpr char kRunningTasksIndex[] = R"sql(
CREATE INDEX tasks_running ON tasks (job_id, executor_id) WHERE state = 'running';
CREATE INDEX tasks_pending ON tasks (job_id) WHERE state = 'pending';
)sql";

// Checkpoints: a task's committed chunks (model/json_codec.h ChunksToJson); stragglers: the
// attempt racing the task's backup (null when none).
constexpr char kTaskChunks[] = R"sql(
ALTER TABLE tasks ADD COLUMN chunks TEXT NOT NULL DEFAULT '[]';
ALTER TABLE tasks ADD COLUMN shadow TEXT;
)sql";

// Identities: teams (with their quotas) and issued credentials, stored only as the SHA-256 of
// their text (model/identity.h). Every store starts with the team "default". Executors revoked by
// an admin take the state "revoked" (a name in executors.state; no column changes).
constexpr char kIdentities[] = R"sql(
CREATE TABLE teams (
  name                TEXT PRIMARY KEY,
  max_priority        INTEGER NOT NULL,
  max_active_jobs     INTEGER NOT NULL DEFAULT 0,
  requests_per_second INTEGER NOT NULL DEFAULT 0,
  created_at          INTEGER NOT NULL
);
INSERT INTO teams (name, max_priority, max_active_jobs, requests_per_second, created_at)
  VALUES ('default', 10, 0, 0, 0);

CREATE TABLE tokens (
  id           TEXT PRIMARY KEY,
  secret_hash  TEXT NOT NULL UNIQUE,
  role         TEXT NOT NULL,
  team         TEXT NOT NULL DEFAULT '',
  principal    TEXT NOT NULL,
  scopes       TEXT NOT NULL,
  uses_left    INTEGER NOT NULL DEFAULT -1,
  created_by   TEXT NOT NULL DEFAULT '',
  created_at   INTEGER NOT NULL,
  expires_at   INTEGER,
  last_used_at INTEGER,
  revoked_at   INTEGER
);
-- Listing a team's or a principal's credentials; revoking an executor's.
CREATE INDEX tokens_by_team ON tokens (team, created_at);
CREATE INDEX tokens_by_principal ON tokens (principal);
-- CreateJob's quota: a team's jobs that have not ended.
CREATE INDEX jobs_active_by_team ON jobs (team)
  WHERE state NOT IN ('completed', 'failed', 'cancelled', 'expired');
)sql";

// The model registry (store/model_store.h): a team's names for model bytes, with what their GGUF
// headers say (facts: model/json_codec.h ModelFactsToJson). jobs.model_digest copies the spec's
// model_digest so removing a model and the lease query find the jobs that need it without
// parsing JSON.
constexpr char kModels[] = R"sql(
CREATE TABLE models (
  team       TEXT NOT NULL,
  name       TEXT NOT NULL,
  digest     TEXT NOT NULL,
  size_bytes INTEGER NOT NULL,
  facts      TEXT NOT NULL,
  blob_key   TEXT NOT NULL,
  created_by TEXT NOT NULL DEFAULT '',
  created_at INTEGER NOT NULL,
  PRIMARY KEY (team, name, digest)
);
CREATE INDEX models_by_digest ON models (team, digest);
ALTER TABLE jobs ADD COLUMN model_digest TEXT NOT NULL DEFAULT '';
CREATE INDEX jobs_active_by_model ON jobs (team, model_digest)
  WHERE state NOT IN ('completed', 'failed', 'cancelled', 'expired');
)sql";

// Fair share (model/fair_share.h): each team's weight and running-task quota, and its usage.
// team_usage.usage_us is the team's decayed device time in microseconds as of usage_at, from the
// attempts that have ended (charged by the store when an attempt completes, fails or expires).
// running and running_since_us (the sum of the running attempts' started_at) are kept by a trigger
// on every change of a task into or out of `running`, whichever code path makes it, so the
// running-task quota and the time running attempts have run so far never drift.
constexpr char kFairShare[] = R"sql(
ALTER TABLE teams ADD COLUMN weight INTEGER NOT NULL DEFAULT 1;
ALTER TABLE teams ADD COLUMN max_running_tasks INTEGER NOT NULL DEFAULT 0;
CREATE TABLE team_usage (
  team          TEXT PRIMARY KEY,
  usage_us      INTEGER NOT NULL DEFAULT 0,
  usage_at      INTEGER NOT NULL DEFAULT 0,
  running       INTEGER NOT NULL DEFAULT 0,
  running_since_us REAL NOT NULL DEFAULT 0
);
INSERT INTO team_usage (team, running, running_since_us)
  SELECT j.team, COUNT(*), SUM(COALESCE(t.started_at, 0)) FROM tasks t JOIN jobs j ON j.id = t.job_id
  WHERE t.state = 'running' GROUP BY j.team;
CREATE TRIGGER tasks_running_by_team AFTER UPDATE OF state ON tasks
WHEN (OLD.state = 'running') <> (NEW.state = 'running')
BEGIN
  INSERT INTO team_usage (team, running, running_since_us)
    SELECT team, CASE WHEN NEW.state = 'running' THEN 1 ELSE -1 END,
           CASE WHEN NEW.state = 'running' THEN COALESCE(NEW.started_at, 0) ELSE -COALESCE(OLD.started_at, 0) END
    FROM jobs WHERE id = NEW.job_id
  ON CONFLICT (team) DO UPDATE SET running = running + excluded.running,
    running_since_us = running_since_us + excluded.running_since_us;
END;
)sql";

// The servers' shared facts (one row each): `object_store`, the identity of the object store the
// servers on this database keep their objects in (MetadataStore::ClaimObjectStore).
constexpr char kSettings[] = R"sql(
CREATE TABLE settings (
  name   TEXT PRIMARY KEY,
  value  TEXT NOT NULL,
  set_at BIGINT NOT NULL
);
)sql";

// Gangs (store/gang_store.h): one row per seat of a living gang, seat 0 its leader. An executor
// sits in one gang at a time (UNIQUE executor_id); ending the attempt deletes its rows. Migration 7.
constexpr char kGangs[] = R"sql(
CREATE TABLE gang_seats (
  job_id      TEXT NOT NULL,
  task_index  INTEGER NOT NULL,
  attempt     INTEGER NOT NULL,
  seat        INTEGER NOT NULL,
  executor_id TEXT NOT NULL UNIQUE,
  endpoint    TEXT NOT NULL DEFAULT '',
  bytes       INTEGER NOT NULL DEFAULT 0,
  formed_at   INTEGER NOT NULL,
  PRIMARY KEY (job_id, task_index, attempt, seat),
  FOREIGN KEY (job_id, task_index) REFERENCES tasks (job_id, idx) ON DELETE CASCADE
);
)sql";

// Gang jobs (docs/architecture.md, "Gangs"): jobs.gang_size is the spec's gang_size (0: one
// executor per task), a column the lease query filters on (a gang job's tasks go to gangs only).
// Generated from the spec, so no writer has to keep it. Migration 9.
constexpr char kGangJobs[] = R"sql(
ALTER TABLE jobs ADD COLUMN gang_size INTEGER GENERATED ALWAYS AS (COALESCE(json_extract(spec, '$.gang_size'), 0)) VIRTUAL;
)sql";

// Task sizes (model/task_sizing.h): per model and runner, the decayed sums of records processed
// and seconds taken by finished attempts (MetadataStore::RecordThroughput). Migration 10.
constexpr char kThroughput[] = R"sql(
CREATE TABLE task_throughput (
  model      TEXT NOT NULL,
  runner     TEXT NOT NULL,
  records    REAL NOT NULL,
  seconds    REAL NOT NULL,
  samples    INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (model, runner)
);
)sql";

// Accounting: each team's device time, every ended attempt's, never decayed (team_usage.usage_us
// decays for the fair share). Charged with the usage; counted from this migration on. Migration 11.
constexpr char kDeviceTime[] = R"sql(
ALTER TABLE team_usage ADD COLUMN device_us INTEGER NOT NULL DEFAULT 0;
)sql";

// Accounting: each job's device time, charged with its team's. Migration 12.
constexpr char kJobDeviceTime[] = R"sql(
ALTER TABLE jobs ADD COLUMN device_us INTEGER NOT NULL DEFAULT 0;
)sql";

// Accounting of gangs, as the PostgreSQL store's migration 13: an attempt of a gang job holds
// gang_size executors, so its running time counts that many times in its team's usage (store_rules
// DevicesPerAttempt). running and running_since_us keep their meaning (the running tasks, for the
// quota; the sum of their started_at); running_devices and running_device_since_us count the
// executors the running attempts hold and their started_at weighted the same way. The trigger is
// replaced; the running gang attempts' extra devices are added once here (the trigger kept the rest).
constexpr char kGangDevices[] = R"sql(
ALTER TABLE team_usage ADD COLUMN running_devices INTEGER NOT NULL DEFAULT 0;
ALTER TABLE team_usage ADD COLUMN running_device_since_us REAL NOT NULL DEFAULT 0;
DROP TRIGGER IF EXISTS tasks_running_by_team;
CREATE TRIGGER tasks_running_by_team AFTER UPDATE OF state ON tasks
WHEN (OLD.state = 'running') <> (NEW.state = 'running')
BEGIN
  INSERT INTO team_usage (team, running, running_since_us, running_devices, running_device_since_us)
    SELECT team, CASE WHEN NEW.state = 'running' THEN 1 ELSE -1 END,
           CASE WHEN NEW.state = 'running' THEN COALESCE(NEW.started_at, 0) ELSE -COALESCE(OLD.started_at, 0) END,
           CASE WHEN NEW.state = 'running' THEN 1 ELSE -1 END * MAX(gang_size, 1),
           CASE WHEN NEW.state = 'running' THEN COALESCE(NEW.started_at, 0) ELSE -COALESCE(OLD.started_at, 0) END
             * MAX(gang_size, 1)
    FROM jobs WHERE id = NEW.job_id
  ON CONFLICT (team) DO UPDATE SET running = running + excluded.running,
    running_since_us = running_since_us + excluded.running_since_us,
    running_devices = running_devices + excluded.running_devices,
    running_device_since_us = running_device_since_us + excluded.running_device_since_us;
END;
UPDATE team_usage SET
  running_devices = running + COALESCE((SELECT SUM(j.gang_size - 1) FROM tasks t JOIN jobs j ON j.id = t.job_id
    WHERE t.state = 'running' AND j.gang_size >= 2 AND j.team = team_usage.team), 0),
  running_device_since_us = running_since_us + COALESCE((SELECT SUM(COALESCE(t.started_at, 0) * (j.gang_size - 1))
    FROM tasks t JOIN jobs j ON j.id = t.job_id
    WHERE t.state = 'running' AND j.gang_size >= 2 AND j.team = team_usage.team), 0);
)sql";

// Accounting: the tokens a finished job's answers used (Job::tokens), written when it finishes;
// NULL (not counted) for jobs finished before, or by a server of an earlier release. Migration 14.
constexpr char kJobTokens[] = R"sql(
ALTER TABLE jobs ADD COLUMN prompt_tokens INTEGER;
ALTER TABLE jobs ADD COLUMN completion_tokens INTEGER;
)sql";

// Verification by re-scoring (issue 38): a verifier's verdict on one record of a producer's
// answer, once per record and verifier (an arbiter adds its own). Migration 15.
constexpr char kVerifications[] = R"sql(
CREATE TABLE verifications (
  job_id      TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  task_idx    INTEGER NOT NULL,
  custom_id   TEXT NOT NULL,
  producer_id TEXT NOT NULL,
  verifier_id TEXT NOT NULL,
  passed      INTEGER NOT NULL,
  reason      TEXT NOT NULL DEFAULT '',
  verified_at INTEGER NOT NULL,
  PRIMARY KEY (job_id, custom_id, verifier_id)
);
CREATE INDEX verifications_by_producer ON verifications (producer_id);
)sql";

// The dashboard's history (dashboard/fleet_view.h): one point per step, recorded by whichever
// server reaches the step first, kept for FleetView::kHistorySpan. Migration 16.
constexpr char kFleetHistory[] = R"sql(
CREATE TABLE fleet_history (
  at    INTEGER PRIMARY KEY,
  point TEXT NOT NULL
);
)sql";

// Spot checks (issue 38): the records of a committed chunk drawn for another executor to
// re-score, pending until one leases them; the verifier's report removes the row (its verdicts go
// to verifications). Migration 17.
constexpr char kVerificationTasks[] = R"sql(
CREATE TABLE verification_tasks (
  job_id           TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  task_idx         INTEGER NOT NULL,
  attempt          INTEGER NOT NULL,
  seq              INTEGER NOT NULL,
  producer_id      TEXT NOT NULL,
  records          TEXT NOT NULL,
  verifier_id      TEXT NOT NULL DEFAULT '',
  lease_expires_at INTEGER,
  created_at       INTEGER NOT NULL,
  PRIMARY KEY (job_id, task_idx, attempt, seq)
);
CREATE INDEX verification_tasks_by_age ON verification_tasks (created_at);
)sql";

// The tokens each team's answers used per step of the dashboard's history: every server adds
// what it admitted (dashboard/fleet_view.h), kept as long as the history. Migration 18.
constexpr char kFleetTokens[] = R"sql(
CREATE TABLE fleet_tokens (
  at                INTEGER NOT NULL,
  team              TEXT NOT NULL,
  prompt_tokens     INTEGER NOT NULL DEFAULT 0,
  completion_tokens INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (at, team)
);
)sql";

// Per-team byte limits (issue 40, point 5) and the counts of files and results kept that they
// bound; 0 (no limit) for teams created before. Migration 19.
constexpr char kTeamBytes[] = R"sql(
ALTER TABLE teams ADD COLUMN max_file_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN max_model_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN max_result_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN file_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN result_bytes INTEGER NOT NULL DEFAULT 0;
)sql";

// Accounting: when each executor's time was last charged (store_rules ChargedUntil), so an
// attempt that waited in its queue is charged from then, not from its lease. Migration 20.
constexpr char kChargedUntil[] = R"sql(
ALTER TABLE executors ADD COLUMN charged_until INTEGER;
)sql";

// Accounting: of a finished job's completion tokens, those its answers spent reasoning (the sum of
// their usage.completion_tokens_details.reasoning_tokens), written with the other two; NULL (0)
// for jobs finished before. Migration 21.
constexpr char kJobReasoningTokens[] = R"sql(
ALTER TABLE jobs ADD COLUMN reasoning_tokens INTEGER;
)sql";

// Per team (issue 40, points 3 and 6): the runners its jobs may name (space-separated; '': any the
// server allows) and whether its jobs need fully confined executors (0/1). Migration 22.
constexpr char kTeamRunners[] = R"sql(
ALTER TABLE teams ADD COLUMN runners TEXT NOT NULL DEFAULT '';
ALTER TABLE teams ADD COLUMN require_confined INTEGER NOT NULL DEFAULT 0;
)sql";

// Verification (issue 38): a team's spot-check fraction in parts per million (0: the fleet's),
// and arbitration tasks: a spot check whose verifier failed a record, for a third executor to
// judge (`disputed_verifier`, "" for a spot check), with the chunk's records, which its task no
// longer holds once redone. Migration 23.
constexpr char kVerifyFractionAndArbitration[] = R"sql(
ALTER TABLE teams ADD COLUMN verify_ppm INTEGER NOT NULL DEFAULT 0;
ALTER TABLE verification_tasks ADD COLUMN disputed_verifier TEXT NOT NULL DEFAULT '';
ALTER TABLE verification_tasks ADD COLUMN chunk_begin INTEGER NOT NULL DEFAULT 0;
ALTER TABLE verification_tasks ADD COLUMN chunk_end INTEGER NOT NULL DEFAULT 0;
)sql";

constexpr Migration kMigrations[] = {
    {1, "initial schema: jobs, tasks, executors", kInitialSchema},
    {2, "indexes for counting a job's pending and running tasks", kRunningTasksIndex},
    {3, "task checkpoints and straggler backups", kTaskChunks},
    {4, "identities: teams and credentials", kIdentities},
    {5, "the model registry; the model a job needs", kModels},
    {6, "fair share: team weights, running-task quotas and usage", kFairShare},
    // 7 landed first (with gangs part 1), 8 after: a landed migration keeps its number for good.
    {7, "gangs: which executors form the gang of a task attempt", kGangs},
    {8, "settings: the object store the servers share", kSettings},
    {9, "gang jobs: jobs.gang_size", kGangJobs},
    {10, "task sizes: records per second of each model and runner", kThroughput},
    {11, "accounting: each team's device time, never decayed", kDeviceTime},
    {12, "accounting: each job's device time", kJobDeviceTime},
    {13, "accounting: a gang attempt's running time counts once per executor", kGangDevices},
    {14, "accounting: the tokens a finished job's answers used", kJobTokens},
    {15, "verification: verifiers' verdicts on records", kVerifications},
    {16, "the dashboard's history: one point per step", kFleetHistory},
    {17, "verification: spot checks waiting for a verifier", kVerificationTasks},
    {18, "the dashboard's tokens per step and team", kFleetTokens},
    {19, "per-team byte limits; files and results kept", kTeamBytes},
    {20, "accounting: when each executor's time was last charged", kChargedUntil},
    {21, "accounting: the reasoning tokens a finished job's answers used", kJobReasoningTokens},
    {22, "per team: the runners its jobs may name; confined executors required", kTeamRunners},
    {23, "verification: per-team fractions; arbitration by a third executor", kVerifyFractionAndArbitration},
};

}  // namespace

std::span<const Migration> Migrations() { return kMigrations; }

int LatestSchemaVersion() { return store_common::LatestVersion(kMigrations); }

}  // namespace minions::sqlite_store
