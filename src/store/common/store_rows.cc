#include "store/common/store_rows.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_join.h"

namespace minions::store_rows {
namespace {

std::string Name(std::string_view name) { return std::string(name); }

// A task's shadow column (ReadTaskJson reads it back).
Json ShadowToJson(const Task::Shadow& shadow) {
  Json json{{"attempt", shadow.attempt}, {"executor_id", shadow.executor_id}};
  if (shadow.since) json["since_us"] = absl::ToUnixMicros(*shadow.since);
  return json;
}

}  // namespace

Values JobValues(const Job& job) {
  return {job.id,
          job.spec.team,
          Name(JobStateName(job.state)),
          DumpJson(JobSpecToJson(job.spec)),
          int64_t{job.spec.priority},
          job.spec.requirements.min_memory_bytes,
          job.spec.requirements.runner,
          job.counts.total,
          job.n_tasks,
          job.error,
          job.output_key,
          job.errors_key,
          job.manifest_key,
          TimeValue(job.created_at),
          TimeValue(job.updated_at),
          TimeValue(job.started_at),
          TimeValue(job.finished_at),
          job.spec.model_digest};
}

Values JobCountValues(const Job& job) {
  return {job.counts.completed, job.counts.failed, job.tasks_done, job.tasks_succeeded};
}

Values TaskValues(const Task& task) {
  return {task.job_id,
          task.index,
          task.first_record,
          task.n_records,
          task.byte_begin,
          task.byte_end,
          Name(TaskStateName(task.state)),
          int64_t{task.attempt},
          int64_t{task.failures},
          int64_t{task.preemptions},
          task.executor_id,
          TimeValue(task.lease_expires_at),
          TimeValue(task.not_before),
          task.records_done,
          task.records_failed,
          task.last_error,
          TimeValue(task.started_at),
          TimeValue(task.finished_at),
          DumpJson(ChunksToJson(task.chunks)),
          task.shadow ? Value(DumpJson(ShadowToJson(*task.shadow))) : Value(std::monostate{})};
}

Values ExecutorValues(const Executor& executor) {
  Json info = ExecutorInfoToJson(executor.info);
  // The owner is the server's word, kept beside what the executor says of itself (migration-free:
  // the info column is JSON), and never taken from what it says (ReadExecutor, RegisterExecutor).
  if (!executor.owner.empty()) info[kOwnerKey] = executor.owner;
  return {executor.id,
          DumpJson(info),
          Name(ExecutorStateName(executor.state)),
          executor.state_reason,
          TimeValue(executor.registered_at),
          TimeValue(executor.last_heartbeat_at),
          int64_t{executor.drain_requested ? 1 : 0},
          executor.records_done};
}

Values TeamValues(const Team& team) {
  return {team.name,           int64_t{team.max_priority}, team.max_active_jobs, team.requests_per_second,
          TimeValue(team.created_at), team.weight,           team.max_running_tasks,
          team.max_file_bytes,        team.max_model_bytes,  team.max_result_bytes,
          team.file_bytes,            team.result_bytes,     absl::StrJoin(team.runners, " "),
          int64_t{team.require_confined ? 1 : 0}, static_cast<int64_t>(std::llround(team.verify_fraction * kPartsPerMillion))};
}

Values ModelValues(const ModelRecord& model) {
  return {model.team,       model.name,       model.digest,     model.size_bytes, DumpJson(ModelFactsToJson(model.facts)),
          model.blob_key,   model.created_by, TimeValue(model.created_at)};
}

Values TokenValues(const TokenRecord& token) {
  return {token.id,
          token.secret_hash,
          Name(RoleName(token.role)),
          token.team,
          token.principal,
          ScopesToString(token.scopes),
          token.uses_left,
          token.created_by,
          TimeValue(token.created_at),
          TimeValue(token.expires_at),
          TimeValue(token.last_used_at),
          TimeValue(token.revoked_at)};
}

absl::Status CorruptRow(std::string_view table, std::string_view id, std::string_view what) {
  return absl::InternalError(
      absl::StrCat("corrupt ", std::string(table), " row ", std::string(id), ": ", std::string(what)));
}

namespace {

// A name column's value (`kind`: "state", "role"), parsed by `parse`; a corrupt row if unknown.
template <typename T>
absl::StatusOr<T> NamedOf(std::string_view table, std::string_view id, const char* kind,
                          const std::string& name, std::optional<T> (*parse)(std::string_view)) {
  std::optional<T> value = parse(name);
  if (!value) return CorruptRow(table, id, absl::StrCat("unknown ", kind, " ", name));
  return *value;
}

// A JSON column's value, read by `from_json`; a corrupt row if it does not parse.
template <typename T>
absl::StatusOr<T> JsonOf(std::string_view table, std::string_view id, const std::string& json,
                         absl::StatusOr<T> (*from_json)(const Json&)) {
  absl::StatusOr<Json> parsed = ParseJson(json);
  if (!parsed.ok()) return CorruptRow(table, id, std::string(parsed.status().message()));
  absl::StatusOr<T> value = from_json(*parsed);
  if (!value.ok()) return CorruptRow(table, id, std::string(value.status().message()));
  return value;
}

}  // namespace

absl::StatusOr<JobState> JobStateOf(const std::string& id, const std::string& name) {
  return NamedOf("jobs", id, "state", name, ParseJobState);
}

absl::StatusOr<JobSpec> JobSpecOf(const std::string& id, const std::string& json) {
  return JsonOf("jobs", id, json, JobSpecFromJson);
}

absl::StatusOr<TaskState> TaskStateOf(const std::string& job_id, int64_t index, const std::string& name) {
  return NamedOf("tasks", absl::StrCat(job_id, "/", index), "state", name, ParseTaskState);
}

absl::Status ReadTaskJson(Task& task, const std::string& chunks, const std::string& shadow) {
  const std::string id = absl::StrCat(task.job_id, "/", task.index);
  absl::StatusOr<Json> chunks_json = ParseJson(chunks.empty() ? "[]" : chunks);
  if (!chunks_json.ok()) return CorruptRow("tasks", id, std::string(chunks_json.status().message()));
  absl::StatusOr<std::vector<Chunk>> parsed = ChunksFromJson(*chunks_json);
  if (!parsed.ok()) return CorruptRow("tasks", id, std::string(parsed.status().message()));
  task.chunks = *std::move(parsed);
  task.shadow.reset();
  if (shadow.empty()) return absl::OkStatus();
  absl::StatusOr<Json> shadow_json = ParseJson(shadow);
  const Json since = shadow_json.ok() ? JsonField(*shadow_json, "since_us") : Json();
  if (!shadow_json.ok() || !shadow_json->is_object() || !JsonField(*shadow_json, "attempt").is_number_integer() ||
      !JsonField(*shadow_json, "executor_id").is_string() ||
      !(since.is_null() || (since.is_number_unsigned() && since.get<uint64_t>() <= uint64_t{INT64_MAX}))) {
    return CorruptRow("tasks", id, absl::StrCat("bad shadow ", shadow));
  }
  task.shadow = Task::Shadow{(*shadow_json)["attempt"].get<int>(), (*shadow_json)["executor_id"].get<std::string>()};
  if (!since.is_null()) task.shadow->since = absl::FromUnixMicros(since.get<int64_t>());
  return absl::OkStatus();
}

absl::StatusOr<ExecutorState> ExecutorStateOf(const std::string& id, const std::string& name) {
  return NamedOf("executors", id, "state", name, ParseExecutorState);
}

absl::StatusOr<ExecutorInfo> ExecutorInfoOf(const std::string& id, const std::string& json, std::string* owner) {
  absl::StatusOr<Json> parsed = ParseJson(json);
  if (!parsed.ok()) return CorruptRow("executors", id, std::string(parsed.status().message()));
  if (owner != nullptr) {
    auto stored = parsed->is_object() ? parsed->find(kOwnerKey) : parsed->end();
    *owner = stored != parsed->end() && stored->is_string() ? stored->get<std::string>() : "";
  }
  absl::StatusOr<ExecutorInfo> info = ExecutorInfoFromJson(*parsed);
  if (!info.ok()) return CorruptRow("executors", id, std::string(info.status().message()));
  return info;
}

absl::StatusOr<ModelFacts> ModelFactsOf(const std::string& id, const std::string& json) {
  return JsonOf("models", id, json, ModelFactsFromJson);
}

absl::StatusOr<Role> RoleOf(const std::string& id, const std::string& name) {
  return NamedOf("tokens", id, "role", name, ParseRole);
}

absl::StatusOr<ScopeSet> ScopesOf(const std::string& id, const std::string& text) {
  ScopeSet scopes;
  if (absl::Status s = ParseScopes(text, &scopes); !s.ok()) return CorruptRow("tokens", id, std::string(s.message()));
  return scopes;
}

}  // namespace minions::store_rows
