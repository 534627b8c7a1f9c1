#pragma once
// The PostgreSQL store's SQL: every statement is constant text with $n parameters; values are
// always bound. Rows are written with the parameters in the order of store/common/store_rows.h's
// column lists. The schema these run against is store/common/migrations.cc.
//
// Each statement is prepared once per connection (pg_connection.h) and keeps its generic plan, so
// the states that partial indexes name are literals here, not parameters: a generic plan can only
// use a partial index whose predicate the query states as such.

#include <cstdint>

#include "store/common/gang_rows.h"
#include "store/common/store_rows.h"

namespace minions::postgres_store::sql {

// A job's counts are the sums of its counter shards (job_counts, migration 2); the
// jobs row's own count columns stay zero. Columns as MINIONS_STORE_JOB_COLUMNS.
#define MINIONS_PG_SELECT_JOBS                                                                                    \
  "SELECT j.id, j.team, j.state, j.spec, j.total_records, COALESCE(c.completed, 0), COALESCE(c.failed, 0), "      \
  "j.n_tasks, COALESCE(c.done, 0), COALESCE(c.succeeded, 0), j.error, j.output_key, j.errors_key, "               \
  "j.manifest_key, j.created_at, GREATEST(j.updated_at, c.updated_at), j.started_at, j.finished_at, "            \
  "COALESCE(c.device_us, 0), j.prompt_tokens, j.completion_tokens, j.reasoning_tokens FROM jobs j "              \
  "LEFT JOIN LATERAL (SELECT SUM(completed_records)::bigint AS completed, SUM(failed_records)::bigint AS failed, " \
  "SUM(tasks_done)::bigint AS done, SUM(tasks_succeeded)::bigint AS succeeded, MAX(updated_at) AS updated_at, "   \
  "SUM(device_us)::bigint AS device_us FROM job_counts WHERE job_id = j.id) c ON true "
inline constexpr char kSelectJob[] = MINIONS_PG_SELECT_JOBS "WHERE j.id = $1";
inline constexpr char kSelectJobForUpdate[] = MINIONS_PG_SELECT_JOBS "WHERE j.id = $1 FOR UPDATE OF j";
inline constexpr char kListJobs[] = MINIONS_PG_SELECT_JOBS
    "WHERE ($1::text IS NULL OR j.state = $1::text) AND ($2::text = '' OR j.team = $2::text) "
    "ORDER BY j.created_at DESC, j.id DESC LIMIT $3::bigint";
inline constexpr char kJobsInState[] = MINIONS_PG_SELECT_JOBS "WHERE j.state = $1 ORDER BY j.created_at, j.id LIMIT $2::bigint";
// Jobs not yet settled whose tasks have all ended (their last completers ran at once and none saw
// the others' counts): JobsToFinalize settles them.
inline constexpr char kUnsettledJobs[] =
    "SELECT j.id FROM jobs j WHERE j.state IN ($1, $2) AND j.n_tasks > 0 "
    "AND j.n_tasks <= (SELECT COALESCE(SUM(tasks_done), 0) FROM job_counts WHERE job_id = j.id)";
inline constexpr char kLastFailure[] =
    "SELECT last_error FROM tasks WHERE job_id = $1 AND state = $2 ORDER BY finished_at DESC NULLS LAST, idx DESC "
    "LIMIT 1";
// A finished job's tokens (FinishJob), the one write of these columns: SaveJob's lists leave them be.
inline constexpr char kSetJobTokens[] =
    "UPDATE jobs SET prompt_tokens = $2, completion_tokens = $3, reasoning_tokens = $4 WHERE id = $1";
// Parameters: rows::JobValues.
inline constexpr char kInsertJob[] = "INSERT INTO jobs (" MINIONS_STORE_JOB_WRITE_COLUMNS
                              ") VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, "
                              "$16, $17, $18) ON CONFLICT (id) DO NOTHING";
inline constexpr char kUpdateJob[] =
    "UPDATE jobs SET team = $2, state = $3, spec = $4::jsonb, priority = $5, min_memory_bytes = $6, runner = $7, "
    "total_records = $8, n_tasks = $9, error = $10, output_key = $11, errors_key = $12, manifest_key = $13, "
    "created_at = $14, updated_at = $15, started_at = $16, finished_at = $17, model_digest = $18 WHERE id = $1";

// Tasks, many at a time: one array parameter per column of MINIONS_STORE_TASK_COLUMNS.
#define MINIONS_PG_TASK_ARRAYS                                                                                  \
  "unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::text[], "       \
  "$8::int[], $9::int[], $10::int[], $11::text[], $12::bigint[], $13::bigint[], $14::bigint[], $15::bigint[], " \
  "$16::text[], $17::bigint[], $18::bigint[], $19::jsonb[], $20::jsonb[])"
#define MINIONS_PG_UPDATE_TASKS                                                                                  \
  "UPDATE tasks SET first_record = u.first_record, n_records = u.n_records, byte_begin = u.byte_begin, "          \
  "byte_end = u.byte_end, state = u.state, attempt = u.attempt, failures = u.failures, preemptions = "             \
  "u.preemptions, executor_id = u.executor_id, lease_expires_at = u.lease_expires_at, not_before = u.not_before, " \
  "records_done = u.records_done, records_failed = u.records_failed, last_error = u.last_error, started_at = "     \
  "u.started_at, finished_at = u.finished_at, chunks = u.chunks, shadow = u.shadow FROM " MINIONS_PG_TASK_ARRAYS                                         \
  " AS u(" MINIONS_STORE_TASK_COLUMNS ") WHERE tasks.job_id = u.job_id AND tasks.idx = u.idx"
inline constexpr char kInsertTasks[] = "INSERT INTO tasks (" MINIONS_STORE_TASK_COLUMNS ") SELECT * FROM " MINIONS_PG_TASK_ARRAYS
                                " ON CONFLICT (job_id, idx) DO NOTHING";
inline constexpr char kUpdateTasks[] = MINIONS_PG_UPDATE_TASKS;
// Tasks by key ($1 job ids, $2 indexes), in key order (the order they are locked in).
// (A lateral join: one index probe per key, whatever the planner guesses unnest's size to be.)
#define MINIONS_PG_SELECT_TASKS(LOCK)                                                                        \
  "SELECT t.* FROM (SELECT DISTINCT * FROM unnest($1::text[], $2::bigint[]) ORDER BY 1, 2) k(job_id, idx) " \
  "CROSS JOIN LATERAL (SELECT " MINIONS_STORE_TASK_COLUMNS " FROM tasks WHERE job_id = k.job_id AND "       \
  "idx = k.idx" LOCK ") t"
inline constexpr char kSelectTasks[] = MINIONS_PG_SELECT_TASKS("");
inline constexpr char kSelectTasksForUpdate[] = MINIONS_PG_SELECT_TASKS(" FOR UPDATE");
// Whether executor $3 exists, then (only if it does) the tasks by key, locked: one row with
// NULL task columns when there are none.
inline constexpr char kExecutorAndTasksForUpdate[] =
    "SELECT e.n, t.* FROM (SELECT COUNT(*) AS n FROM executors WHERE id = $3) e LEFT JOIN LATERAL ("
    MINIONS_PG_SELECT_TASKS(" FOR UPDATE") " WHERE e.n > 0) t ON true";
#define MINIONS_PG_SELECT_TASKS_OF_JOB "SELECT " MINIONS_STORE_TASK_COLUMNS " FROM tasks WHERE job_id = $1 ORDER BY idx"
inline constexpr char kSelectTasksOfJob[] = MINIONS_PG_SELECT_TASKS_OF_JOB;
inline constexpr char kSelectTasksOfJobForUpdate[] = MINIONS_PG_SELECT_TASKS_OF_JOB " FOR UPDATE";
inline constexpr char kRunningTasks[] =
    "SELECT " MINIONS_STORE_TASK_COLUMNS " FROM tasks WHERE state = 'running' ORDER BY executor_id, job_id, idx";
// Uses the partial index tasks_leasable (pending tasks only).
inline constexpr char kAnyTaskPending[] = "SELECT EXISTS (SELECT 1 FROM tasks WHERE state = 'pending')";
inline constexpr char kCountTasks[] =
    "SELECT (SELECT COUNT(*) FROM tasks WHERE job_id = $1 AND state = 'pending'), COUNT(*), "
    "COUNT(DISTINCT executor_id), COALESCE(SUM(records_done), 0)::bigint FROM tasks WHERE job_id = $1 AND "
    "state = 'running'";

// Fair share: ended attempts' wall time (JOB_IDS text[], MICROS bigint[], by job) times their jobs'
// devices per attempt (store_rules DevicesPerAttempt: a gang's size, else 1) added to their teams'
// usage, decayed to NOW (bigint micros) with HALF_LIFE (bigint micros; 0: no decay), as
// model/fair_share.h DecayUsage does: usage(now) = usage(at) x 2^-((now - at) / half_life) + charge;
// and to their device time (device_us), which never decays.
// (At most 1000 halvings: PostgreSQL reports a float underflow as an error, not as zero.)
#define MINIONS_PG_CHARGE_USAGE(JOB_IDS, MICROS, NOW, HALF_LIFE)                                                  \
  "u AS (INSERT INTO team_usage AS tu (team, usage_us, device_us, usage_at) SELECT j.team, "                         \
  "SUM(x.us * GREATEST(j.gang_size, 1))::bigint, SUM(x.us * GREATEST(j.gang_size, 1))::bigint, " NOW "::bigint "      \
  "FROM unnest(" JOB_IDS "::text[], " MICROS "::bigint[]) x(job_id, us) JOIN jobs j ON j.id = x.job_id "            \
  "WHERE x.us > 0 GROUP BY j.team ON CONFLICT (team) DO UPDATE SET usage_us = (tu.usage_us * CASE WHEN "           \
  "EXCLUDED.usage_at > tu.usage_at AND " HALF_LIFE "::bigint > 0 THEN power(0.5, LEAST((EXCLUDED.usage_at - "      \
  "tu.usage_at)::float8 / " HALF_LIFE "::bigint, 1000)) ELSE 1 END)::bigint + EXCLUDED.usage_us, "                \
  "device_us = tu.device_us + EXCLUDED.device_us, usage_at = GREATEST(tu.usage_at, EXCLUDED.usage_at))"

// The end of attempts, in one statement: the tasks as the state machine left them ($1-$20, as
// kUpdateTasks), what they add to their jobs' counts ($21-$27 and $34, the device time: one
// counter shard row per job),
// the records the executors did ($28 ids, $29 records) and where their charged time now ends ($35:
// store_rules ChargedUntil, moved forward only; NULL leaves it), and the wall time of the attempts that ended, by
// job ($30 ids, $31 micros), charged to their teams at $32 with half-life $33
// (MINIONS_PG_CHARGE_USAGE). The device time of a job's counter shard ($34) and of its team are
// that wall time times the job's devices per attempt (GREATEST(gang_size, 1)). Answers how many
// tasks and executors it wrote.
inline constexpr char kWriteAttempts[] =
    "WITH t AS (" MINIONS_PG_UPDATE_TASKS " RETURNING 1), "
    "c AS (INSERT INTO job_counts (job_id, shard, tasks_done, tasks_succeeded, completed_records, failed_records, "
    "updated_at, device_us) SELECT x.job_id, x.shard, x.done, x.succeeded, x.completed, x.failed, x.at, "
    "CASE WHEN x.us > 0 THEN x.us * COALESCE((SELECT GREATEST(gang_size, 1) FROM jobs WHERE id = x.job_id), 1) "
    "ELSE 0 END FROM unnest($21::text[], $22::int[], $23::bigint[], $24::bigint[], $25::bigint[], $26::bigint[], "
    "$27::bigint[], $34::bigint[]) x(job_id, shard, done, succeeded, completed, failed, at, us) "
    "ON CONFLICT (job_id, shard) DO UPDATE SET "
    "device_us = job_counts.device_us + EXCLUDED.device_us, tasks_done = job_counts.tasks_done + EXCLUDED.tasks_done, "
    "tasks_succeeded = job_counts.tasks_succeeded + EXCLUDED.tasks_succeeded, "
    "completed_records = job_counts.completed_records + EXCLUDED.completed_records, "
    "failed_records = job_counts.failed_records + EXCLUDED.failed_records, "
    "updated_at = GREATEST(job_counts.updated_at, EXCLUDED.updated_at)), "
    "e AS (UPDATE executors SET records_done = records_done + x.n, charged_until = CASE WHEN x.at IS NULL THEN "
    "charged_until ELSE GREATEST(COALESCE(charged_until, 0), x.at) END FROM unnest($28::text[], $29::bigint[], "
    "$35::bigint[]) x(id, n, at) WHERE executors.id = x.id RETURNING 1), "
    MINIONS_PG_CHARGE_USAGE("$30", "$31", "$32", "$33") " "
    "SELECT (SELECT COUNT(*) FROM t), (SELECT COUNT(*) FROM e)";
// Which of the jobs $1 have not settled though all their tasks have ended: asked right after
// the COMMIT of a transaction that ended some of their tasks. Of transactions ending a job's last
// tasks at once, none may see the others' counts before it commits; the one that commits last
// sees them all after.
inline constexpr char kFinishedJobs[] =
    "SELECT j.id FROM jobs j WHERE j.id = ANY($1::text[]) AND j.state IN ($2, $3) "
    "AND j.n_tasks <= (SELECT COALESCE(SUM(tasks_done), 0) FROM job_counts WHERE job_id = j.id)";

// Candidate selection: which pending tasks this executor could run, in grant order, locked
// (tasks another transaction holds are skipped, not waited for), with what the lease needs of
// their job (columns after the task's: spec, state, started_at, team, created_at). Runnable jobs in grant order, and for each its pending tasks in index order off the
// partial index (a nested loop keeps the jobs' order), so a lease reads about as many tasks as it
// takes, however many are pending. States the partial indexes name are literals: a generic plan
// can only use a partial index whose predicate the query states as such. Whether a task may
// actually be granted is GrantTask's decision.
// Jobs are ordered by their team's fair-share rank first ($7, store_rules::FairShareRanksJson: a
// team it leaves out ranks 0; a team ranked -1 is at its running-task quota and is skipped).
// Placement: $4 is the executor's usable memory; warmth is how warm it is for a job's registry
// model (0 loaded ($8), 1 cached ($9, a JSON array of digests), 2 cold; a job without a registry
// model is 0): warmer first within a priority, and an executor that would have to drop another
// model or fetch the bytes (neither loaded, nor cached with no model loaded: placement.h
// TakesWithoutWait) takes a job only once it was submitted before $10 (delay scheduling). Without model affinity ($11 = 0) every job is 0.
#define MINIONS_PG_WARMTH                                                                          \
  "(CASE WHEN $11::bigint = 0 OR model_digest = '' OR model_digest = $8 THEN 0 WHEN model_digest IN " \
  "(SELECT jsonb_array_elements_text($9::jsonb)) THEN 1 ELSE 2 END)"
inline constexpr char kLeaseCandidates[] =
    "SELECT t.*, j.spec, j.state, j.started_at, j.team, j.created_at FROM (SELECT id, spec, state, "
    "started_at, team, created_at "
    "FROM jobs LEFT JOIN jsonb_each_text($7::jsonb) r ON r.key = jobs.team "
    "WHERE state IN ($2, $3) AND min_memory_bytes <= $4 AND gang_size < 2 AND runner IN (SELECT jsonb_array_elements_text($5::jsonb)) "
    "AND ($12::bigint = 1 OR NOT COALESCE((spec->'requirements'->>'confined')::boolean, false)) "
    "AND COALESCE(r.value::int, 0) >= 0 AND (" MINIONS_PG_WARMTH " = 0 OR (" MINIONS_PG_WARMTH " = 1 AND $8 = '') "
    "OR created_at <= $10) "
    "ORDER BY COALESCE(r.value::int, 0), priority DESC, " MINIONS_PG_WARMTH ", created_at, id) j "
    "CROSS JOIN LATERAL (SELECT "
    MINIONS_STORE_TASK_COLUMNS
    " FROM tasks WHERE job_id = j.id AND state = 'pending' AND (not_before IS NULL OR not_before <= $1) "
    "ORDER BY idx LIMIT $6 FOR UPDATE SKIP LOCKED) t LIMIT $6";
// Every team's standing at $1 (store_rows::ReadTeamUsage's columns): teams without usage yet, and
// usage of teams without a row in `teams`.
inline constexpr char kTeamUsage[] =
    "SELECT COALESCE(t.name, u.team), COALESCE(t.weight, 1), COALESCE(t.max_running_tasks, 0), "
    "COALESCE(u.usage_us, 0), COALESCE(u.usage_at, 0), COALESCE(u.running, 0), "
    "COALESCE(u.running_devices * $1::bigint::float8 - u.running_device_since_us, 0)::bigint, COALESCE(u.device_us, 0) "
    "FROM teams t FULL OUTER JOIN team_usage u ON u.team = t.name ORDER BY 1";
// The running tasks of teams with a running-task quota ($1), locked: a lease that grants them
// work counts again under the lock, so concurrent leases cannot overshoot the quota.
inline constexpr char kTeamsRunningForUpdate[] =
    "SELECT team, running FROM team_usage WHERE team = ANY($1::text[]) ORDER BY team FOR UPDATE";
inline constexpr char kExpiredLeases[] =
    "SELECT " MINIONS_STORE_TASK_COLUMNS " FROM tasks WHERE state = 'running' AND lease_expires_at <= $1 "
    "ORDER BY lease_expires_at, job_id, idx LIMIT $2::bigint FOR UPDATE SKIP LOCKED";

// store_rules ChargedUntil of the executors $1.
inline constexpr char kChargedUntil[] = "SELECT id, charged_until FROM executors WHERE id = ANY($1::text[])";
#define MINIONS_PG_SELECT_EXECUTOR "SELECT " MINIONS_STORE_EXECUTOR_COLUMNS " FROM executors WHERE id = $1"
inline constexpr char kSelectExecutor[] = MINIONS_PG_SELECT_EXECUTOR;
inline constexpr char kSelectExecutorForUpdate[] = MINIONS_PG_SELECT_EXECUTOR " FOR UPDATE";
// The settings table (ClaimObjectStore): $1 name, $2 value, $3 when.
inline constexpr char kInsertSetting[] =
    "INSERT INTO settings (name, value, set_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING";
inline constexpr char kSelectSetting[] = "SELECT value FROM settings WHERE name = $1";
// Task sizes: $1 model, $2 runner, $3 records, $4 seconds, $5 when, $6 the old sums' weight.
inline constexpr char kRecordThroughput[] =
    "INSERT INTO task_throughput AS t (model, runner, records, seconds, samples, updated_at) "
    "VALUES ($1, $2, $3::double precision, $4::double precision, 1, $5) ON CONFLICT (model, runner) DO UPDATE SET "
    "records = t.records * $6::double precision + EXCLUDED.records, "
    "seconds = t.seconds * $6::double precision + EXCLUDED.seconds, samples = t.samples + 1, "
    "updated_at = EXCLUDED.updated_at";
// --- spot checks (migration 17) ---
inline constexpr char kInsertVerificationTask[] =
    "INSERT INTO verification_tasks (job_id, task_idx, attempt, seq, producer_id, records, verifier_id, lease_expires_at, created_at, "
    "disputed_verifier, chunk_begin, chunk_end) "
    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT DO NOTHING";
// $1 executor, $2 now, $3 limit.
inline constexpr char kLeasableVerificationTasks[] =
    "SELECT job_id, task_idx, attempt, seq, producer_id, records, verifier_id, lease_expires_at, created_at, "
    "disputed_verifier, chunk_begin, chunk_end FROM verification_tasks "
    "WHERE producer_id <> $1 AND disputed_verifier <> $1 AND (verifier_id = '' OR lease_expires_at <= $2) "
    "ORDER BY created_at, job_id, task_idx, attempt, seq LIMIT $3::bigint FOR UPDATE SKIP LOCKED";
inline constexpr char kSelectVerificationTask[] =
    "SELECT job_id, task_idx, attempt, seq, producer_id, records, verifier_id, lease_expires_at, created_at, "
    "disputed_verifier, chunk_begin, chunk_end FROM verification_tasks "
    "WHERE job_id = $1 AND task_idx = $2 AND attempt = $3 AND seq = $4 FOR UPDATE";
// $1-$4 the key, $5 verifier, $6 expires.
inline constexpr char kUpdateVerificationTask[] =
    "UPDATE verification_tasks SET verifier_id = $5, lease_expires_at = $6 "
    "WHERE job_id = $1 AND task_idx = $2 AND attempt = $3 AND seq = $4";
inline constexpr char kDeleteVerificationTask[] =
    "DELETE FROM verification_tasks WHERE job_id = $1 AND task_idx = $2 AND attempt = $3 AND seq = $4";
// A job's spot checks (its publication waits for them), not its arbitrations (their records were redone).
inline constexpr char kCountVerificationTasks[] =
    "SELECT COUNT(*) FROM verification_tasks WHERE job_id = $1 AND disputed_verifier = ''";
// --- verification (migration 15) ---
inline constexpr char kInsertVerification[] =
    "INSERT INTO verifications (job_id, task_idx, custom_id, producer_id, verifier_id, passed, reason, verified_at) "
    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING";
inline constexpr char kVerificationsOfJob[] =
    "SELECT job_id, task_idx, custom_id, producer_id, verifier_id, passed, reason, verified_at FROM verifications "
    "WHERE job_id = $1 ORDER BY verified_at, custom_id, verifier_id";
inline constexpr char kSelectThroughput[] =
    "SELECT records, seconds, samples, updated_at FROM task_throughput WHERE model = $1 AND runner = $2";
// The dashboard's history (migration 16): $1 when, $2 the point; $1 keep after; $1 since.
inline constexpr char kInsertFleetHistory[] =
    "INSERT INTO fleet_history (at, point) VALUES ($1, $2) ON CONFLICT (at) DO NOTHING";
inline constexpr char kPruneFleetHistory[] = "DELETE FROM fleet_history WHERE at < $1";
inline constexpr char kSelectFleetHistory[] = "SELECT at, point FROM fleet_history WHERE at >= $1 ORDER BY at";
// The dashboard's tokens per step (migration 18): $1 when, $2 team, $3 prompt, $4 completion tokens.
inline constexpr char kAddFleetTokens[] =
    "INSERT INTO fleet_tokens (at, team, prompt_tokens, completion_tokens) VALUES ($1, $2, $3, $4) "
    "ON CONFLICT (at, team) DO UPDATE SET prompt_tokens = fleet_tokens.prompt_tokens + excluded.prompt_tokens, "
    "completion_tokens = fleet_tokens.completion_tokens + excluded.completion_tokens";
inline constexpr char kPruneFleetTokens[] = "DELETE FROM fleet_tokens WHERE at < $1";
inline constexpr char kSelectFleetTokens[] =
    "SELECT at, team, prompt_tokens, completion_tokens FROM fleet_tokens WHERE at >= $1 ORDER BY at, team";
// Which of the executors $1 exist (locked in id order: after the tasks, the store's lock order).
#define MINIONS_PG_EXECUTOR_IDS "SELECT id FROM executors WHERE id = ANY($1::text[]) ORDER BY id"
inline constexpr char kExecutorIds[] = MINIONS_PG_EXECUTOR_IDS;
inline constexpr char kExecutorIdsForUpdate[] = MINIONS_PG_EXECUTOR_IDS " FOR UPDATE";
// Executors $1 (ids), in id order (locked: a batch of heartbeats, of leases).
#define MINIONS_PG_SELECT_EXECUTORS \
  "SELECT " MINIONS_STORE_EXECUTOR_COLUMNS " FROM executors WHERE id = ANY($1::text[]) ORDER BY id"
inline constexpr char kSelectExecutors[] = MINIONS_PG_SELECT_EXECUTORS;
inline constexpr char kSelectExecutorsForUpdate[] = MINIONS_PG_SELECT_EXECUTORS " FOR UPDATE";
// Parameters: one array per rows::ExecutorValues column.
inline constexpr char kUpdateExecutors[] =
    "UPDATE executors SET info = u.info, state = u.state, state_reason = u.state_reason, registered_at = "
    "u.registered_at, last_heartbeat_at = u.last_heartbeat_at, drain_requested = u.drain_requested::boolean, "
    "records_done = u.records_done FROM unnest($1::text[], $2::jsonb[], $3::text[], $4::text[], $5::bigint[], "
    "$6::bigint[], $7::int[], $8::bigint[]) AS u(" MINIONS_STORE_EXECUTOR_COLUMNS ") WHERE executors.id = u.id";
inline constexpr char kListExecutors[] =
    "SELECT " MINIONS_STORE_EXECUTOR_COLUMNS " FROM executors ORDER BY registered_at, id";
// Parameters: rows::ExecutorValues.
inline constexpr char kInsertExecutor[] = "INSERT INTO executors (" MINIONS_STORE_EXECUTOR_COLUMNS
                                   ") VALUES ($1, $2::jsonb, $3, $4, $5, $6, $7::int::boolean, $8) "
                                   "ON CONFLICT (id) DO NOTHING";
inline constexpr char kUpdateExecutor[] =
    "UPDATE executors SET info = $2::jsonb, state = $3, state_reason = $4, registered_at = $5, "
    "last_heartbeat_at = $6, drain_requested = $7::int::boolean, records_done = $8 WHERE id = $1";
// A heartbeat being recorded right now (its row locked) is proof of life: skipped. Revoked
// executors ($3) are never "lost".
inline constexpr char kSilentExecutors[] =
    "SELECT " MINIONS_STORE_EXECUTOR_COLUMNS " FROM executors WHERE state <> $1 AND state <> $3 "
    "AND state <> $4 AND state <> $5 AND last_heartbeat_at < $2 ORDER BY last_heartbeat_at, id FOR UPDATE SKIP LOCKED";

// --- identities: teams and credentials ---

#define MINIONS_PG_SELECT_TEAM "SELECT " MINIONS_STORE_TEAM_COLUMNS " FROM teams WHERE name = $1"
inline constexpr char kSelectTeam[] = MINIONS_PG_SELECT_TEAM;
inline constexpr char kSelectTeamForUpdate[] = MINIONS_PG_SELECT_TEAM " FOR UPDATE";
inline constexpr char kListTeams[] = "SELECT " MINIONS_STORE_TEAM_COLUMNS " FROM teams ORDER BY name";
// Parameters: rows::TeamValues.
inline constexpr char kInsertTeam[] = "INSERT INTO teams (" MINIONS_STORE_TEAM_COLUMNS
                                      ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) ON CONFLICT (name) DO NOTHING";
