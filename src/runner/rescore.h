#pragma once
// Verification by re-scoring (issue 38, docs/verification.md): a second runner feeds a record's
// prompt and the answer another executor claimed through the same model in one prompt pass
// (teacher forcing) and checks every claimed token against its own logits.
//
// This file is the pure part, shared by every runner and by tests: the per-token statistics
// computed from one row of logits (ScoreLogits), the decision over them (Decide), the embedding
// check, the thresholds and the `rescore` protocol message. No llama.cpp here: the engine side is
// runner/llama/rescorer.h, which produces the evidence this file judges.
//
// Threads: everything here is a pure function or a value type; any thread may call it.

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/json_util.h"
#include "runner/batch_record.h"

namespace minions::rescore {

// The numbers of the decision rules. Defaults are chosen from measurements of honest runners
// (docs/verification.md, "Thresholds"); a team may override any of them (FromJson).
struct Thresholds {
  // Greedy answers (temperature 0): an honest token is the verifier's argmax or a near-tie.
  int top_k = 10;                // a claimed token ranked below the k most likely fails
  double gap_hard = 1.0;         // nats: one token further than this from the argmax fails
  double gap_soft = 0.05;        // nats: tokens further than this count as "soft" misses ...
  int soft_misses = 2;           // ... and more than max(soft_misses, soft_fraction * n) fail
  double soft_fraction = 0.01;
  // Sampled answers: no token may be less likely than this after temperature and top_p ...
  double min_logprob = -20.0;    // nats (about 2e-9)
  // ... nor the whole answer's log-likelihood this many standard deviations below what honest
  // draws from the verifier's distributions give (one-sided).
  double max_sigmas = 6.0;
  // A token just outside the top_p nucleus (float noise moves the boundary) is judged as if
  // inside when the mass of the tokens more likely than it is below top_p + this.
  double top_p_slack = 0.02;
  // Embeddings: cosine similarity of the claimed and recomputed vectors.
  double min_cosine = 0.999;

