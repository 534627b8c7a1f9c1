#pragma once
// The SQLite store's SQL (SqliteTransaction): every statement is constant text with parameters;
// values are always bound. Rows are written with positional parameters (?1, ...) in the order of
// store/common/store_rows.h's column lists; other parameters are named. The schema these run
// against is store/common/migrations.cc.

#include "store/common/gang_rows.h"
#include "store/common/store_rows.h"

namespace minions::sqlite_store::sql {

// --- jobs ---
inline constexpr char kSelectJob[] = "SELECT " MINIONS_STORE_JOB_COLUMNS " FROM jobs WHERE id = :id";
// A new job's counts are zeros: JobCountValues.
inline constexpr char kInsertJob[] =
    "INSERT INTO jobs (" MINIONS_STORE_JOB_WRITE_COLUMNS ", " MINIONS_STORE_JOB_COUNT_COLUMNS
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22)";
// All but the counts, the device time and the tokens (RowWrites): EndAttempts adds to the counts
// (kAddJobCounts), the charge to the device time (kChargeJobDevice), FinishJob sets the tokens.
inline constexpr char kUpdateJob[] =
    "UPDATE jobs SET team = ?2, state = ?3, spec = ?4, priority = ?5, min_memory_bytes = ?6, runner = ?7, "
    "total_records = ?8, n_tasks = ?9, error = ?10, output_key = ?11, errors_key = ?12, manifest_key = ?13, "
    "created_at = ?14, updated_at = ?15, started_at = ?16, finished_at = ?17, model_digest = ?18 WHERE id = ?1";
inline constexpr char kAddJobCounts[] =
    "UPDATE jobs SET completed_records = completed_records + :completed, failed_records = failed_records + :failed, "
    "tasks_done = tasks_done + :done, tasks_succeeded = tasks_succeeded + :succeeded, updated_at = :now "
    "WHERE id = :id";
// Whether the job is queued or running with every task ended (settling).
inline constexpr char kJobFinished[] =
    "SELECT COUNT(*) FROM jobs WHERE id = :id AND state IN ('queued', 'running') AND tasks_done >= n_tasks";
inline constexpr char kUnsettledJobs[] =
    "SELECT id FROM jobs WHERE state IN ('queued', 'running') AND n_tasks > 0 AND tasks_done >= n_tasks";
inline constexpr char kLastFailure[] =
    "SELECT last_error FROM tasks WHERE job_id = :job_id AND state = 'failed' ORDER BY finished_at DESC, idx DESC "
    "LIMIT 1";
inline constexpr char kSetJobTokens[] =
    "UPDATE jobs SET prompt_tokens = :prompt, completion_tokens = :completion, reasoning_tokens = :reasoning "
    "WHERE id = :id";
inline constexpr char kListJobs[] =
    "SELECT " MINIONS_STORE_JOB_COLUMNS " FROM jobs WHERE (:state IS NULL OR state = :state) "
    "AND (:team = '' OR team = :team) ORDER BY created_at DESC, id DESC LIMIT :limit";
inline constexpr char kJobsInState[] =
    "SELECT " MINIONS_STORE_JOB_COLUMNS " FROM jobs WHERE state = :state ORDER BY created_at, id LIMIT :limit";
inline constexpr char kCountActiveJobs[] =
    "SELECT COUNT(*) FROM jobs WHERE team = :team AND state NOT IN ('completed', 'failed', 'cancelled', 'expired')";
// The team's jobs that have not ended and need these bytes (partial index jobs_active_by_model).
inline constexpr char kJobsNeedingDigest[] =
    "SELECT " MINIONS_STORE_JOB_COLUMNS " FROM jobs WHERE team = :team AND model_digest = :digest "
    "AND state NOT IN ('completed', 'failed', 'cancelled', 'expired') ORDER BY created_at, id";

// --- tasks ---
inline constexpr char kSelectTask[] =
    "SELECT " MINIONS_STORE_TASK_COLUMNS " FROM tasks WHERE job_id = :job_id AND idx = :idx";
inline constexpr char kSelectTasksOfJob[] =
    "SELECT " MINIONS_STORE_TASK_COLUMNS " FROM tasks WHERE job_id = :job_id ORDER BY idx";
inline constexpr char kInsertTask[] =
    "INSERT INTO tasks (" MINIONS_STORE_TASK_COLUMNS
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)";
inline constexpr char kUpdateTask[] =
    "UPDATE tasks SET first_record = ?3, n_records = ?4, byte_begin = ?5, byte_end = ?6, state = ?7, "
    "attempt = ?8, failures = ?9, preemptions = ?10, executor_id = ?11, lease_expires_at = ?12, "
    "not_before = ?13, records_done = ?14, records_failed = ?15, last_error = ?16, started_at = ?17, "
    "finished_at = ?18, chunks = ?19, shadow = ?20 WHERE job_id = ?1 AND idx = ?2";