inline constexpr char kUpdateTeam[] =
    "UPDATE teams SET max_priority = $2, max_active_jobs = $3, requests_per_second = $4, created_at = $5, "
    "weight = $6, max_running_tasks = $7, max_file_bytes = $8, max_model_bytes = $9, max_result_bytes = $10, "
    "file_bytes = $11, result_bytes = $12, runners = $13, require_confined = $14, verify_ppm = $15 WHERE name = $1";
// CreateJob's quota: the team's jobs that have not ended (partial index jobs_active_by_team).
inline constexpr char kCountActiveJobs[] =
    "SELECT COUNT(*) FROM jobs WHERE team = $1 AND state NOT IN ('completed', 'failed', 'cancelled', 'expired')";

#define MINIONS_PG_SELECT_TOKEN "SELECT " MINIONS_STORE_TOKEN_COLUMNS " FROM tokens "
inline constexpr char kTokenById[] = MINIONS_PG_SELECT_TOKEN "WHERE id = $1";
inline constexpr char kTokenByIdForUpdate[] = MINIONS_PG_SELECT_TOKEN "WHERE id = $1 FOR UPDATE";
inline constexpr char kTokenByHash[] = MINIONS_PG_SELECT_TOKEN "WHERE secret_hash = $1";
inline constexpr char kTokenByHashForUpdate[] = MINIONS_PG_SELECT_TOKEN "WHERE secret_hash = $1 FOR UPDATE";
inline constexpr char kListTokens[] = MINIONS_PG_SELECT_TOKEN
    "WHERE ($1 = '' OR team = $1) AND ($2 = '' OR role = $2) AND ($3 = '' OR principal = $3) "
    "AND ($4::boolean OR revoked_at IS NULL) ORDER BY created_at DESC, id DESC";