  Json ToJson() const;
  // Starts from `base`; every field given overrides it. Out-of-range values are refused.
  static absl::StatusOr<Thresholds> FromJson(const Json& json, const Thresholds& base);
  static absl::StatusOr<Thresholds> FromJson(const Json& json);  // over the defaults
};

// What the verifier's logits say about one claimed token.
struct TokenScore {
  int32_t token = -1;
  int rank = 0;          // tokens strictly more likely than the claimed one (0: the argmax)
  double gap = 0;        // nats: max logit - claimed logit (raw logits, temperature 1)
  // log p(token) under the record's sampling transforms (temperature, top_p); -inf when they
  // exclude it. Greedy records: the log-softmax of the raw logits.
  double logprob = 0;
  double entropy = 0;    // of that transformed distribution (nats)
  double variance = 0;   // of log p under it: Var[log p(X)], X drawn from it
  bool excluded = false; // outside the top_p nucleus beyond the slack
};

// What a sampled record's chain does after biases and penalties (which ShapeLogits applies to the
// row first), in llama.cpp's order (runner/llama/record_sampler.cc): top_k, top_p, min_p, then
// temperature. temperature <= 0 means greedy: only rank, gap and the log-softmax matter.
struct Transforms {
  float temperature = 1.0f;
  int top_k = 0;        // 0: off
  float top_p = 1.0f;   // 1: off
  float min_p = 0.0f;   // 0: off
};
Transforms TransformsOf(const SamplingParams& sampling);

// Scores `token` against one row of `n_vocab` logits (already shaped, when the record asks for
// biases or penalties). A token outside a stage's boundary by more than float noise (gap_soft
// nats for top_k and min_p, top_p_slack of mass for top_p) is excluded; a token the biases forbid
// too. Pure arithmetic; O(n_vocab log n_vocab) at worst.
TokenScore ScoreLogits(const float* logits, int n_vocab, int32_t token, const Transforms& transforms,
                       const Thresholds& thresholds);
TokenScore ScoreLogits(const float* logits, int n_vocab, int32_t token, float temperature, float top_p,
                       const Thresholds& thresholds);

// Does the record's sampling change the logits themselves (logit_bias, penalties)?
bool ShapesLogits(const SamplingParams& sampling);
// Applies the record's logit_bias (-100 forbids: -inf) and then llama.cpp's repetition penalties
// over `history` (the answer's tokens before the one this row scores; the producer's window is
// the whole answer) to one row of logits, with the producer's float arithmetic.
void ShapeLogits(const SamplingParams& sampling, std::span<const int32_t> history, std::vector<float>& row);

// The ids of the `k` largest logits, most likely first.
std::vector<int32_t> TopTokens(const float* logits, int n_vocab, int k);

// Everything Decide needs, gathered by the engine.
struct Evidence {
  bool greedy = true;
  std::vector<TokenScore> tokens;        // one per answer token the verifier scored
  std::optional<TokenScore> end_token;   // the end-of-generation token after the answer, when the
                                         // answer claims it stopped there
  int claimed_prompt_tokens = 0;
  int counted_prompt_tokens = 0;
  int claimed_completion_tokens = 0;
  int counted_completion_tokens = 0;
  // Greedy answers are reproduced token for token, so the completion count must be equal. A
  // sampled answer's tokens may be split otherwise than the verifier splits its text; its claim
  // must then lie in [1, completion_upper_bound] (and equal max_tokens when it says "length").
  bool exact_completion_count = true;
  int completion_upper_bound = 0;
  std::optional<int> length_cap;  // a "length" finish must have used exactly this many tokens
  // Set by the engine when the answer cannot be the model's output at all (text no token chain
  // produces, a finish the record does not allow...): Decide fails with this reason.
  std::string structural_failure;
};

struct Verdict {
  bool passed = false;
  std::string reason;       // why it failed (empty when it passed)
  // Set when there was nothing to re-score (the producer answered the record with an error line,
  // which the chunk checks judge): passed, and says why nothing was checked.
  std::string skipped;
  int failed_token = -1;    // the first answer token that failed, when one did
  int tokens_checked = 0;
  double max_gap = 0;       // greedy: the largest gap seen
  int max_rank = 0;         // text answers: the lowest-ranked token seen (0: every one the argmax)
  double min_logprob = 0;   // sampled: the smallest token logprob seen
  double sigmas = 0;        // sampled: (log-likelihood - expected) / its standard deviation
  double min_cosine = 1;    // embeddings
  int counted_prompt_tokens = 0;
  int counted_completion_tokens = 0;
  int resplits = 0;         // text answers: re-splits the verifier made (each a pass over the rest)
  Json ToJson() const;
  static Verdict FromJson(const Json& json);
};

Verdict Decide(const Evidence& evidence, const Thresholds& thresholds);

// Embeddings: every claimed vector must have the recomputed one's length and a cosine of at least
// thresholds.min_cosine with it; the claimed prompt_tokens must equal the recomputed count.
Verdict DecideEmbeddings(const std::vector<std::vector<float>>& claimed,
                         const std::vector<std::vector<float>>& recomputed, int claimed_prompt_tokens,
                         int counted_prompt_tokens, const Thresholds& thresholds);
double Cosine(const std::vector<float>& a, const std::vector<float>& b);

// A claimed answer, read from an OpenAI Batch output line.
struct ClaimedAnswer {
  enum class Kind { kText, kEmbeddings, kError } kind = Kind::kError;
  std::string text;            // kText: choices[0].text or .message.content
  std::string finish_reason;   // kText: "stop" or "length"
  std::vector<std::vector<float>> embeddings;  // kEmbeddings, by index
  int prompt_tokens = 0;
  int completion_tokens = 0;
};
// A line whose shape is wrong (no choices, a non-numeric usage...) is an error: an honest runner
// never writes one, so the verifier reports it as a failed check.
absl::StatusOr<ClaimedAnswer> ParseClaimedAnswer(const Json& output_line);

// The runner protocol's `rescore` command (docs/runner-protocol.md, "rescore").
struct Item {
  std::string record;  // the input line, as in `run`
  Json output;         // the output line the producer claimed for it
};
struct Request {
  std::string batch;
  std::vector<Item> items;
  Thresholds thresholds;
};
inline constexpr size_t kMaxItems = 4096;
std::string EncodeRequest(const Request& request);
absl::StatusOr<Request> RequestFromJson(const Json& json);
// {"type":"verdict","batch":...,"index":i,"custom_id":...,"verdict":{...}}
std::string EncodeVerdict(const std::string& batch, size_t index, const std::string& custom_id,
                          const Verdict& verdict);
// The verifier could not check the item (no model loaded, the answer does not fit its context...):
// {"type":"verdict",...,"error":"..."}. Says nothing against the producer.
std::string EncodeUncheckable(const std::string& batch, size_t index, const std::string& custom_id,
                              const std::string& message);

}  // namespace minions::rescore
