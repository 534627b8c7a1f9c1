#pragma once
// Rescorer: checks answers another executor claimed, with this runner's model (issue 38,
// docs/verification.md). A text answer is fed after its record's prompt through the model in one
// prompt pass (teacher forcing: logits for every answer position from one llama_decode per
// n_batch tokens), each claimed token is scored against the logits (runner/rescore.h), and
// rescore::Decide judges the scores. An embedding answer is recomputed and compared by cosine.
//
// Tokens: an output line carries text, not token ids. The verifier splits the text into tokens
// (the tokenizer's own split first) and, where the model prefers another split of the same text
// (the producer's model chose the tokens, not the tokenizer), re-splits from that position and
// decodes the rest again. The split the verifier ends with is the model's most likely one, which
// for a greedy answer is the producer's own.
//
// Ownership: borrows the engine (which must outlive it) and owns a context of its own on the
// engine's model, so that checking leaves the generation slots' cached prefixes alone.
// Threads: not thread-safe; called on the runner's main thread between ServeStream calls.

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runner/batch_record.h"
#include "runner/llama/llama_engine.h"
#include "runner/rescore.h"

namespace minions::llama_runner {

class Rescorer {
 public:
  explicit Rescorer(LlamaEngine& engine);
  ~Rescorer();
  Rescorer(const Rescorer&) = delete;
  Rescorer& operator=(const Rescorer&) = delete;

  // Judges `output_line`, the answer claimed for `record_line`. A verdict that fails is evidence
  // against the producer; an error status means this verifier could not check (no context, the
  // answer does not fit it, the engine failed) and says nothing about the producer.
  absl::StatusOr<rescore::Verdict> Check(const std::string& record_line, const Json& output_line,
                                         const rescore::Thresholds& thresholds);

 private:
  // One way the claimed text may have been generated: the text itself ending with an
  // end-of-generation token, or (a stop string cut it) the text followed by that stop string,
  // whose last token may reach past it.
  struct Target {
    std::string text;
    bool expect_end = false;
    bool overflow_ok = false;
  };
  struct Scored {
    rescore::Evidence evidence;
    size_t empty_pieces = 0;  // tokens in the final split that print nothing
    int resplits = 0;         // times the model's split replaced the tokenizer's
  };

  absl::StatusOr<rescore::Verdict> CheckText(const InferenceRequest& request, const rescore::ClaimedAnswer& claimed,
                                             const rescore::Thresholds& thresholds);
  absl::StatusOr<rescore::Verdict> CheckEmbeddings(const InferenceRequest& request,
                                                   const rescore::ClaimedAnswer& claimed,
                                                   const rescore::Thresholds& thresholds);
  // Scores one target after the prompt, whose cells (all but the last token) are in the context.
  absl::StatusOr<Scored> ScoreTarget(const std::vector<int32_t>& prompt, const Target& target,
                                     const SamplingParams& sampling, const rescore::Thresholds& thresholds);
  absl::Status EnsureContext();
  // Feeds tokens[from, to) at positions from.. (logits for positions >= first_logit), calling
  // `row(pos, logits)` for each; a false return stops the feed (the caller re-splits).
  absl::Status Feed(const std::vector<int32_t>& tokens, size_t from, size_t to, size_t first_logit,
                    const std::function<bool(size_t, const float*)>& row);
  // The tokens whose pieces spell `text` (empty when no split exists).
  std::vector<int32_t> Split(const std::string& text);
  const std::string& Piece(int32_t token);
  // Fills piece_ids_ (every token that prints something, by what it prints) once.
  void IndexPieces();

  LlamaEngine& engine_;
  struct llama_context* ctx_ = nullptr;
  int n_vocab_ = 0;
  std::vector<int32_t> end_tokens_;           // the vocabulary's end-of-generation tokens
  std::vector<std::string> pieces_;           // by token id, filled lazily
  std::vector<char> piece_known_;
  // What each token prints -> the tokens that print it (not the end-of-generation ones), built
  // lazily: the splitter's fallback, and the candidates for a re-split.
  std::map<std::string, std::vector<int32_t>, std::less<>> piece_ids_;
  size_t longest_piece_ = 0;
};

}  // namespace minions::llama_runner