// An executor's credentials that still work, locked (RevokeExecutor).
inline constexpr char kExecutorTokensForUpdate[] = MINIONS_PG_SELECT_TOKEN
    "WHERE principal = $1 AND role = 'executor' AND revoked_at IS NULL ORDER BY id FOR UPDATE";
// Parameters: rows::TokenValues. A clash of id or hash inserts nothing.
inline constexpr char kInsertToken[] = "INSERT INTO tokens (" MINIONS_STORE_TOKEN_COLUMNS
                                       ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) "
                                       "ON CONFLICT DO NOTHING";
inline constexpr char kUpdateToken[] =
    "UPDATE tokens SET secret_hash = $2, role = $3, team = $4, principal = $5, scopes = $6, uses_left = $7, "
    "created_by = $8, created_at = $9, expires_at = $10, last_used_at = $11, revoked_at = $12 WHERE id = $1";
// Credentials revoked at or after $1 (Authenticator's batched revocation check).
inline constexpr char kRevokedTokensSince[] = "SELECT id FROM tokens WHERE revoked_at >= $1";
inline constexpr char kRecordTokenUse[] =
    "UPDATE tokens SET last_used_at = $2 WHERE id = ANY($1::text[]) AND (last_used_at IS NULL OR last_used_at < $2)";