inline constexpr char kRunningTasks[] =
    "SELECT " MINIONS_STORE_TASK_COLUMNS " FROM tasks WHERE state = 'running' ORDER BY executor_id, job_id, idx";
inline constexpr char kCountPending[] = "SELECT COUNT(*) FROM tasks WHERE job_id = :job_id AND state = 'pending'";
inline constexpr char kAnyPending[] = "SELECT EXISTS (SELECT 1 FROM tasks WHERE state = 'pending')";
inline constexpr char kCountRunning[] =
    "SELECT COUNT(*), COUNT(DISTINCT executor_id), COALESCE(SUM(records_done), 0) FROM tasks "
    "WHERE job_id = :job_id AND state = 'running'";
inline constexpr char kExpiredLeases[] =
    "SELECT job_id, idx FROM tasks WHERE state = 'running' AND lease_expires_at <= :now "
    "ORDER BY lease_expires_at, job_id, idx LIMIT :limit";
// Tasks an executor holds: running attempts and shadows. Shadows are JSON; the LIKE narrows the
// scan, HandBack decides.
inline constexpr char kTasksOfExecutor[] =
    "SELECT job_id, idx FROM tasks WHERE (state = 'running' AND executor_id = :executor) "
    "OR (shadow IS NOT NULL AND shadow LIKE :shadow) ORDER BY job_id, idx";

// Candidate selection only: which pending tasks this executor could run, in grant order. Whether
// a task may actually be granted is the lease's decision (store_rules MayPlace).
// :ranks is the teams' fair-share order (store_rules::FairShareRanksJson): a team it leaves out
// ranks 0; a team ranked -1 is at its running-task quota.
// Placement: how warm the executor is for a job's registry model (0 loaded, 1 cached, 2 cold;
// a job without a registry model is 0): warmer first within a priority, and an executor that
// would have to drop another model or fetch the bytes (neither loaded, nor cached with no model
// loaded: placement.h TakesWithoutWait) takes a job only once it was submitted before
// :cold_before (delay scheduling). Without model affinity (:affinity = 0) every job is 0.
#define MINIONS_SQLITE_WARMTH                                                                                   \
  "(CASE WHEN :affinity = 0 OR j.model_digest = '' OR j.model_digest = :loaded THEN 0 WHEN j.model_digest IN " \
  "(SELECT value FROM json_each(:cached)) THEN 1 ELSE 2 END)"
inline constexpr char kLeaseCandidates[] =
    "SELECT t.job_id, t.idx, j.team FROM tasks t JOIN jobs j ON j.id = t.job_id "
    "LEFT JOIN json_each(:ranks) r ON r.key = j.team "
    "WHERE t.state = 'pending' AND (t.not_before IS NULL OR t.not_before <= :now) "
    "AND j.state IN ('queued', 'running') AND j.min_memory_bytes <= :memory_bytes AND j.gang_size < 2 "
    "AND j.runner IN (SELECT value FROM json_each(:runners)) AND COALESCE(r.value, 0) >= 0 "
    "AND (:confined = 1 OR COALESCE(json_extract(j.spec, '$.requirements.confined'), 0) = 0) "
    "AND (" MINIONS_SQLITE_WARMTH " = 0 OR (" MINIONS_SQLITE_WARMTH " = 1 AND :loaded = '') "
    "OR j.created_at <= :cold_before) "
    "ORDER BY COALESCE(r.value, 0), j.priority DESC, " MINIONS_SQLITE_WARMTH ", j.created_at, j.id, t.idx "
    "LIMIT :limit";
#undef MINIONS_SQLITE_WARMTH
// Pending tasks of gang jobs, in the order gangs take them (GangStore::NextGangTask).
inline constexpr char kGangCandidates[] =
    "SELECT t.job_id, t.idx, j.team FROM tasks t JOIN jobs j ON j.id = t.job_id "
    "WHERE j.gang_size >= 2 AND j.state IN ('queued', 'running') AND t.state = 'pending' "
    "AND (t.not_before IS NULL OR t.not_before <= :now) "
    "ORDER BY j.priority DESC, j.created_at, j.id, t.idx LIMIT :limit";

