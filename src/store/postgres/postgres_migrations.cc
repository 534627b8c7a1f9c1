#include "store/postgres/postgres_migrations.h"

#include <iterator>

namespace minions::postgres_store {
namespace {

// The same tables as the SQLite store (store/sqlite/sqlite_migrations.cc): times are BIGINT unix
// microseconds (NULL when unset), so both stores keep absl::Time exactly; states are the names
// from model/types.h; spec and info are JSONB in model/json_codec.h's forms. jobs.priority,
// jobs.min_memory_bytes and jobs.runner copy fields of jobs.spec so the lease query can filter
// and order without parsing JSON; the spec stays the source of truth.
constexpr char kInitialSchema[] = R"sql(
CREATE TABLE jobs (
  id                TEXT PRIMARY KEY,
  team              TEXT NOT NULL,
  state             TEXT NOT NULL,
  spec              JSONB NOT NULL,
  priority          INTEGER NOT NULL,
  min_memory_bytes  BIGINT NOT NULL,
  runner            TEXT NOT NULL,
  total_records     BIGINT NOT NULL DEFAULT 0,
  completed_records BIGINT NOT NULL DEFAULT 0,
  failed_records    BIGINT NOT NULL DEFAULT 0,
  n_tasks           BIGINT NOT NULL DEFAULT 0,
  tasks_done        BIGINT NOT NULL DEFAULT 0,
  tasks_succeeded   BIGINT NOT NULL DEFAULT 0,
  error             TEXT NOT NULL DEFAULT '',
  output_key        TEXT NOT NULL DEFAULT '',
  errors_key        TEXT NOT NULL DEFAULT '',
  manifest_key      TEXT NOT NULL DEFAULT '',
  created_at        BIGINT NOT NULL,
  updated_at        BIGINT NOT NULL,
  started_at        BIGINT,
  finished_at       BIGINT
);
-- The lease query: runnable jobs, highest priority first, then oldest.
CREATE INDEX jobs_runnable ON jobs (state, priority DESC, created_at, id);
-- ListJobs (newest first, optionally by team) and JobsToFinalize.
CREATE INDEX jobs_by_created ON jobs (created_at);
CREATE INDEX jobs_by_team ON jobs (team, created_at);

CREATE TABLE tasks (
  job_id           TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  idx              BIGINT NOT NULL,
  first_record     BIGINT NOT NULL,
  n_records        BIGINT NOT NULL,
  byte_begin       BIGINT NOT NULL,
  byte_end         BIGINT NOT NULL,
  state            TEXT NOT NULL,
  attempt          INTEGER NOT NULL DEFAULT 0,
  failures         INTEGER NOT NULL DEFAULT 0,
  preemptions      INTEGER NOT NULL DEFAULT 0,
  executor_id      TEXT NOT NULL DEFAULT '',
  lease_expires_at BIGINT,
  not_before       BIGINT,
  records_done     BIGINT NOT NULL DEFAULT 0,
  records_failed   BIGINT NOT NULL DEFAULT 0,
  last_error       TEXT NOT NULL DEFAULT '',
  started_at       BIGINT,
  finished_at      BIGINT,
  PRIMARY KEY (job_id, idx)
);
-- The lease query: pending tasks whose backoff is over (partial: finished tasks pile up).
CREATE INDEX tasks_leasable ON tasks (job_id, idx) WHERE state = 'pending';
-- The lease reaper: running tasks by expiry.
CREATE INDEX tasks_expiry ON tasks (lease_expires_at) WHERE state = 'running';

CREATE TABLE executors (
  id                TEXT PRIMARY KEY,
  info              JSONB NOT NULL,
  state             TEXT NOT NULL,
  state_reason      TEXT NOT NULL DEFAULT '',
  registered_at     BIGINT NOT NULL,
  last_heartbeat_at BIGINT NOT NULL,
  drain_requested   BOOLEAN NOT NULL DEFAULT FALSE,
  records_done      BIGINT NOT NULL DEFAULT 0
);
-- MarkLostExecutors.
CREATE INDEX executors_by_heartbeat ON executors (state, last_heartbeat_at);
)sql";

// A job's counts (tasks done and succeeded, records completed and failed) move out of its row
// into counter rows: every completion adds to one of several shards of its job (chosen at random)
// instead of locking and rewriting the job row, so completers of one job no longer queue on it.
// A job's counts are the sums of its shards; the jobs columns stay at zero.
constexpr char kCounterShards[] = R"sql(
CREATE TABLE job_counts (
  job_id            TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  shard             INTEGER NOT NULL,
  tasks_done        BIGINT NOT NULL DEFAULT 0,
  tasks_succeeded   BIGINT NOT NULL DEFAULT 0,
  completed_records BIGINT NOT NULL DEFAULT 0,
  failed_records    BIGINT NOT NULL DEFAULT 0,
  updated_at        BIGINT NOT NULL,
  PRIMARY KEY (job_id, shard)
);
INSERT INTO job_counts (job_id, shard, tasks_done, tasks_succeeded, completed_records, failed_records, updated_at)
  SELECT id, 0, tasks_done, tasks_succeeded, completed_records, failed_records, updated_at FROM jobs;
UPDATE jobs SET tasks_done = 0, tasks_succeeded = 0, completed_records = 0, failed_records = 0;
-- CountTasks and ListRunningTasks: running tasks by job and by executor.
CREATE INDEX tasks_running ON tasks (job_id, executor_id) WHERE state = 'running';
)sql";