// Tasks an executor holds, running attempts and shadows, locked in key order (RevokeExecutor:
// rare, so a scan is fine).
inline constexpr char kTasksOfExecutorForUpdate[] =
    "SELECT " MINIONS_STORE_TASK_COLUMNS " FROM tasks WHERE (state = 'running' AND executor_id = $1) "
    "OR shadow->>'executor_id' = $1 ORDER BY job_id, idx FOR UPDATE";

// --- the model registry ---

#define MINIONS_PG_SELECT_MODEL "SELECT " MINIONS_STORE_MODEL_COLUMNS " FROM models "
// Parameters: rows::ModelValues. A row there is already inserts nothing.
inline constexpr char kInsertModel[] = "INSERT INTO models (" MINIONS_STORE_MODEL_COLUMNS
                                       ") VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8) ON CONFLICT DO NOTHING";
inline constexpr char kModelByDigest[] =
    MINIONS_PG_SELECT_MODEL "WHERE team = $1 AND digest = $2 ORDER BY created_at, name LIMIT 1";
inline constexpr char kListModels[] =
    MINIONS_PG_SELECT_MODEL "WHERE ($1 = '' OR team = $1) ORDER BY team, name, created_at DESC, digest DESC";
// A team's rows of a name ($3: one digest, or '' every one), newest first (locked: RemoveModel's).
#define MINIONS_PG_MODELS_NAMED \
  MINIONS_PG_SELECT_MODEL "WHERE team = $1 AND name = $2 AND ($3 = '' OR digest = $3) ORDER BY created_at DESC, digest DESC"
