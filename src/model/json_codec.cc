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
      {"model_digest", spec.model_digest},
      {"model_size_bytes", spec.model_size_bytes},
      {"input_key", spec.input_key},
      {"shard_size", spec.shard_size},
      {"max_attempts", spec.max_attempts},
      {"priority", spec.priority},
      {"requirements",
       {{"min_memory_bytes", spec.requirements.min_memory_bytes},
        {"estimate_bytes", spec.requirements.estimate_bytes},
        {"runner", spec.requirements.runner}}},
      {"runner_options", spec.runner_options.is_null() ? Json::object() : spec.runner_options},
  };
  if (spec.completion_window) {
    json["completion_window"] = absl::FormatDuration(*spec.completion_window);
  }
  if (!spec.owner.empty()) json["owner"] = spec.owner;
  if (spec.gang_size > 0) json["gang_size"] = spec.gang_size;
  if (spec.tokens_per_record > 0) json["tokens_per_record"] = spec.tokens_per_record;
  if (!spec.sizing.empty()) json["sizing"] = spec.sizing;
  if (spec.requirements.confined) json["requirements"]["confined"] = true;  // absent: as before
  return json;
}

absl::StatusOr<JobSpec> JobSpecFromJson(const Json& json) {
  if (!json.is_object()) return absl::InvalidArgumentError("a job spec must be a JSON object");
  JobSpec spec;
  RETURN_IF_ERROR(ReadString(json, "team", spec.team));
  RETURN_IF_ERROR(ReadString(json, "owner", spec.owner));
  RETURN_IF_ERROR(ReadString(json, "model", spec.model));
  RETURN_IF_ERROR(ReadString(json, "model_digest", spec.model_digest));
  RETURN_IF_ERROR(ReadInt(json, "model_size_bytes", spec.model_size_bytes));
  RETURN_IF_ERROR(ReadString(json, "input_key", spec.input_key));
  RETURN_IF_ERROR(ReadInt(json, "shard_size", spec.shard_size));
  RETURN_IF_ERROR(ReadInt(json, "max_attempts", spec.max_attempts));
  RETURN_IF_ERROR(ReadInt(json, "priority", spec.priority));
  const Json& requirements = JsonField(json, "requirements");
  if (!requirements.is_null()) {
    if (!requirements.is_object()) return absl::InvalidArgumentError("\"requirements\" must be an object");
    RETURN_IF_ERROR(ReadInt(requirements, "min_memory_bytes", spec.requirements.min_memory_bytes));
    RETURN_IF_ERROR(ReadInt(requirements, "estimate_bytes", spec.requirements.estimate_bytes));
    RETURN_IF_ERROR(ReadString(requirements, "runner", spec.requirements.runner));
    if (const Json& confined = JsonField(requirements, "confined"); !confined.is_null()) {
      if (!confined.is_boolean()) return absl::InvalidArgumentError("\"confined\" must be true or false");
      spec.requirements.confined = confined.get<bool>();
    }
  }
  const Json& options = JsonField(json, "runner_options");
  if (!options.is_null()) {
    if (!options.is_object()) return absl::InvalidArgumentError("\"runner_options\" must be an object");
    spec.runner_options = options;
  }
  RETURN_IF_ERROR(ReadDuration(json, "completion_window", spec.completion_window));
  RETURN_IF_ERROR(ReadInt(json, "gang_size", spec.gang_size));
  RETURN_IF_ERROR(ReadInt(json, "tokens_per_record", spec.tokens_per_record));
  RETURN_IF_ERROR(ReadString(json, "sizing", spec.sizing));
  return spec;
}

Json ExecutorInfoToJson(const ExecutorInfo& info) {
  Json json{
      {"name", info.name},
      {"os", info.os},
      {"chip", info.chip},
      {"memory_bytes", info.memory_bytes},
      {"accelerator", info.accelerator},
      {"gpu", info.gpu},
      {"usable_memory_bytes", info.usable_memory_bytes},
      {"runners", info.runners},
      {"models", info.models},
      {"model_loaded", info.model_loaded},
      {"max_tasks", info.max_tasks},
      {"version", info.version},
  };
  if (!info.gang_address.empty()) json["gang_address"] = info.gang_address;
  if (!info.model_folders.empty()) json["model_folders"] = info.model_folders;
  if (!info.confinement.empty()) json["confinement"] = info.confinement;
  return json;
}

