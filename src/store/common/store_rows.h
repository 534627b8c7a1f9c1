#pragma once
// The row mapping every MetadataStore backend shares: which columns jobs, tasks and executors are
// stored in, in which order, and how a Job/Task/Executor becomes a row of values and back. A
// backend only supplies its way of binding values and of reading a result row.
//
// Reading: the templates take any `Row` with Text(c), Int(c), OptInt(c), Bool(c), Time(c) and OptTime(c) for
// column c (SQLite's current statement row, a PostgreSQL result row); the columns must be selected
// in the order of the MINIONS_STORE_*_COLUMNS lists, from `first` on.
// Writing: *Values() return the values in the order of the matching column list, for binding as
// positional parameters ($1... or ?1...).
// Pure functions; any thread.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "model/fair_share.h"
#include "model/identity.h"
#include "model/json_codec.h"
#include "model/types.h"

// Read columns (SELECT lists). Times are unix microseconds (NULL when unset), states their names
// from model/types.h, spec and info model/json_codec.h's JSON.
#define MINIONS_STORE_JOB_COLUMNS                                                                  \
  "id, team, state, spec, total_records, completed_records, failed_records, n_tasks, tasks_done, " \
  "tasks_succeeded, error, output_key, errors_key, manifest_key, created_at, updated_at, "         \
  "started_at, finished_at, device_us, prompt_tokens, completion_tokens, reasoning_tokens"
#define MINIONS_STORE_TASK_COLUMNS                                                         \
  "job_id, idx, first_record, n_records, byte_begin, byte_end, state, attempt, failures, " \
  "preemptions, executor_id, lease_expires_at, not_before, records_done, records_failed, " \
  "last_error, started_at, finished_at, chunks, shadow"
#define MINIONS_STORE_EXECUTOR_COLUMNS \
  "id, info, state, state_reason, registered_at, last_heartbeat_at, drain_requested, records_done"
#define MINIONS_STORE_MODEL_COLUMNS "team, name, digest, size_bytes, facts, blob_key, created_by, created_at"
#define MINIONS_STORE_TEAM_COLUMNS \
  "name, max_priority, max_active_jobs, requests_per_second, created_at, weight, max_running_tasks, " \
  "max_file_bytes, max_model_bytes, max_result_bytes, file_bytes, result_bytes, runners, require_confined, " \
  "verify_ppm"
#define MINIONS_STORE_TOKEN_COLUMNS                                                                  \
  "id, secret_hash, role, team, principal, scopes, uses_left, created_by, created_at, expires_at, " \
  "last_used_at, revoked_at"
// Written columns of a job, but for its counts (JobValues); JobCountValues holds those.
#define MINIONS_STORE_JOB_WRITE_COLUMNS                                                               \
  "id, team, state, spec, priority, min_memory_bytes, runner, total_records, n_tasks, error, "         \
  "output_key, errors_key, manifest_key, created_at, updated_at, started_at, finished_at, model_digest"
#define MINIONS_STORE_JOB_COUNT_COLUMNS "completed_records, failed_records, tasks_done, tasks_succeeded"

