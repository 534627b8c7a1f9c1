#include "runner/llama/rescorer.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <span>
#include <thread>

#include "absl/strings/str_cat.h"
#include "llama.h"

namespace minions::llama_runner {
namespace {

// Re-splits of one answer (each decodes the rest of the answer again). Real models keep to their
// tokenizer's split almost always; the random-weight test models do not, and a 4096-token answer
// re-split at every token would cost 4096 passes.
constexpr int kMaxResplits = 256;
// The most likely tokens looked at for another split at one position.
constexpr int kCandidates = 32;
// Rows of logits one decode returns (each is n_vocab floats).
constexpr size_t kLogitRows = 128;

void AddToken(llama_batch& batch, llama_token token, llama_pos pos, bool logits) {
  const int i = batch.n_tokens++;
  batch.token[i] = token;
  batch.pos[i] = pos;
  batch.n_seq_id[i] = 1;
  batch.seq_id[i][0] = 0;
  batch.logits[i] = logits;
}

rescore::Verdict Failed(std::string reason) {
  rescore::Verdict verdict;
  verdict.reason = std::move(reason);
  return verdict;
}

}  // namespace

Rescorer::Rescorer(LlamaEngine& engine) : engine_(engine) {
  const llama_vocab* vocab = llama_model_get_vocab(engine_.model_);
  n_vocab_ = llama_vocab_n_tokens(vocab);
  for (int32_t t = 0; t < n_vocab_; ++t) {
    if (llama_vocab_is_eog(vocab, t)) end_tokens_.push_back(t);
  }
  pieces_.resize(static_cast<size_t>(n_vocab_));
  piece_known_.assign(static_cast<size_t>(n_vocab_), 0);
}

Rescorer::~Rescorer() {
  if (ctx_) llama_free(ctx_);
}

const std::string& Rescorer::Piece(int32_t token) {
  const size_t i = static_cast<size_t>(token);
  if (!piece_known_[i]) {
    pieces_[i] = engine_.TokenPiece(token);
    piece_known_[i] = 1;
  }
  return pieces_[i];
}

absl::Status Rescorer::EnsureContext() {
  if (ctx_) return absl::OkStatus();
  if (engine_.gen_ctx_ == nullptr) {
    return absl::FailedPreconditionError("this verifier's model is an embedding model; it cannot check text answers");
  }
  // The same arithmetic as the engine's generation context: its threads, batch and attention.
  const auto& options = engine_.options_;
  llama_context_params cparams = llama_context_default_params();
  cparams.n_seq_max = 1;
  cparams.n_ctx = static_cast<uint32_t>(engine_.n_ctx_per_seq_);
  const int n_batch = std::max(options.n_batch, 1);
  cparams.n_batch = static_cast<uint32_t>(n_batch);
  cparams.n_ubatch = static_cast<uint32_t>(std::min(n_batch, 512));
  unsigned hw = std::thread::hardware_concurrency();
  const int threads = options.n_threads > 0 ? options.n_threads : (hw == 0 ? 4 : static_cast<int>(hw));
  cparams.n_threads = threads;
  cparams.n_threads_batch = threads;
  cparams.flash_attn_type = JsonString(engine_.Info(), "flash_attn") == "disabled" ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                                                                    : LLAMA_FLASH_ATTN_TYPE_AUTO;
  cparams.no_perf = true;
  ctx_ = llama_init_from_model(engine_.model_, cparams);
  if (ctx_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot create a verification context of ", cparams.n_ctx, " tokens"));
  }
  return absl::OkStatus();
}

void Rescorer::IndexPieces() {
  if (!piece_ids_.empty()) return;
  for (int32_t t = 0; t < n_vocab_; ++t) {
    if (std::find(end_tokens_.begin(), end_tokens_.end(), t) != end_tokens_.end()) continue;
    const std::string& piece = Piece(t);
    if (piece.empty()) continue;
    piece_ids_[piece].push_back(t);
    longest_piece_ = std::max(longest_piece_, piece.size());
  }
}

std::vector<int32_t> Rescorer::Split(const std::string& text) {
  if (text.empty()) return {};
  const llama_vocab* vocab = llama_model_get_vocab(engine_.model_);
  std::vector<llama_token> tokens(text.size() + 8);
  int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                             static_cast<int32_t>(tokens.size()), /*add_special=*/false, /*parse_special=*/false);
  if (n < 0) {
    tokens.resize(static_cast<size_t>(-n));
    n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                       static_cast<int32_t>(tokens.size()), false, false);
  }
  tokens.resize(static_cast<size_t>(std::max(n, 0)));
  auto spells = [&](const std::vector<llama_token>& split) {
    std::string joined;
    for (llama_token t : split) joined += Piece(t);
    return joined == text;
  };
  if (spells(tokens)) return tokens;
  // SentencePiece vocabularies put a space before the text; a lone space token can go.
  if (!tokens.empty() && Piece(tokens.front()) == " ") {
    std::vector<llama_token> rest(tokens.begin() + 1, tokens.end());
    if (spells(rest)) return rest;
  }
  // Otherwise the longest piece first, from the whole vocabulary (any split will do: where the
  // model prefers another, the caller re-splits).
  IndexPieces();
  std::vector<int32_t> split;
  for (size_t at = 0; at < text.size();) {
    size_t len = std::min(longest_piece_, text.size() - at);
    for (; len > 0; --len) {
      auto it = piece_ids_.find(text.substr(at, len));
      if (it != piece_ids_.end()) {
        split.push_back(it->second.front());
        break;
      }
    }
    if (len == 0) return {};  // a byte no token spells
    at += len;
  }
  return split;
}