// --- fair share ---
// Every team's standing (store_rows::ReadTeamUsage's columns): teams without usage yet, and usage
// of teams without a row in `teams` (jobs of a team created before it was).
// (No FULL OUTER JOIN: older SQLite libraries, macOS's among them, lack it.)
#define MINIONS_SQLITE_OPEN_US \
  "CAST(COALESCE(u.running_devices * CAST(:now AS REAL) - u.running_device_since_us, 0) AS INTEGER)"
inline constexpr char kTeamUsage[] =
    "SELECT t.name, t.weight, t.max_running_tasks, COALESCE(u.usage_us, 0), COALESCE(u.usage_at, 0), "
    "COALESCE(u.running, 0), " MINIONS_SQLITE_OPEN_US ", COALESCE(u.device_us, 0) "
    "FROM teams t LEFT JOIN team_usage u ON u.team = t.name "
    "UNION ALL SELECT u.team, 1, 0, u.usage_us, u.usage_at, u.running, " MINIONS_SQLITE_OPEN_US ", u.device_us"
    " FROM team_usage u WHERE u.team NOT IN (SELECT name FROM teams) ORDER BY 1";
#undef MINIONS_SQLITE_OPEN_US
inline constexpr char kTeamUsageOf[] = "SELECT usage_us, usage_at FROM team_usage WHERE team = :team";
// (:charge_us also adds to the device time, which never decays.) A job's device time is charged
// by kChargeJobDevice alone: kUpdateJob leaves it be.
inline constexpr char kChargeJobDevice[] = "UPDATE jobs SET device_us = device_us + :us WHERE id = :id";
inline constexpr char kChargeUsage[] =
    "INSERT INTO team_usage (team, usage_us, device_us, usage_at) VALUES (:team, :usage_us, :charge_us, :usage_at) "
    "ON CONFLICT (team) DO UPDATE SET usage_us = excluded.usage_us, device_us = team_usage.device_us + "
    "excluded.device_us, usage_at = excluded.usage_at";

// --- executors ---
inline constexpr char kSelectExecutor[] = "SELECT " MINIONS_STORE_EXECUTOR_COLUMNS " FROM executors WHERE id = :id";
inline constexpr char kListExecutors[] =
    "SELECT " MINIONS_STORE_EXECUTOR_COLUMNS " FROM executors ORDER BY registered_at, id";
inline constexpr char kInsertExecutor[] =
    "INSERT INTO executors (" MINIONS_STORE_EXECUTOR_COLUMNS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
inline constexpr char kUpdateExecutor[] =
    "UPDATE executors SET info = ?2, state = ?3, state_reason = ?4, registered_at = ?5, "
    "last_heartbeat_at = ?6, drain_requested = ?7, records_done = ?8 WHERE id = ?1";
inline constexpr char kAddExecutorRecords[] =
    "UPDATE executors SET records_done = records_done + :records WHERE id = :id";
// store_rules ChargedUntil: read, and moved forward only.
inline constexpr char kChargedUntil[] = "SELECT charged_until FROM executors WHERE id = :id";
inline constexpr char kMoveChargedUntil[] =
    "UPDATE executors SET charged_until = MAX(COALESCE(charged_until, 0), :at) WHERE id = :id";
inline constexpr char kSilentExecutors[] =
    "SELECT id FROM executors WHERE state NOT IN ('lost', 'revoked', 'quarantined', 'pending') AND last_heartbeat_at < :cutoff "
    "ORDER BY last_heartbeat_at, id";

// --- teams and credentials ---
inline constexpr char kSelectTeam[] = "SELECT " MINIONS_STORE_TEAM_COLUMNS " FROM teams WHERE name = :name";
inline constexpr char kListTeams[] = "SELECT " MINIONS_STORE_TEAM_COLUMNS " FROM teams ORDER BY name";
inline constexpr char kInsertTeam[] =
    "INSERT INTO teams (" MINIONS_STORE_TEAM_COLUMNS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)";
inline constexpr char kUpdateTeam[] =
    "UPDATE teams SET max_priority = ?2, max_active_jobs = ?3, requests_per_second = ?4, created_at = ?5, "
    "weight = ?6, max_running_tasks = ?7, max_file_bytes = ?8, max_model_bytes = ?9, max_result_bytes = ?10, "
    "file_bytes = ?11, result_bytes = ?12, runners = ?13, require_confined = ?14, verify_ppm = ?15 WHERE name = ?1";