// Checkpoints: a task's committed chunks (model/json_codec.h ChunksToJson); stragglers: the
// attempt racing the task's backup (null when none).
constexpr char kTaskChunks[] = R"sql(
ALTER TABLE tasks ADD COLUMN chunks JSONB NOT NULL DEFAULT '[]';
ALTER TABLE tasks ADD COLUMN shadow JSONB;
)sql";

// Identities: teams (with their quotas) and issued credentials, stored only as the SHA-256 of
// their text (model/identity.h), as in the SQLite store. Every store starts with the team
// "default". Executors revoked by an admin take the state "revoked" (no column changes).
constexpr char kIdentities[] = R"sql(
CREATE TABLE teams (
  name                TEXT PRIMARY KEY,
  max_priority        INTEGER NOT NULL,
  max_active_jobs     BIGINT NOT NULL DEFAULT 0,
  requests_per_second BIGINT NOT NULL DEFAULT 0,
  created_at          BIGINT NOT NULL
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
  uses_left    BIGINT NOT NULL DEFAULT -1,
  created_by   TEXT NOT NULL DEFAULT '',
  created_at   BIGINT NOT NULL,
  expires_at   BIGINT,
  last_used_at BIGINT,
  revoked_at   BIGINT
);
-- Listing a team's or a principal's credentials; revoking an executor's.
CREATE INDEX tokens_by_team ON tokens (team, created_at);
CREATE INDEX tokens_by_principal ON tokens (principal);
-- CreateJob's quota: a team's jobs that have not ended.
CREATE INDEX jobs_active_by_team ON jobs (team)
  WHERE state NOT IN ('completed', 'failed', 'cancelled', 'expired');
)sql";

// The model registry, as in the SQLite store (store/sqlite/sqlite_migrations.cc, migration 5).
constexpr char kModels[] = R"sql(
CREATE TABLE models (
  team       TEXT NOT NULL,
  name       TEXT NOT NULL,
  digest     TEXT NOT NULL,
  size_bytes BIGINT NOT NULL,
  facts      JSONB NOT NULL,
  blob_key   TEXT NOT NULL,
  created_by TEXT NOT NULL DEFAULT '',
  created_at BIGINT NOT NULL,
  PRIMARY KEY (team, name, digest)
);
CREATE INDEX models_by_digest ON models (team, digest);
ALTER TABLE jobs ADD COLUMN model_digest TEXT NOT NULL DEFAULT '';
CREATE INDEX jobs_active_by_model ON jobs (team, model_digest)
  WHERE state NOT IN ('completed', 'failed', 'cancelled', 'expired');
)sql";