absl::Status Rescorer::Feed(const std::vector<int32_t>& tokens, size_t from, size_t to, size_t first_logit,
                            const std::function<bool(size_t, const float*)>& row) {
  const size_t n_batch = llama_n_batch(ctx_);
  llama_batch batch = llama_batch_init(static_cast<int32_t>(n_batch), 0, 1);
  absl::Status status;
  for (size_t p = from; p < to && status.ok();) {
    batch.n_tokens = 0;
    size_t outputs = 0;
    const size_t start = p;
    for (; p < to && static_cast<size_t>(batch.n_tokens) < n_batch && outputs < kLogitRows; ++p) {
      const bool logits = p >= first_logit;
      AddToken(batch, tokens[p], static_cast<llama_pos>(p), logits);
      outputs += logits;
    }
    if (int rc = llama_decode(ctx_, batch); rc != 0) {
      status = absl::InternalError(absl::StrCat("llama_decode failed while re-scoring (code ", rc, ")"));
      break;
    }
    bool go_on = true;
    for (size_t q = start; q < p && go_on; ++q) {
      if (q < first_logit) continue;
      const float* logits = llama_get_logits_ith(ctx_, static_cast<int32_t>(q - start));
      if (logits == nullptr) {
        status = absl::InternalError("llama.cpp returned no logits while re-scoring");
        break;
      }
      go_on = !row || row(q, logits);
    }
    if (!go_on) break;
  }
  llama_batch_free(batch);
  return status;
}