inline constexpr char kModelsNamed[] = MINIONS_PG_MODELS_NAMED;
inline constexpr char kModelsNamedForUpdate[] = MINIONS_PG_MODELS_NAMED " FOR UPDATE";
inline constexpr char kDeleteModel[] = "DELETE FROM models WHERE team = $1 AND name = $2 AND digest = $3";
inline constexpr char kDigestNamed[] = "SELECT COUNT(*) FROM models WHERE team = $1 AND digest = $2";
// The team's jobs that have not ended and need these bytes (partial index jobs_active_by_model).
inline constexpr char kJobsNeedingDigest[] =
    "SELECT " MINIONS_STORE_JOB_COLUMNS " FROM jobs WHERE team = $1 AND model_digest = $2 "
    "AND state NOT IN ('completed', 'failed', 'cancelled', 'expired') ORDER BY created_at, id";

// --- gangs: the gang_seats table (store/common/gang_rows.h) ---

// A seat whose executor (or attempt and seat) is taken already inserts nothing.
inline constexpr char kInsertSeat[] = "INSERT INTO gang_seats (" MINIONS_STORE_GANG_SEAT_COLUMNS
                                      ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING";
inline constexpr char kSeatOf[] = "SELECT " MINIONS_STORE_GANG_SEAT_COLUMNS " FROM gang_seats WHERE executor_id = $1";
inline constexpr char kSeatsOfAttempt[] = "SELECT " MINIONS_STORE_GANG_SEAT_COLUMNS
                                          " FROM gang_seats WHERE job_id = $1 AND task_index = $2 AND attempt = $3"
                                          " ORDER BY seat";