// Fair share (model/fair_share.h), as in the SQLite store: each team's weight and running-task
// quota, and its usage. team_usage.usage_us is the team's decayed device time in microseconds as of
// usage_at, from the attempts that have ended (charged with the writes that end them). running
// and running_since_us (the sum of the running attempts' started_at) are kept by a trigger on every
// change of a task into or out of `running`, whichever statement makes it, so the running-task
// quota and the time running attempts have run so far never drift. (The trigger's upsert locks the
// team's row until the transaction commits; the task updates that fire it are sent with the
// COMMIT, so the row is held for about one round trip.)
constexpr char kFairShare[] = R"sql(
ALTER TABLE teams ADD COLUMN weight BIGINT NOT NULL DEFAULT 1;
ALTER TABLE teams ADD COLUMN max_running_tasks BIGINT NOT NULL DEFAULT 0;
CREATE TABLE team_usage (
  team          TEXT PRIMARY KEY,
  usage_us      BIGINT NOT NULL DEFAULT 0,
  usage_at      BIGINT NOT NULL DEFAULT 0,
  running       BIGINT NOT NULL DEFAULT 0,
  running_since_us DOUBLE PRECISION NOT NULL DEFAULT 0
);
INSERT INTO team_usage (team, running, running_since_us)
  SELECT j.team, COUNT(*), SUM(COALESCE(t.started_at, 0)) FROM tasks t JOIN jobs j ON j.id = t.job_id
  WHERE t.state = 'running' GROUP BY j.team;
CREATE FUNCTION minions_count_running_by_team() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
  INSERT INTO team_usage AS u (team, running, running_since_us)
    SELECT team, CASE WHEN NEW.state = 'running' THEN 1 ELSE -1 END,
           CASE WHEN NEW.state = 'running' THEN COALESCE(NEW.started_at, 0) ELSE -COALESCE(OLD.started_at, 0) END
    FROM jobs WHERE id = NEW.job_id
  ON CONFLICT (team) DO UPDATE SET running = u.running + EXCLUDED.running,
    running_since_us = u.running_since_us + EXCLUDED.running_since_us;
  RETURN NULL;
END
$body$;
CREATE TRIGGER tasks_running_by_team AFTER UPDATE OF state ON tasks FOR EACH ROW
  WHEN ((OLD.state = 'running') IS DISTINCT FROM (NEW.state = 'running'))
  EXECUTE FUNCTION minions_count_running_by_team();
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
  task_index  BIGINT NOT NULL,
  attempt     INTEGER NOT NULL,
  seat        INTEGER NOT NULL,
  executor_id TEXT NOT NULL UNIQUE,
  endpoint    TEXT NOT NULL DEFAULT '',
  bytes       BIGINT NOT NULL DEFAULT 0,
  formed_at   BIGINT NOT NULL,
  PRIMARY KEY (job_id, task_index, attempt, seat),
  FOREIGN KEY (job_id, task_index) REFERENCES tasks (job_id, idx) ON DELETE CASCADE
);
)sql";

// Gang jobs (docs/architecture.md, "Gangs"): jobs.gang_size is the spec's gang_size (0: one
// executor per task), a column the lease query filters on (a gang job's tasks go to gangs only).
// Generated from the spec, so no writer has to keep it. Migration 9.
constexpr char kGangJobs[] = R"sql(
ALTER TABLE jobs ADD COLUMN gang_size INTEGER GENERATED ALWAYS AS (COALESCE((spec->>'gang_size')::int, 0)) STORED;
)sql";

// Task sizes (model/task_sizing.h): per model and runner, the decayed sums of records processed
// and seconds taken by finished attempts (MetadataStore::RecordThroughput). Migration 10.
constexpr char kThroughput[] = R"sql(
CREATE TABLE task_throughput (
  model      TEXT NOT NULL,
  runner     TEXT NOT NULL,
  records    DOUBLE PRECISION NOT NULL,
  seconds    DOUBLE PRECISION NOT NULL,
  samples    BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  PRIMARY KEY (model, runner)
);
)sql";

// Accounting: each team's device time, every ended attempt's, never decayed (team_usage.usage_us
// decays for the fair share). Charged by the same upsert; counted from this migration on.
constexpr char kDeviceTime[] = R"sql(
ALTER TABLE team_usage ADD COLUMN device_us BIGINT NOT NULL DEFAULT 0;
)sql";

// Accounting: each job's device time, in its counter shards (jobs.device_us stays zero, as the
// jobs row's counts do). Counted from this migration on.
constexpr char kJobDeviceTime[] = R"sql(
ALTER TABLE job_counts ADD COLUMN device_us BIGINT NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN device_us BIGINT NOT NULL DEFAULT 0;
)sql";