absl::StatusOr<Rescorer::Scored> Rescorer::ScoreTarget(const std::vector<int32_t>& prompt, const Target& target,
                                                        const SamplingParams& sampling,
                                                        const rescore::Thresholds& thresholds) {
  Scored out;
  rescore::Evidence& evidence = out.evidence;
  const float temperature = sampling.temperature;
  const rescore::Transforms transforms = rescore::TransformsOf(sampling);
  const bool shaped = rescore::ShapesLogits(sampling);
  std::vector<float> shaped_row;
  const std::string& text = target.text;
  std::vector<int32_t> answer = Split(text);
  if (answer.empty() && !text.empty()) {
    evidence.structural_failure = "the answer's text holds bytes that no token of this model spells";
    return out;
  }
  const size_t n_prompt = prompt.size();
  auto sequence = [&] {
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), answer.begin(), answer.end());
    return seq;
  };
  // Where each answer token starts in the text.
  auto offset_of = [&](size_t i) {
    size_t offset = 0;
    for (size_t k = 0; k < i; ++k) offset += Piece(answer[k]).size();
    return offset;
  };
  auto is_end = [&](int32_t t) { return std::find(end_tokens_.begin(), end_tokens_.end(), t) != end_tokens_.end(); };
  // May token c come next at `offset`, spelling the text onwards?
  auto fits = [&](int32_t c, size_t offset) {
    if (is_end(c)) return false;
    const std::string& piece = Piece(c);
    const size_t left = text.size() - offset;
    if (piece.size() <= left) return text.compare(offset, piece.size(), piece) == 0;
    return target.overflow_ok && left > 0 && piece.compare(0, left, text, offset, left) == 0;
  };

  std::vector<int32_t> seq = sequence();
  if (seq.size() + 1 > static_cast<size_t>(llama_n_ctx(ctx_))) {
    return absl::ResourceExhaustedError(absl::StrCat("the prompt and answer are ", seq.size(),
                                                     " tokens; this verifier's context holds ", llama_n_ctx(ctx_)));
  }
  evidence.tokens.assign(answer.size(), {});
  llama_memory_t mem = llama_get_memory(ctx_);
  size_t start = n_prompt - 1;
  int resplits = 0;
  while (true) {
    llama_memory_seq_rm(mem, 0, static_cast<llama_pos>(start), -1);
    // The row at position p scores answer token p + 1 - n_prompt; the row after the last answer
    // token scores the end of generation, when the answer claims one.
    const size_t to = target.expect_end ? seq.size() : seq.size() - 1;
    size_t restart = 0;
    auto row = [&](size_t p, const float* raw) -> bool {
      const size_t i = p + 1 - n_prompt;
      // The logits the producer's chain saw: biased and penalised over the answer before token i.
      const float* logits = raw;
      if (shaped) {
        shaped_row.assign(raw, raw + n_vocab_);
        rescore::ShapeLogits(sampling, std::span<const int32_t>(answer.data(), std::min(i, answer.size())), shaped_row);
        logits = shaped_row.data();
      }
      if (i == answer.size()) {
        int32_t best = end_tokens_.empty() ? -1 : end_tokens_.front();
        for (int32_t t : end_tokens_) best = logits[t] > logits[best] ? t : best;
        evidence.end_token = rescore::ScoreLogits(logits, n_vocab_, best, transforms, thresholds);
        return true;
      }
      const int32_t claimed = answer[i];
      rescore::TokenScore score =
          rescore::ScoreLogits(logits, n_vocab_, claimed, transforms, thresholds);
      // The tokenizer's split stands unless its token here fails: a greedy answer's token far from
      // the argmax, a sampled answer's token the transforms exclude or that is below the floor.
      // Then the most likely token that spells the text on from here takes its place (a greedy
      // producer chose exactly that one). The verifier takes no freedom where the split passes,
      // so a forger gains nothing from it.
      const bool fails = temperature <= 0.0f ? score.gap > thresholds.gap_soft
                                             : score.excluded || score.logprob < thresholds.min_logprob;
      int32_t better = -1;
      if (fails && resplits < kMaxResplits) {
        // Among the model's favourites (which may reach past a stop string, or print nothing) and
        // among every token that prints a prefix of the rest (a flat distribution has its pick
        // far down).
        const size_t offset = offset_of(i);
        float best = logits[claimed] + static_cast<float>(thresholds.gap_soft);
        auto consider = [&](int32_t c) {
          if (c != claimed && logits[c] > best && fits(c, offset)) {
            best = logits[c];
            better = c;
          }
        };
        for (int32_t c : rescore::TopTokens(logits, n_vocab_, kCandidates)) consider(c);
        IndexPieces();
        const std::string_view left = std::string_view(text).substr(offset);
        for (size_t len = 1; len <= std::min(longest_piece_, left.size()); ++len) {
          auto it = piece_ids_.find(left.substr(0, len));
          if (it == piece_ids_.end()) continue;
          for (int32_t c : it->second) consider(c);
        }
        if (better >= 0) {
          const size_t after = offset + Piece(better).size();
          std::vector<int32_t> rest = after < text.size() ? Split(text.substr(after)) : std::vector<int32_t>{};
          if (after < text.size() && rest.empty()) better = -1;  // no split of the rest: keep this one
          if (better >= 0) {
            ++resplits;
            answer.resize(i);
            answer.push_back(better);
            answer.insert(answer.end(), rest.begin(), rest.end());
            evidence.tokens.resize(answer.size());
            score = rescore::ScoreLogits(logits, n_vocab_, better, transforms, thresholds);
          }
        }
      }
      evidence.tokens[i] = score;
      if (better >= 0) {
        restart = p + 1;  // answer token i's cells onwards are decoded again
        return false;
      }
      return true;
    };
    if (start < to) {
      if (auto status = Feed(seq, start, to, n_prompt - 1, row); !status.ok()) return status;
    }
    if (restart == 0) break;
    seq = sequence();
    if (seq.size() + 1 > static_cast<size_t>(llama_n_ctx(ctx_))) {
      return absl::ResourceExhaustedError("the re-split answer does not fit this verifier's context");
    }
    start = restart;
  }
  for (int32_t t : answer) out.empty_pieces += Piece(t).empty();
  out.resplits = resplits;
  evidence.counted_prompt_tokens = static_cast<int>(n_prompt);
  evidence.counted_completion_tokens = static_cast<int>(answer.size());
  return out;
}

