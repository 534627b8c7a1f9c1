#include "model/json_codec.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace minions {
namespace {

// Each reader leaves `out` untouched when the field is absent or null, so the struct's defaults
// stand; a present field of the wrong type is an error naming it.
absl::Status ReadString(const Json& object, const char* key, std::string& out) {
  const Json& v = JsonField(object, key);
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_string()) return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be a string"));
  out = v.get<std::string>();
  return absl::OkStatus();
}

template <typename Int>
absl::Status ReadInt(const Json& object, const char* key, Int& out) {
  const Json& v = JsonField(object, key);
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be an integer"));
  }
  out = static_cast<Int>(v.get<int64_t>());
  return absl::OkStatus();
}

absl::Status ReadStrings(const Json& object, const char* key, std::vector<std::string>& out) {
  const Json& v = JsonField(object, key);
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be an array of strings"));
  }
  std::vector<std::string> values;
  for (const Json& item : v) {
    if (!item.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be an array of strings"));
    }
    values.push_back(item.get<std::string>());
  }
  out = std::move(values);
  return absl::OkStatus();
}

absl::Status ReadDuration(const Json& object, const char* key, std::optional<absl::Duration>& out) {
  const Json& v = JsonField(object, key);
  if (v.is_null()) return absl::OkStatus();
  if (v.is_number()) {
    out = absl::Seconds(v.get<double>());
    return absl::OkStatus();
  }
  absl::Duration d;
  if (v.is_string() && absl::ParseDuration(v.get<std::string>(), &d)) {
    out = d;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("\"", key, "\" must be a duration such as \"24h\" or a number of seconds"));
}

}  // namespace

Json JobSpecToJson(const JobSpec& spec) {
  Json json = {
      {"team", spec.team},
      {"model", spec.model},
      {"input_key", spec.input_key},
      {"shard_size", spec.shard_size},
      {"max_attempts", spec.max_attempts},
      {"priority", spec.priority},
      {"requirements",
       {{"min_memory_bytes", spec.requirements.min_memory_bytes}, {"runner", spec.requirements.runner}}},
      {"runner_options", spec.runner_options.is_null() ? Json::object() : spec.runner_options},
  };
  if (spec.completion_window) {
    json["completion_window"] = absl::FormatDuration(*spec.completion_window);
  }
  if (!spec.owner.empty()) json["owner"] = spec.owner;
  return json;
}

absl::StatusOr<JobSpec> JobSpecFromJson(const Json& json) {
  if (!json.is_object()) return absl::InvalidArgumentError("a job spec must be a JSON object");
  JobSpec spec;
  RETURN_IF_ERROR(ReadString(json, "team", spec.team));
  RETURN_IF_ERROR(ReadString(json, "owner", spec.owner));
  RETURN_IF_ERROR(ReadString(json, "model", spec.model));
  RETURN_IF_ERROR(ReadString(json, "input_key", spec.input_key));
  RETURN_IF_ERROR(ReadInt(json, "shard_size", spec.shard_size));
  RETURN_IF_ERROR(ReadInt(json, "max_attempts", spec.max_attempts));
  RETURN_IF_ERROR(ReadInt(json, "priority", spec.priority));
  const Json& requirements = JsonField(json, "requirements");
  if (!requirements.is_null()) {
    if (!requirements.is_object()) return absl::InvalidArgumentError("\"requirements\" must be an object");
    RETURN_IF_ERROR(ReadInt(requirements, "min_memory_bytes", spec.requirements.min_memory_bytes));
    RETURN_IF_ERROR(ReadString(requirements, "runner", spec.requirements.runner));
  }
  const Json& options = JsonField(json, "runner_options");
  if (!options.is_null()) {
    if (!options.is_object()) return absl::InvalidArgumentError("\"runner_options\" must be an object");
    spec.runner_options = options;
  }
  RETURN_IF_ERROR(ReadDuration(json, "completion_window", spec.completion_window));
  return spec;
}

Json ExecutorInfoToJson(const ExecutorInfo& info) {
  return Json{
      {"name", info.name},
      {"os", info.os},
      {"chip", info.chip},
      {"memory_bytes", info.memory_bytes},
      {"gpu", info.gpu},
      {"runners", info.runners},
      {"models", info.models},
      {"max_tasks", info.max_tasks},
      {"version", info.version},
  };
}

absl::StatusOr<ExecutorInfo> ExecutorInfoFromJson(const Json& json) {
  if (!json.is_object()) return absl::InvalidArgumentError("executor info must be a JSON object");
  ExecutorInfo info;
  RETURN_IF_ERROR(ReadString(json, "name", info.name));
  RETURN_IF_ERROR(ReadString(json, "os", info.os));
  RETURN_IF_ERROR(ReadString(json, "chip", info.chip));
  RETURN_IF_ERROR(ReadInt(json, "memory_bytes", info.memory_bytes));
  RETURN_IF_ERROR(ReadString(json, "gpu", info.gpu));
  RETURN_IF_ERROR(ReadStrings(json, "runners", info.runners));
  RETURN_IF_ERROR(ReadStrings(json, "models", info.models));
  RETURN_IF_ERROR(ReadInt(json, "max_tasks", info.max_tasks));
  RETURN_IF_ERROR(ReadString(json, "version", info.version));
  return info;
}

Json ChunksToJson(const std::vector<Chunk>& chunks) {
  Json json = Json::array();
  for (const Chunk& c : chunks) {
    json.push_back({{"attempt", c.attempt}, {"seq", c.seq}, {"begin", c.begin}, {"end", c.end},
                    {"records_failed", c.records_failed}});
  }
  return json;
}

absl::StatusOr<std::vector<Chunk>> ChunksFromJson(const Json& json) {
  std::vector<Chunk> chunks;
  if (json.is_null()) return chunks;
  if (!json.is_array()) return absl::InvalidArgumentError("chunks must be a JSON array");
  for (const Json& item : json) {
    if (!item.is_object()) return absl::InvalidArgumentError("a chunk must be a JSON object");
    Chunk c;
    RETURN_IF_ERROR(ReadInt(item, "attempt", c.attempt));
    RETURN_IF_ERROR(ReadInt(item, "seq", c.seq));
    RETURN_IF_ERROR(ReadInt(item, "begin", c.begin));
    RETURN_IF_ERROR(ReadInt(item, "end", c.end));
    RETURN_IF_ERROR(ReadInt(item, "records_failed", c.records_failed));
    chunks.push_back(c);
  }
  return chunks;
}

}  // namespace minions
