#pragma once
// JSON forms of the domain's value types, for the metadata store's JSON columns and for anything
// that accepts a job spec as JSON (a CLI flag file, an HTTP body).
//
// Encoding never fails. Decoding is strict about types and lenient about absence: a missing field
// takes the default of the C++ struct, a field of the wrong type is InvalidArgument naming the
// field. Unknown fields are ignored, so an older binary reads rows a newer one wrote.

#include "absl/status/statusor.h"
#include "common/json_util.h"
#include "model/types.h"

namespace minions {

// {"team", "model", "model_digest", "model_size_bytes", "input_key", "shard_size", "max_attempts", "priority",
//  "requirements": {"min_memory_bytes", "estimate_bytes", "runner"}, "runner_options": {...},
//  "completion_window": "24h"}  (completion_window absent when unset; a Go-style duration string,
//  or a number of seconds when decoding)
Json JobSpecToJson(const JobSpec& spec);
absl::StatusOr<JobSpec> JobSpecFromJson(const Json& json);

// {"name", "os", "chip", "memory_bytes", "accelerator", "gpu", "usable_memory_bytes",
//  "runners": [...], "models": [...], "model_loaded", "max_tasks", "version"}
Json ExecutorInfoToJson(const ExecutorInfo& info);
absl::StatusOr<ExecutorInfo> ExecutorInfoFromJson(const Json& json);

// {"format", "architecture", "name", "parameters", "quantization", "context_length", "layers",
//  "embedding_size", "heads", "kv_heads", "head_dim", "vocab_size"} (a registry row's facts)
Json ModelFactsToJson(const ModelFacts& facts);
absl::StatusOr<ModelFacts> ModelFactsFromJson(const Json& json);

// [{"attempt", "seq", "begin", "end", "records_failed"}, ...] (a task's committed chunks)
Json ChunksToJson(const std::vector<Chunk>& chunks);
absl::StatusOr<std::vector<Chunk>> ChunksFromJson(const Json& json);

}  // namespace minions