absl::StatusOr<ExecutorInfo> ExecutorInfoFromJson(const Json& json) {
  if (!json.is_object()) return absl::InvalidArgumentError("executor info must be a JSON object");
  ExecutorInfo info;
  RETURN_IF_ERROR(ReadString(json, "name", info.name));
  RETURN_IF_ERROR(ReadString(json, "os", info.os));
  RETURN_IF_ERROR(ReadString(json, "chip", info.chip));
  RETURN_IF_ERROR(ReadInt(json, "memory_bytes", info.memory_bytes));
  RETURN_IF_ERROR(ReadString(json, "accelerator", info.accelerator));
  RETURN_IF_ERROR(ReadString(json, "gpu", info.gpu));
  RETURN_IF_ERROR(ReadInt(json, "usable_memory_bytes", info.usable_memory_bytes));
  RETURN_IF_ERROR(ReadStrings(json, "runners", info.runners));
  RETURN_IF_ERROR(ReadStrings(json, "models", info.models));
  RETURN_IF_ERROR(ReadString(json, "model_loaded", info.model_loaded));
  RETURN_IF_ERROR(ReadInt(json, "max_tasks", info.max_tasks));
  RETURN_IF_ERROR(ReadString(json, "version", info.version));
  RETURN_IF_ERROR(ReadString(json, "gang_address", info.gang_address));
  RETURN_IF_ERROR(ReadStrings(json, "model_folders", info.model_folders));
  RETURN_IF_ERROR(ReadString(json, "confinement", info.confinement));
  return info;
}

Json ModelFactsToJson(const ModelFacts& facts) {
  return Json{
      {"format", facts.format},
      {"architecture", facts.architecture},
      {"name", facts.name},
      {"parameters", facts.parameters},
      {"quantization", facts.quantization},
      {"context_length", facts.context_length},
      {"layers", facts.layers},
      {"embedding_size", facts.embedding_size},
      {"heads", facts.heads},
      {"kv_heads", facts.kv_heads},
      {"head_dim", facts.head_dim},
      {"vocab_size", facts.vocab_size},
  };
}

absl::StatusOr<ModelFacts> ModelFactsFromJson(const Json& json) {
  if (!json.is_object()) return absl::InvalidArgumentError("model facts must be a JSON object");
  ModelFacts facts;
  RETURN_IF_ERROR(ReadString(json, "format", facts.format));
  RETURN_IF_ERROR(ReadString(json, "architecture", facts.architecture));
  RETURN_IF_ERROR(ReadString(json, "name", facts.name));
  RETURN_IF_ERROR(ReadInt(json, "parameters", facts.parameters));
  RETURN_IF_ERROR(ReadString(json, "quantization", facts.quantization));
  RETURN_IF_ERROR(ReadInt(json, "context_length", facts.context_length));
  RETURN_IF_ERROR(ReadInt(json, "layers", facts.layers));
  RETURN_IF_ERROR(ReadInt(json, "embedding_size", facts.embedding_size));
  RETURN_IF_ERROR(ReadInt(json, "heads", facts.heads));
  RETURN_IF_ERROR(ReadInt(json, "kv_heads", facts.kv_heads));
  RETURN_IF_ERROR(ReadInt(json, "head_dim", facts.head_dim));
  RETURN_IF_ERROR(ReadInt(json, "vocab_size", facts.vocab_size));
  return facts;
}

Json ChunksToJson(const std::vector<Chunk>& chunks) {
  Json json = Json::array();
  for (const Chunk& c : chunks) {
    Json item = {{"attempt", c.attempt}, {"seq", c.seq}, {"begin", c.begin}, {"end", c.end},
                 {"records_failed", c.records_failed}};
    if (!c.executor_id.empty()) item["executor"] = c.executor_id;
    json.push_back(std::move(item));
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
    if (auto executor = item.find("executor"); executor != item.end()) {
      if (!executor->is_string()) return absl::InvalidArgumentError("a chunk's executor must be a string");
      c.executor_id = executor->get<std::string>();
    }
    chunks.push_back(c);
  }
  return chunks;
}

}  // namespace minions