inline constexpr char kAllSeats[] = "SELECT " MINIONS_STORE_GANG_SEAT_COLUMNS
                                    " FROM gang_seats ORDER BY formed_at, job_id, task_index, attempt, seat";
inline constexpr char kDeleteAttempt[] = "DELETE FROM gang_seats WHERE job_id = $1 AND task_index = $2 AND attempt = $3";
// Pending tasks of gang jobs, in the order gangs take them (GangStore::NextGangTask).
inline constexpr char kGangCandidates[] =
    "SELECT t.job_id, t.idx, j.team FROM tasks t JOIN jobs j ON j.id = t.job_id "
    "WHERE j.gang_size >= 2 AND j.state IN ('queued', 'running') AND t.state = 'pending' "
    "AND (t.not_before IS NULL OR t.not_before <= $1) "
    "ORDER BY j.priority DESC, j.created_at, j.id, t.idx LIMIT $2";

// --- the schema ---

// Held while migrating (database-wide): servers opening one database at once do not race.
inline constexpr char kMigrationLock[] = "SELECT pg_advisory_xact_lock($1)";
inline constexpr int64_t kMigrationLockKey = 0x6d696e696f6e0001;  // "minion" 1
inline constexpr char kCreateMigrationsTable[] =
    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
    "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())";
