#pragma once
// The ONE estimate of the memory a task needs (design: fleet.md, "Models"). The server calls it at
// submit (Requirements::estimate_bytes, and a job no executor could ever hold is refused), the
// lease query compares its result with an executor's usable memory, the executor's cache and the
// gang planner call it too. Nothing else estimates memory.
//
//   model bytes
//   + KV cache     2 × layers × n_ctx_per_seq × n_parallel × kv_heads × head_dim × bytes per element
//   + compute      llama.cpp's compute buffers for one micro-batch (ComputeBufferBytes)
//   + margin       kMarginFraction of the sum, and at least kMarginFloorBytes
//
// Pure; any thread.

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/json_util.h"
#include "model/types.h"

namespace minions {

// The runner options the estimate depends on, with the llama runner's defaults
// (runner_protocol::LoadOptions: n_parallel 8, n_ctx_per_seq 0 = min(training context, 4096),
// n_batch 512; the KV cache is F16).
struct MemoryEstimateOptions {
  int64_t n_parallel = 8;
  int64_t n_ctx_per_seq = 0;   // 0: min(facts.context_length, 4096)
  int64_t n_batch = 512;       // the micro-batch is min(n_batch, 512)
  int64_t kv_bytes_per_element = 2;
};

// Reads n_parallel, n_ctx_per_seq and n_batch from a job's runner options (JobSpec::runner_options,
// the runner's LoadOptions JSON); absent keys keep the defaults. InvalidArgument for a key of the
// wrong type or a negative value.
absl::StatusOr<MemoryEstimateOptions> MemoryEstimateOptionsFrom(const Json& runner_options);

inline constexpr double kMarginFraction = 0.10;
inline constexpr int64_t kMarginFloorBytes = int64_t{64} << 20;

// The context one sequence gets under `options` (what the runner will allocate).
int64_t ContextPerSequence(const ModelFacts& facts, const MemoryEstimateOptions& options);
int64_t KvCacheBytes(const ModelFacts& facts, const MemoryEstimateOptions& options);
int64_t ComputeBufferBytes(const ModelFacts& facts, const MemoryEstimateOptions& options);

// Bytes one task of a model of `size_bytes` with `facts` needs under `options`.
int64_t EstimateTaskMemory(int64_t size_bytes, const ModelFacts& facts, const MemoryEstimateOptions& options);

}  // namespace minions