inline constexpr char kTokenById[] = "SELECT " MINIONS_STORE_TOKEN_COLUMNS " FROM tokens WHERE id = :key";
inline constexpr char kTokenByHash[] = "SELECT " MINIONS_STORE_TOKEN_COLUMNS " FROM tokens WHERE secret_hash = :key";
inline constexpr char kListTokens[] =
    "SELECT " MINIONS_STORE_TOKEN_COLUMNS " FROM tokens WHERE (:team = '' OR team = :team) "
    "AND (:role = '' OR role = :role) AND (:principal = '' OR principal = :principal) "
    "AND (:include_revoked = 1 OR revoked_at IS NULL) ORDER BY created_at DESC, id DESC";
inline constexpr char kLiveExecutorTokens[] =
    "SELECT " MINIONS_STORE_TOKEN_COLUMNS " FROM tokens WHERE principal = :principal AND role = 'executor' "
    "AND revoked_at IS NULL ORDER BY id";
inline constexpr char kInsertToken[] =
    "INSERT INTO tokens (" MINIONS_STORE_TOKEN_COLUMNS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";
inline constexpr char kUpdateToken[] =
    "UPDATE tokens SET secret_hash = ?2, role = ?3, team = ?4, principal = ?5, scopes = ?6, uses_left = ?7, "
    "created_by = ?8, created_at = ?9, expires_at = ?10, last_used_at = ?11, revoked_at = ?12 WHERE id = ?1";
inline constexpr char kRecordUse[] =
    "UPDATE tokens SET last_used_at = :at WHERE id = :id AND (last_used_at IS NULL OR last_used_at < :at)";
inline constexpr char kRevokedTokensSince[] = "SELECT id FROM tokens WHERE revoked_at >= :since";

// --- the model registry ---
inline constexpr char kInsertModel[] =
    "INSERT INTO models (" MINIONS_STORE_MODEL_COLUMNS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
inline constexpr char kModelByDigest[] = "SELECT " MINIONS_STORE_MODEL_COLUMNS
                                         " FROM models WHERE team = :team AND digest = :digest "
                                         "ORDER BY created_at, name LIMIT 1";
inline constexpr char kListModels[] = "SELECT " MINIONS_STORE_MODEL_COLUMNS
                                      " FROM models WHERE (:team = '' OR team = :team) "
                                      "ORDER BY team, name, created_at DESC, digest DESC";
inline constexpr char kModelsNamed[] =
    "SELECT " MINIONS_STORE_MODEL_COLUMNS
    " FROM models WHERE team = :team AND name = :name AND (:digest = '' OR digest = :digest) "
    "ORDER BY created_at DESC, digest DESC";
inline constexpr char kDeleteModel[] = "DELETE FROM models WHERE team = :team AND name = :name AND digest = :digest";
inline constexpr char kDigestNamed[] = "SELECT COUNT(*) FROM models WHERE team = :team AND digest = :digest";

// --- gangs ---
inline constexpr char kInsertSeat[] = "INSERT INTO gang_seats (" MINIONS_STORE_GANG_SEAT_COLUMNS
                                      ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT DO NOTHING";
inline constexpr char kSeatOf[] =
    "SELECT " MINIONS_STORE_GANG_SEAT_COLUMNS " FROM gang_seats WHERE executor_id = :executor";
inline constexpr char kSeatsOfAttempt[] = "SELECT " MINIONS_STORE_GANG_SEAT_COLUMNS
                                          " FROM gang_seats WHERE job_id = :job AND task_index = :index AND "
                                          "attempt = :attempt ORDER BY seat";
inline constexpr char kAllSeats[] = "SELECT " MINIONS_STORE_GANG_SEAT_COLUMNS
                                    " FROM gang_seats ORDER BY formed_at, job_id, task_index, attempt, seat";
inline constexpr char kDeleteAttempt[] =
    "DELETE FROM gang_seats WHERE job_id = :job AND task_index = :index AND attempt = :attempt";

// --- settings and task sizes ---
inline constexpr char kInsertSetting[] =
    "INSERT INTO settings (name, value, set_at) VALUES (:name, :value, :at) ON CONFLICT (name) DO NOTHING";
inline constexpr char kSelectSetting[] = "SELECT value FROM settings WHERE name = :name";
inline constexpr char kRecordThroughput[] =
    "INSERT INTO task_throughput (model, runner, records, seconds, samples, updated_at) "
    "VALUES (:model, :runner, CAST(:records AS REAL), CAST(:seconds AS REAL), 1, :at) "
    "ON CONFLICT (model, runner) DO UPDATE SET records = records * CAST(:keep AS REAL) + excluded.records, "
    "seconds = seconds * CAST(:keep AS REAL) + excluded.seconds, samples = samples + 1, "
    "updated_at = excluded.updated_at";