inline constexpr char kSchemaVersion[] =
    "SELECT COALESCE(MAX(version), 0), current_database(), COALESCE(current_schema(), '') FROM schema_migrations";
inline constexpr char kRecordMigration[] = "INSERT INTO schema_migrations (version) VALUES ($1)";

// The watchdog's session-level advisory lock (postgres_watchdog_lock.h): ($1, the schema's hash).
inline constexpr char kTryWatchdogLock[] =
    "SELECT pg_try_advisory_lock($1::int, hashtext(COALESCE(current_schema(), '')))";
inline constexpr char kWatchdogUnlock[] =
    "SELECT pg_advisory_unlock($1::int, hashtext(COALESCE(current_schema(), '')))";
inline constexpr char kPing[] = "SELECT 1";

#undef MINIONS_PG_SELECT_JOBS
#undef MINIONS_PG_CHARGE_USAGE
#undef MINIONS_PG_WARMTH
#undef MINIONS_PG_TASK_ARRAYS
#undef MINIONS_PG_UPDATE_TASKS
#undef MINIONS_PG_SELECT_TASKS
#undef MINIONS_PG_SELECT_TASKS_OF_JOB
#undef MINIONS_PG_SELECT_EXECUTOR
#undef MINIONS_PG_SELECT_TEAM
#undef MINIONS_PG_SELECT_TOKEN
#undef MINIONS_PG_SELECT_MODEL
#undef MINIONS_PG_MODELS_NAMED
#undef MINIONS_PG_EXECUTOR_IDS
#undef MINIONS_PG_SELECT_EXECUTORS

}  // namespace minions::postgres_store::sql