absl::StatusOr<rescore::Verdict> Rescorer::CheckText(const InferenceRequest& request,
                                                     const rescore::ClaimedAnswer& claimed,
                                                     const rescore::Thresholds& thresholds) {
  if (auto status = EnsureContext(); !status.ok()) return status;
  // The rules score tokens under the record's logit_bias, penalties, top_k, top_p, min_p and
  // temperature (rescore::ShapeLogits, ScoreLogits). A grammar or JSON schema is not applied yet:
  // such a record is not judged (never failed).
  if (request.format.kind != OutputFormat::Kind::kText) {
    return absl::UnimplementedError(
        "re-scoring does not apply a grammar or JSON schema yet: the record is not checked");
  }
  for (const LogitBias& b : request.sampling.logit_bias) {
    if (b.token < 0 || b.token >= n_vocab_) {
      return Failed(absl::StrCat("the record's logit_bias names token ", b.token,
                                 ", outside the model's vocabulary, so no runner serves it; yet the answer claims a response"));
    }
  }
  auto prompt_text = engine_.PromptText(request);
  if (!prompt_text.ok()) {
    return Failed(absl::StrCat("the record cannot be served (", prompt_text.status().message(),
                               ") yet the answer claims a response"));
  }
  const std::vector<int32_t> prompt = engine_.Tokenize(*prompt_text, request.endpoint == Endpoint::kChatCompletions);
  if (prompt.empty()) return Failed("the record's prompt has no tokens, yet the answer claims a response");
  const auto& sampling = request.sampling;
  if (sampling.max_tokens && claimed.completion_tokens > *sampling.max_tokens) {
    return Failed(absl::StrCat("usage: completion_tokens claims ", claimed.completion_tokens,
                               "; the record allows at most max_tokens ", *sampling.max_tokens));
  }
  if (prompt.size() + 1 > static_cast<size_t>(llama_n_ctx(ctx_))) {
    return absl::ResourceExhaustedError(absl::StrCat("the prompt is ", prompt.size(),
                                                     " tokens; this verifier's context holds ", llama_n_ctx(ctx_)));
  }
  // The prompt's cells, all but its last token (whose row scores the first answer token), once
  // for every target.
  llama_memory_clear(llama_get_memory(ctx_), true);
  if (auto status = Feed(prompt, 0, prompt.size() - 1, prompt.size(), nullptr); !status.ok()) return status;

  std::vector<Target> targets;
  if (claimed.finish_reason == "length") {
    targets.push_back({claimed.text, false, false});
  } else {
    targets.push_back({claimed.text, true, false});
    for (const std::string& stop : sampling.stop) targets.push_back({claimed.text + stop, false, true});
  }
  std::optional<rescore::Verdict> first;
  for (const Target& target : targets) {
    auto scored = ScoreTarget(prompt, target, sampling, thresholds);
    if (!scored.ok()) return scored.status();
    rescore::Evidence& evidence = scored->evidence;
    evidence.greedy = sampling.temperature <= 0.0f;
    evidence.claimed_prompt_tokens = claimed.prompt_tokens;
    evidence.claimed_completion_tokens = claimed.completion_tokens;
    evidence.exact_completion_count = evidence.greedy;
    // Every generated token prints at least one byte, but for the few that print nothing, and
    // the last may reach past a stop string.
    int upper = static_cast<int>(target.text.size() + (target.overflow_ok ? 1 : 0) + scored->empty_pieces);
    if (sampling.max_tokens) upper = std::min(upper, *sampling.max_tokens);
    evidence.completion_upper_bound = upper;
    if (claimed.finish_reason == "length" && sampling.max_tokens) evidence.length_cap = *sampling.max_tokens;
    rescore::Verdict verdict = rescore::Decide(evidence, thresholds);
    verdict.resplits = scored->resplits;
    if (verdict.passed) return verdict;
    if (!first) first = std::move(verdict);
  }
  return *first;
}

