#include "model/memory_estimate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace minions {
namespace {

absl::Status ReadCount(const Json& options, const char* key, int64_t& out) {
  const Json& v = JsonField(options, key);
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_number_integer() || v.get<int64_t>() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("runner option \"", key, "\" must be a non-negative integer"));
  }
  out = v.get<int64_t>();
  return absl::OkStatus();
}

int64_t HeadDim(const ModelFacts& facts) {
  if (facts.head_dim > 0) return facts.head_dim;
  return facts.heads > 0 ? facts.embedding_size / facts.heads : 0;
}

int64_t KvHeads(const ModelFacts& facts) { return facts.kv_heads > 0 ? facts.kv_heads : facts.heads; }

}  // namespace

absl::StatusOr<MemoryEstimateOptions> MemoryEstimateOptionsFrom(const Json& runner_options) {
  MemoryEstimateOptions options;
  if (runner_options.is_null()) return options;
  if (!runner_options.is_object()) return absl::InvalidArgumentError("runner options must be a JSON object");
  if (absl::Status s = ReadCount(runner_options, "n_parallel", options.n_parallel); !s.ok()) return s;
  if (absl::Status s = ReadCount(runner_options, "n_ctx_per_seq", options.n_ctx_per_seq); !s.ok()) return s;
  if (absl::Status s = ReadCount(runner_options, "n_batch", options.n_batch); !s.ok()) return s;
  if (options.n_parallel == 0) options.n_parallel = 1;
  if (options.n_batch == 0) options.n_batch = 512;
  return options;
}

int64_t ContextPerSequence(const ModelFacts& facts, const MemoryEstimateOptions& options) {
  if (options.n_ctx_per_seq > 0) return options.n_ctx_per_seq;
  return facts.context_length > 0 ? std::min<int64_t>(facts.context_length, 4096) : 4096;
}

int64_t KvCacheBytes(const ModelFacts& facts, const MemoryEstimateOptions& options) {
  return 2 * facts.layers * ContextPerSequence(facts, options) * std::max<int64_t>(options.n_parallel, 1) *
         KvHeads(facts) * HeadDim(facts) * options.kv_bytes_per_element;
}

// llama.cpp sizes its compute buffers for the worst micro-batch: the logits of every token of it
// (n_ubatch × n_vocab floats), the activations of one layer at a time (a few n_embd-wide and the
// feed-forward's rows per token), and the attention scores of one head batch (n_ubatch ×
// context × heads floats, without flash attention). This is an upper bound of those terms; the
// figures docs/architecture.md records were measured with the real runner and stay below it.
int64_t ComputeBufferBytes(const ModelFacts& facts, const MemoryEstimateOptions& options) {
  const int64_t ubatch = std::min<int64_t>(std::max<int64_t>(options.n_batch, 1), 512);
  const int64_t ctx = ContextPerSequence(facts, options);
  const int64_t logits = ubatch * facts.vocab_size * 4;
  const int64_t activations = ubatch * facts.embedding_size * 4 * 8;
  const int64_t attention = ubatch * std::min<int64_t>(ctx * std::max<int64_t>(options.n_parallel, 1), ctx) *
                            std::max<int64_t>(facts.heads, 1) * 4;
  return logits + activations + attention;
}

int64_t EstimateTaskMemory(int64_t size_bytes, const ModelFacts& facts, const MemoryEstimateOptions& options) {
  const int64_t sum = size_bytes + KvCacheBytes(facts, options) + ComputeBufferBytes(facts, options);
  const int64_t margin = std::max<int64_t>(static_cast<int64_t>(static_cast<double>(sum) * kMarginFraction),
                                           kMarginFloorBytes);
  return sum + margin;
}

}  // namespace minions
