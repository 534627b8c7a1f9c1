#pragma once
// How one record picks its tokens when it asks for more than the plain path gives (greedy argmax,
// or top_p -> temperature -> dist): penalties, logit_bias, top_k, min_p, a grammar (structured
// outputs) and log probabilities. Built from llama.cpp's samplers; JSON schemas are compiled into
// grammars by llama.cpp's common library (json_schema_to_grammar).
//
// Ownership: a RecordSampler owns its llama.cpp samplers; a GrammarCache owns the compiled
// grammars (prototypes each record clones). Threads: both are used by the engine's one serving
// thread only.

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/json_util.h"
#include "llama.h"
#include "runner/batch_record.h"
#include "runner/llama/grammar_mask.h"

namespace minions::llama_runner {

// The deepest repetition bound (maxItems, minItems, maxProperties...) a schema may ask for: the
// converter builds nested rules per repeated item, so a bound of millions would be an attack on
// the runner's memory and stack.
inline constexpr int64_t kMaxSchemaRepetition = 1000;

// Compiled grammars by their source bytes (the schema's compact JSON, or GBNF text), so that a
// job whose records share one schema compiles it once per runner. A schema the converter refuses
// is remembered too, with its error.
struct ToolGrammar;  // chat_tools.h

class GrammarCache {
 public:
  explicit GrammarCache(const llama_vocab* vocab) : vocab_(vocab) {}
  ~GrammarCache();
  GrammarCache(const GrammarCache&) = delete;
  GrammarCache& operator=(const GrammarCache&) = delete;

  // A fresh grammar sampler for the format (the caller owns it), or InvalidArgument naming what
  // the converter or the grammar parser could not take.
  absl::StatusOr<llama_sampler*> NewSampler(const OutputFormat& format);
  // The same for the tool-call grammar llama.cpp built from a request's tools (lazy or not).
  absl::StatusOr<llama_sampler*> NewToolSampler(const ToolGrammar& grammar);
  size_t compiled() const { return compiled_; }  // conversions done (tests: once per schema)
  // The vocabulary's token forest for masking under a grammar, built on first use.
  GrammarMask& Mask();

 private:
  struct Entry {
    llama_sampler* prototype = nullptr;  // null when `error` is set
    std::string error;
  };
  const llama_vocab* vocab_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> order_;  // keys, oldest first: the cache holds at most kMaxEntries
  size_t compiled_ = 0;
  std::unique_ptr<GrammarMask> mask_;
  static constexpr size_t kMaxEntries = 64;
  // The entry for `key`, compiled by `compile` (which sets the prototype or the error) when new.
  Entry& Find(std::string key, const std::function<void(Entry&)>& compile);
};

// The GBNF of a JSON schema (llama.cpp's converter), or InvalidArgument naming the keyword or
// feature it cannot express. json_object formats use the schema {"type":"object"}.
absl::StatusOr<std::string> SchemaToGrammar(const std::string& schema_json);

// One generated token's log probability and its most likely alternatives.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // most likely first
};

class RecordSampler {
 public:
  // Null when the plain path serves the request as it is (no grammar, penalties, biases, extra
  // samplers or logprobs): the engine's argmax or plain chain then costs what it always did.
  // An error names the field at fault (a logit_bias id outside the vocabulary, a schema the
  // converter cannot express).
  // `tools`: the tool-call grammar of a chat request rendered by ChatTemplates (null: none), and
  // `prompt` its tokens (a grammar that starts with the prompt's last words is advanced over them).
  static absl::StatusOr<std::unique_ptr<RecordSampler>> Create(const llama_model* model,
                                                               const InferenceRequest& request, uint64_t seed,
                                                               int max_tokens, GrammarCache& grammars,
                                                               const ToolGrammar* tools = nullptr,
                                                               const std::vector<int32_t>* prompt = nullptr);
  // The plain path's chain for a sampled record (top_p, temperature, dist); null for greedy.
  static llama_sampler* PlainChain(const SamplingParams& params, uint64_t seed);
  ~RecordSampler();
  RecordSampler(const RecordSampler&) = delete;
  RecordSampler& operator=(const RecordSampler&) = delete;

  // The next token from the logits of batch row `idx`; -1 when the grammar allows no token at all
  // (the answer ends there).
  int32_t Sample(llama_context* ctx, int32_t idx);
  // The token the record keeps (not called for end-of-generation tokens); false when the grammar
  // refuses it (it never should: Sample only picks tokens the grammar allows).
  bool Accept(int32_t token);
  const std::vector<TokenLogprob>& logprobs() const { return logprobs_; }

 private:
  RecordSampler() = default;
  llama_sampler* chain_ = nullptr;    // biases, penalties, top_k/top_p/min_p, temperature, pick
  llama_sampler* grammar_ = nullptr;  // the record's own copy of a compiled grammar
  // Masks the vocabulary under grammar_ without judging every token (set for grammars that match
  // text only and are not lazy; see grammar_mask.h), while the text the grammar has taken so far
  // ends on a whole UTF-8 character (utf8_remain_ == 0); otherwise llama.cpp judges every token.
  GrammarMask* mask_ = nullptr;
  int utf8_remain_ = 0;
  const llama_vocab* vocab_ = nullptr;
  int n_vocab_ = 0;
  int logprobs_top_ = -1;  // -1: no logprobs
  std::vector<TokenLogprob> logprobs_;
  TokenLogprob pending_;  // the last sampled token's, kept when it is accepted
  std::vector<llama_token_data> cur_;  // candidates of the grammar path, reused per token
};

// The logprobs field of a choice, in the endpoint's shape: chat {"content": [{token, logprob,
// bytes, top_logprobs}]}, completions {tokens, token_logprobs, top_logprobs, text_offset}.
// `piece` turns a token into its text.
// Entries whose text starts at or past `text_size` (cut off by a stop string) are left out.
Json LogprobsJson(const std::vector<TokenLogprob>& entries, Endpoint endpoint, int top, size_t text_size,
                  const std::function<std::string(int32_t)>& piece);

}  // namespace minions::llama_runner