// Accounting of gangs: an attempt of a gang job holds gang_size executors, so its running time
// counts that many times in its team's usage, as its ended time is charged (store_rules
// DevicesPerAttempt). running and running_since_us keep their meaning (the running tasks, for the
// quota; the sum of their started_at), so servers of the previous release, still running during a
// rolling upgrade, read them as before; running_devices and running_device_since_us count the
// executors the running attempts hold and their started_at weighted the same way. The trigger is
// replaced, with the tasks locked against state changes until the backfill (the running gang
// attempts' extra devices; the trigger kept the rest) commits with it. team_usage is locked
// (by its ALTERs) before tasks: a lease reads team_usage before it writes tasks, so the other
// order could deadlock with every lease in flight.
constexpr char kGangDevices[] = R"sql(
ALTER TABLE team_usage ADD COLUMN running_devices BIGINT NOT NULL DEFAULT 0;
ALTER TABLE team_usage ADD COLUMN running_device_since_us DOUBLE PRECISION NOT NULL DEFAULT 0;
LOCK TABLE tasks IN SHARE ROW EXCLUSIVE MODE;
CREATE OR REPLACE FUNCTION minions_count_running_by_team() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
  INSERT INTO team_usage AS u (team, running, running_since_us, running_devices, running_device_since_us)
    SELECT team, CASE WHEN NEW.state = 'running' THEN 1 ELSE -1 END,
           CASE WHEN NEW.state = 'running' THEN COALESCE(NEW.started_at, 0) ELSE -COALESCE(OLD.started_at, 0) END,
           CASE WHEN NEW.state = 'running' THEN 1 ELSE -1 END * GREATEST(gang_size, 1),
           CASE WHEN NEW.state = 'running' THEN COALESCE(NEW.started_at, 0) ELSE -COALESCE(OLD.started_at, 0) END
             * GREATEST(gang_size, 1)
    FROM jobs WHERE id = NEW.job_id
  ON CONFLICT (team) DO UPDATE SET running = u.running + EXCLUDED.running,
    running_since_us = u.running_since_us + EXCLUDED.running_since_us,
    running_devices = u.running_devices + EXCLUDED.running_devices,
    running_device_since_us = u.running_device_since_us + EXCLUDED.running_device_since_us;
  RETURN NULL;
END
$body$;
UPDATE team_usage SET running_devices = running, running_device_since_us = running_since_us;
UPDATE team_usage u SET running_devices = u.running_devices + g.extra,
    running_device_since_us = u.running_device_since_us + g.extra_since
  FROM (SELECT j.team, SUM(j.gang_size - 1) AS extra, SUM(COALESCE(t.started_at, 0) * (j.gang_size - 1)) AS extra_since
        FROM tasks t JOIN jobs j ON j.id = t.job_id WHERE t.state = 'running' AND j.gang_size >= 2 GROUP BY j.team) g
  WHERE u.team = g.team;
)sql";

// Accounting: the tokens a finished job's answers used (Job::tokens), written when it finishes;
// NULL (not counted) for jobs finished before, or by a server of an earlier release. One ALTER
// (nullable columns without a default: no rewrite), so jobs is locked once, briefly. Migration 14.
constexpr char kJobTokens[] = R"sql(
ALTER TABLE jobs ADD COLUMN prompt_tokens BIGINT, ADD COLUMN completion_tokens BIGINT;
)sql";

// Verification by re-scoring (issue 38): a verifier's verdict on one record of a producer's
// answer, once per record and verifier (an arbiter adds its own). Migration 15.
constexpr char kVerifications[] = R"sql(
CREATE TABLE verifications (
  job_id      TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  task_idx    BIGINT NOT NULL,
  custom_id   TEXT NOT NULL,
  producer_id TEXT NOT NULL,
  verifier_id TEXT NOT NULL,
  passed      BOOLEAN NOT NULL,
  reason      TEXT NOT NULL DEFAULT '',
  verified_at BIGINT NOT NULL,
  PRIMARY KEY (job_id, custom_id, verifier_id)
);
CREATE INDEX verifications_by_producer ON verifications (producer_id);
)sql";