inline constexpr char kSelectThroughput[] =
    "SELECT CAST(records AS TEXT), CAST(seconds AS TEXT), samples, updated_at "
    "FROM task_throughput WHERE model = :model AND runner = :runner";

// --- the dashboard's history (migration 16) ---
inline constexpr char kInsertFleetHistory[] =
    "INSERT INTO fleet_history (at, point) VALUES (:at, :point) ON CONFLICT (at) DO NOTHING";
inline constexpr char kPruneFleetHistory[] = "DELETE FROM fleet_history WHERE at < :keep_after";
inline constexpr char kSelectFleetHistory[] = "SELECT at, point FROM fleet_history WHERE at >= :since ORDER BY at";
// --- the dashboard's tokens per step (migration 18) ---
inline constexpr char kAddFleetTokens[] =
    "INSERT INTO fleet_tokens (at, team, prompt_tokens, completion_tokens) VALUES (:at, :team, :prompt, :completion) "
    "ON CONFLICT (at, team) DO UPDATE SET prompt_tokens = prompt_tokens + excluded.prompt_tokens, "
    "completion_tokens = completion_tokens + excluded.completion_tokens";
inline constexpr char kPruneFleetTokens[] = "DELETE FROM fleet_tokens WHERE at < :keep_after";
inline constexpr char kSelectFleetTokens[] =
    "SELECT at, team, prompt_tokens, completion_tokens FROM fleet_tokens WHERE at >= :since ORDER BY at, team";

// --- spot checks (migration 17) ---
inline constexpr char kInsertVerificationTask[] =
    "INSERT INTO verification_tasks (job_id, task_idx, attempt, seq, producer_id, records, verifier_id, lease_expires_at, created_at, "
    "disputed_verifier, chunk_begin, chunk_end) "
    "VALUES (:job, :task, :attempt, :seq, :producer, :records, :verifier, :expires, :created, :disputed, :begin, :end) "
    "ON CONFLICT DO NOTHING";
inline constexpr char kLeasableVerificationTasks[] =
    "SELECT job_id, task_idx, attempt, seq, producer_id, records, verifier_id, lease_expires_at, created_at, "
    "disputed_verifier, chunk_begin, chunk_end FROM verification_tasks "
    "WHERE producer_id <> :executor AND disputed_verifier <> :executor AND (verifier_id = '' OR lease_expires_at <= :now) "
    "ORDER BY created_at, job_id, task_idx, attempt, seq LIMIT :limit";
inline constexpr char kSelectVerificationTask[] =
    "SELECT job_id, task_idx, attempt, seq, producer_id, records, verifier_id, lease_expires_at, created_at, "
    "disputed_verifier, chunk_begin, chunk_end FROM verification_tasks "
    "WHERE job_id = :job AND task_idx = :task AND attempt = :attempt AND seq = :seq";
inline constexpr char kUpdateVerificationTask[] =
    "UPDATE verification_tasks SET verifier_id = :verifier, lease_expires_at = :expires "
    "WHERE job_id = :job AND task_idx = :task AND attempt = :attempt AND seq = :seq";
inline constexpr char kDeleteVerificationTask[] =
    "DELETE FROM verification_tasks WHERE job_id = :job AND task_idx = :task AND attempt = :attempt AND seq = :seq";
// A job's spot checks (its publication waits for them), not its arbitrations (their records were redone).
inline constexpr char kCountVerificationTasks[] =
    "SELECT COUNT(*) FROM verification_tasks WHERE job_id = :job AND disputed_verifier = ''";
// --- verification (migration 15) ---
inline constexpr char kInsertVerification[] =
    "INSERT INTO verifications (job_id, task_idx, custom_id, producer_id, verifier_id, passed, reason, verified_at) "
    "VALUES (:job, :task, :record, :producer, :verifier, :passed, :reason, :at) ON CONFLICT DO NOTHING";
inline constexpr char kVerificationsOfJob[] =
    "SELECT job_id, task_idx, custom_id, producer_id, verifier_id, passed, reason, verified_at FROM verifications "
    "WHERE job_id = :job ORDER BY verified_at, custom_id, verifier_id";

// --- the schema ---
inline constexpr char kCreateMigrationsTable[] =
    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)";
inline constexpr char kSchemaVersion[] = "SELECT COALESCE(MAX(version), 0) FROM schema_migrations";
inline constexpr char kRecordMigration[] =
    "INSERT INTO schema_migrations (version, applied_at) "
    "VALUES (:version, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))";

}  // namespace minions::sqlite_store::sql