namespace minions::store_rows {

// One bound value: NULL, an integer (also times and booleans) or text.
using Value = std::variant<std::monostate, int64_t, std::string>;
using Values = std::vector<Value>;

constexpr int kJobColumns = 18;
constexpr int kTaskColumns = 20;
constexpr int kExecutorColumns = 8;
// Team::verify_fraction is kept in parts per million (Value has no floating point).
constexpr double kPartsPerMillion = 1e6;
constexpr int kTeamColumns = 15;
constexpr int kTokenColumns = 12;
constexpr int kModelColumns = 8;

inline Value TimeValue(absl::Time time) { return absl::ToUnixMicros(time); }
inline Value TimeValue(const std::optional<absl::Time>& time) {
  return time ? TimeValue(*time) : Value(std::monostate{});
}

Values JobValues(const Job& job);       // MINIONS_STORE_JOB_WRITE_COLUMNS
Values JobCountValues(const Job& job);  // MINIONS_STORE_JOB_COUNT_COLUMNS
Values TaskValues(const Task& task);    // MINIONS_STORE_TASK_COLUMNS
Values ExecutorValues(const Executor& executor);  // MINIONS_STORE_EXECUTOR_COLUMNS
Values TeamValues(const Team& team);              // MINIONS_STORE_TEAM_COLUMNS
Values TokenValues(const TokenRecord& token);     // MINIONS_STORE_TOKEN_COLUMNS
Values ModelValues(const ModelRecord& model);     // MINIONS_STORE_MODEL_COLUMNS

absl::Status CorruptRow(std::string_view table, std::string_view id, std::string_view what);

// The parsed halves of a row, shared by the templates below.
absl::StatusOr<JobState> JobStateOf(const std::string& id, const std::string& name);
absl::StatusOr<JobSpec> JobSpecOf(const std::string& id, const std::string& json);
absl::StatusOr<TaskState> TaskStateOf(const std::string& job_id, int64_t index, const std::string& name);
absl::StatusOr<ExecutorState> ExecutorStateOf(const std::string& id, const std::string& name);
// `owner`, when given: Executor::owner, kept in the same JSON under kOwnerKey.
absl::StatusOr<ExecutorInfo> ExecutorInfoOf(const std::string& id, const std::string& json,
                                            std::string* owner = nullptr);
inline constexpr char kOwnerKey[] = "owner";
absl::StatusOr<Role> RoleOf(const std::string& id, const std::string& name);
absl::StatusOr<ScopeSet> ScopesOf(const std::string& id, const std::string& text);
absl::StatusOr<ModelFacts> ModelFactsOf(const std::string& id, const std::string& json);
// A task's chunks (JSON array) and shadow (JSON object, "" or NULL for none).
absl::Status ReadTaskJson(Task& task, const std::string& chunks, const std::string& shadow);

template <typename Row>
absl::StatusOr<Job> ReadJob(const Row& row, int first = 0) {
  Job job;
  job.id = row.Text(first + 0);
  ASSIGN_OR_RETURN(job.state, JobStateOf(job.id, row.Text(first + 2)));
  ASSIGN_OR_RETURN(job.spec, JobSpecOf(job.id, row.Text(first + 3)));
  job.counts.total = row.Int(first + 4);
  job.counts.completed = row.Int(first + 5);
  job.counts.failed = row.Int(first + 6);
  job.n_tasks = row.Int(first + 7);
  job.tasks_done = row.Int(first + 8);
  job.tasks_succeeded = row.Int(first + 9);
  job.error = row.Text(first + 10);
  job.output_key = row.Text(first + 11);
  job.errors_key = row.Text(first + 12);
  job.manifest_key = row.Text(first + 13);
  job.created_at = row.Time(first + 14);
  job.updated_at = row.Time(first + 15);
  job.started_at = row.OptTime(first + 16);
  job.finished_at = row.OptTime(first + 17);
  job.device_time = absl::Microseconds(row.Int(first + 18));
  std::optional<int64_t> prompt = row.OptInt(first + 19), completion = row.OptInt(first + 20);
  // reasoning_tokens is NULL for a job finished before schema 19 (its reasoning was not kept apart).
  if (prompt && completion) job.tokens = TokenUsage{*prompt, *completion, row.OptInt(first + 21).value_or(0)};
  return job;
}

template <typename Row>
absl::StatusOr<Task> ReadTask(const Row& row, int first = 0) {
  Task task;
  task.job_id = row.Text(first + 0);
  task.index = row.Int(first + 1);
  task.first_record = row.Int(first + 2);
  task.n_records = row.Int(first + 3);
  task.byte_begin = row.Int(first + 4);
  task.byte_end = row.Int(first + 5);
  ASSIGN_OR_RETURN(task.state, TaskStateOf(task.job_id, task.index, row.Text(first + 6)));
  task.attempt = static_cast<int>(row.Int(first + 7));
  task.failures = static_cast<int>(row.Int(first + 8));
  task.preemptions = static_cast<int>(row.Int(first + 9));
  task.executor_id = row.Text(first + 10);
  task.lease_expires_at = row.OptTime(first + 11);
  task.not_before = row.OptTime(first + 12);
  task.records_done = row.Int(first + 13);
  task.records_failed = row.Int(first + 14);
  task.last_error = row.Text(first + 15);
  task.started_at = row.OptTime(first + 16);
  task.finished_at = row.OptTime(first + 17);
  RETURN_IF_ERROR(ReadTaskJson(task, row.Text(first + 18), row.Text(first + 19)));
  return task;
}

template <typename Row>
absl::StatusOr<Executor> ReadExecutor(const Row& row, int first = 0) {
  Executor executor;
  executor.id = row.Text(first + 0);
  ASSIGN_OR_RETURN(executor.info, ExecutorInfoOf(executor.id, row.Text(first + 1), &executor.owner));
  ASSIGN_OR_RETURN(executor.state, ExecutorStateOf(executor.id, row.Text(first + 2)));
  executor.state_reason = row.Text(first + 3);
  executor.registered_at = row.Time(first + 4);
  executor.last_heartbeat_at = row.Time(first + 5);
  executor.drain_requested = row.Bool(first + 6);
  executor.records_done = row.Int(first + 7);
  return executor;
}

template <typename Row>
Team ReadTeam(const Row& row, int first = 0) {
  Team team;
  team.name = row.Text(first + 0);
  team.max_priority = static_cast<int>(row.Int(first + 1));
  team.max_active_jobs = row.Int(first + 2);
  team.requests_per_second = row.Int(first + 3);
  team.created_at = row.Time(first + 4);
  team.weight = row.Int(first + 5);
  team.max_running_tasks = row.Int(first + 6);
  team.max_file_bytes = row.Int(first + 7);
  team.max_model_bytes = row.Int(first + 8);
  team.max_result_bytes = row.Int(first + 9);
  team.file_bytes = row.Int(first + 10);
  team.result_bytes = row.Int(first + 11);
  team.runners = absl::StrSplit(row.Text(first + 12), ' ', absl::SkipEmpty());
  team.require_confined = row.Int(first + 13) != 0;
  team.verify_fraction = static_cast<double>(row.Int(first + 14)) / kPartsPerMillion;
  return team;
}

// A team's standing (model/fair_share.h) from a row of: name, weight, max_running_tasks,
// usage_us (ended attempts, decayed as of usage_at), usage_at, running (tasks), the device
// microseconds the running attempts have used so far (times each one's executors), and device_us
// (ended attempts, never decayed); decayed to `now`.
template <typename Row>
TeamUsage ReadTeamUsage(const Row& row, absl::Time now, absl::Duration half_life) {
  TeamUsage usage;
  usage.team = row.Text(0);
  usage.weight = row.Int(1);
  usage.max_running_tasks = row.Int(2);
  usage.usage = DecayUsage(absl::Microseconds(row.Int(3)), absl::FromUnixMicros(row.Int(4)), now, half_life);
  usage.running = row.Int(5);
  // (The running attempts' start times are summed in floating point: clamp its rounding.)
  if (usage.running > 0) usage.usage += absl::Microseconds(std::max<int64_t>(row.Int(6), 0));
  usage.device_time = absl::Microseconds(row.Int(7));
  return usage;
}

template <typename Row>
absl::StatusOr<TokenRecord> ReadToken(const Row& row, int first = 0) {
  TokenRecord token;
  token.id = row.Text(first + 0);
  token.secret_hash = row.Text(first + 1);
  ASSIGN_OR_RETURN(token.role, RoleOf(token.id, row.Text(first + 2)));
  token.team = row.Text(first + 3);
  token.principal = row.Text(first + 4);
  ASSIGN_OR_RETURN(token.scopes, ScopesOf(token.id, row.Text(first + 5)));
  token.uses_left = row.Int(first + 6);
  token.created_by = row.Text(first + 7);
  token.created_at = row.Time(first + 8);
  token.expires_at = row.OptTime(first + 9);
  token.last_used_at = row.OptTime(first + 10);
  token.revoked_at = row.OptTime(first + 11);
  return token;
}

template <typename Row>
absl::StatusOr<ModelRecord> ReadModel(const Row& row, int first = 0) {
  ModelRecord model;
  model.team = row.Text(first + 0);
  model.name = row.Text(first + 1);
  model.digest = row.Text(first + 2);
  model.size_bytes = row.Int(first + 3);
  ASSIGN_OR_RETURN(model.facts, ModelFactsOf(absl::StrCat(model.team, "/", model.name), row.Text(first + 4)));
  model.blob_key = row.Text(first + 5);
  model.created_by = row.Text(first + 6);
  model.created_at = row.Time(first + 7);
  return model;
}

}  // namespace minions::store_rows