// The dashboard's history (dashboard/fleet_view.h): one point per step, recorded by whichever
// server reaches the step first, kept for FleetView::kHistorySpan. Migration 16.
constexpr char kFleetHistory[] = R"sql(
CREATE TABLE fleet_history (
  at    BIGINT PRIMARY KEY,
  point TEXT NOT NULL
);
)sql";

// Spot checks (issue 38): the records of a committed chunk drawn for another executor to
// re-score, pending until one leases them; the verifier's report removes the row (its verdicts go
// to verifications). Migration 17.
constexpr char kVerificationTasks[] = R"sql(
CREATE TABLE verification_tasks (
  job_id           TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  task_idx         BIGINT NOT NULL,
  attempt          BIGINT NOT NULL,
  seq              BIGINT NOT NULL,
  producer_id      TEXT NOT NULL,
  records          TEXT NOT NULL,
  verifier_id      TEXT NOT NULL DEFAULT '',
  lease_expires_at BIGINT,
  created_at       BIGINT NOT NULL,
  PRIMARY KEY (job_id, task_idx, attempt, seq)
);
CREATE INDEX verification_tasks_by_age ON verification_tasks (created_at);
)sql";

// The tokens each team's answers used per step of the dashboard's history: every server adds
// what it admitted (dashboard/fleet_view.h), kept as long as the history. Migration 18.
constexpr char kFleetTokens[] = R"sql(
CREATE TABLE fleet_tokens (
  at                BIGINT NOT NULL,
  team              TEXT NOT NULL,
  prompt_tokens     BIGINT NOT NULL DEFAULT 0,
  completion_tokens BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (at, team)
);
)sql";

// Per-team byte limits (issue 40, point 5) and the counts of files and results kept that they
// bound; 0 (no limit) for teams created before. Migration 19.
constexpr char kTeamBytes[] = R"sql(
ALTER TABLE teams ADD COLUMN max_file_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN max_model_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN max_result_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN file_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN result_bytes BIGINT NOT NULL DEFAULT 0;
)sql";

// Accounting: when each executor's time was last charged (store_rules ChargedUntil), so an
// attempt that waited in its queue is charged from then, not from its lease. Migration 20.
constexpr char kChargedUntil[] = R"sql(
ALTER TABLE executors ADD COLUMN charged_until BIGINT;
)sql";

// Accounting: of a finished job's completion tokens, those its answers spent reasoning (the sum of
// their usage.completion_tokens_details.reasoning_tokens), written with the other two; NULL (0)
// for jobs finished before. Migration 21.
constexpr char kJobReasoningTokens[] = R"sql(
ALTER TABLE jobs ADD COLUMN reasoning_tokens BIGINT;
)sql";

// Per team (issue 40, points 3 and 6): the runners its jobs may name (space-separated; '': any the
// server allows) and whether its jobs need fully confined executors (0/1). Migration 22.
constexpr char kTeamRunners[] = R"sql(
ALTER TABLE teams ADD COLUMN runners TEXT NOT NULL DEFAULT '';
ALTER TABLE teams ADD COLUMN require_confined BIGINT NOT NULL DEFAULT 0;
)sql";

// Verification (issue 38): a team's spot-check fraction in parts per million (0: the fleet's),
// and arbitration tasks: a spot check whose verifier failed a record, for a third executor to
// judge (`disputed_verifier`, '' for a spot check), with the chunk's records, which its task no
// longer holds once redone. Migration 23.
constexpr char kVerifyFractionAndArbitration[] = R"sql(
ALTER TABLE teams ADD COLUMN verify_ppm BIGINT NOT NULL DEFAULT 0;
ALTER TABLE verification_tasks ADD COLUMN disputed_verifier TEXT NOT NULL DEFAULT '',
  ADD COLUMN chunk_begin BIGINT NOT NULL DEFAULT 0, ADD COLUMN chunk_end BIGINT NOT NULL DEFAULT 0;
)sql";

constexpr Migration kMigrations[] = {
    {1, "initial schema: jobs, tasks, executors", kInitialSchema},
    {2, "job counts in counter shards; running tasks by job", kCounterShards},
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

}  // namespace minions::postgres_store