absl::StatusOr<rescore::Verdict> Rescorer::CheckEmbeddings(const InferenceRequest& request,
                                                           const rescore::ClaimedAnswer& claimed,
                                                           const rescore::Thresholds& thresholds) {
  std::optional<WorkResult> result;
  engine_.Serve({WorkItem{"rescore", 0, request}}, [&](WorkResult r) { result = std::move(r); },
                [] { return false; });
  if (!result) return absl::InternalError("the engine gave no embedding to compare with");
  if (result->is_error) {
    return absl::FailedPreconditionError(absl::StrCat("this verifier cannot embed the record: ",
                                                      JsonString(OutputLineError(result->output), "message")));
  }
  auto recomputed = rescore::ParseClaimedAnswer(result->output);
  if (!recomputed.ok()) return recomputed.status();
  return rescore::DecideEmbeddings(claimed.embeddings, recomputed->embeddings, claimed.prompt_tokens,
                                   recomputed->prompt_tokens, thresholds);
}

absl::StatusOr<rescore::Verdict> Rescorer::Check(const std::string& record_line, const Json& output_line,
                                                 const rescore::Thresholds& thresholds) {
  const ParsedRecord parsed = ParseRecordLine(record_line);
  auto claimed = rescore::ParseClaimedAnswer(output_line);
  const std::string answered_id = JsonString(output_line, "custom_id");
  if (!parsed.ok()) {
    if (claimed.ok() && claimed->kind == rescore::ClaimedAnswer::Kind::kError) {
      rescore::Verdict verdict;
      verdict.passed = true;
      verdict.skipped = "the record is invalid and was answered with an error line";
      return verdict;
    }
    return Failed(absl::StrCat("the record is invalid (", parsed.error_message, ") yet the answer claims a response"));
  }
  if (answered_id != parsed.custom_id) {
    return Failed(absl::StrCat("the answer is for custom_id '", Excerpt(answered_id, 60), "', not '",
                               Excerpt(parsed.custom_id, 60), "'"));
  }
  const InferenceRequest& request = *parsed.request;
  // Tool calls and reasoning come from the model's own template, a tool-call grammar and a parser
  // that splits the text (chat_tools.h); the check does not replay those yet, so such a record is
  // not judged (never failed: an honest answer made only of tool calls has no text to score).
  if (engine_.RendersWithChatTemplate(request) &&
      !(claimed.ok() && claimed->kind == rescore::ClaimedAnswer::Kind::kError)) {
    return absl::UnimplementedError(
        "re-scoring does not replay a chat template's tool calls or reasoning yet: the record is not checked");
  }
  if (!claimed.ok()) return Failed(std::string(claimed.status().message()));
  switch (claimed->kind) {
    case rescore::ClaimedAnswer::Kind::kError: {
      rescore::Verdict verdict;
      verdict.passed = true;
      verdict.skipped = absl::StrCat("answered with an error line (",
                                     JsonString(OutputLineError(output_line), "code"), "): nothing to re-score");
      return verdict;
    }
    case rescore::ClaimedAnswer::Kind::kEmbeddings:
      if (request.endpoint != Endpoint::kEmbeddings) return Failed("an embedding answer to a generation record");
      return CheckEmbeddings(request, *claimed, thresholds);
    case rescore::ClaimedAnswer::Kind::kText:
      if (request.endpoint == Endpoint::kEmbeddings) return Failed("a text answer to an embedding record");
      return CheckText(request, *claimed, thresholds);
  }
  return Failed("unknown answer kind");
}

}  // namespace minions::llama_runner
