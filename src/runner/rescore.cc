#include "runner/rescore.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runner/batch_record.h"

namespace minions::rescore {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

absl::Status ReadNumber(const Json& json, const char* name, double min, double max, double* out) {
  auto it = json.find(name);
  if (it == json.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < min || it->get<double>() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("verification threshold ", name, " must be a number in [", min, ", ", max, "]"));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status ReadCount(const Json& json, const char* name, int min, int max, int* out) {
  auto it = json.find(name);
  if (it == json.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer() || it->get<int64_t>() < min || it->get<int64_t>() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("verification threshold ", name, " must be an integer in [", min, ", ", max, "]"));
  }
  *out = it->get<int>();
  return absl::OkStatus();
}

// JSON has no infinity: a -inf logprob travels as null.
Json Finite(double value) { return std::isfinite(value) ? Json(value) : Json(nullptr); }

std::string Nats(double value) { return absl::StrFormat("%.3g", value); }

}  // namespace

Json Thresholds::ToJson() const {
  return {{"top_k", top_k},           {"gap_hard", gap_hard},       {"gap_soft", gap_soft},
          {"soft_misses", soft_misses}, {"soft_fraction", soft_fraction}, {"min_logprob", min_logprob},
          {"max_sigmas", max_sigmas}, {"top_p_slack", top_p_slack}, {"min_cosine", min_cosine}};
}

absl::StatusOr<Thresholds> Thresholds::FromJson(const Json& json, const Thresholds& base) {
  Thresholds t = base;
  if (json.is_null()) return t;
  if (!json.is_object()) return absl::InvalidArgumentError("verification thresholds must be an object");
  for (const auto& [key, value] : json.items()) {
    if (!t.ToJson().contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown verification threshold '", Excerpt(key, 40), "'"));
    }
  }
  // The bounds keep a team from switching the check off: an override may loosen a threshold only
  // so far (a gap of 5 nats, a logprob of -50, 12 sigmas, a cosine of 0.9).
  absl::Status s;
  if (!(s = ReadCount(json, "top_k", 1, 1000, &t.top_k)).ok()) return s;
  if (!(s = ReadNumber(json, "gap_hard", 0.001, 5.0, &t.gap_hard)).ok()) return s;
  if (!(s = ReadNumber(json, "gap_soft", 0.0, 5.0, &t.gap_soft)).ok()) return s;
  if (!(s = ReadCount(json, "soft_misses", 0, 1000, &t.soft_misses)).ok()) return s;
  if (!(s = ReadNumber(json, "soft_fraction", 0.0, 0.5, &t.soft_fraction)).ok()) return s;
  if (!(s = ReadNumber(json, "min_logprob", -50.0, -1.0, &t.min_logprob)).ok()) return s;
  if (!(s = ReadNumber(json, "max_sigmas", 2.0, 12.0, &t.max_sigmas)).ok()) return s;
  if (!(s = ReadNumber(json, "top_p_slack", 0.0, 0.2, &t.top_p_slack)).ok()) return s;
  if (!(s = ReadNumber(json, "min_cosine", 0.9, 1.0, &t.min_cosine)).ok()) return s;
  if (t.gap_soft > t.gap_hard) {
    return absl::InvalidArgumentError("verification threshold gap_soft must not exceed gap_hard");
  }
  return t;
}

absl::StatusOr<Thresholds> Thresholds::FromJson(const Json& json) { return FromJson(json, Thresholds{}); }

std::vector<int32_t> TopTokens(const float* logits, int n_vocab, int k) {
  k = std::clamp(k, 0, n_vocab);
  std::vector<int32_t> ids(static_cast<size_t>(n_vocab));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  ids.resize(static_cast<size_t>(k));
  return ids;
}

TokenScore ScoreLogits(const float* logits, int n_vocab, int32_t token, float temperature, float top_p,
                       const Thresholds& thresholds) {
  return ScoreLogits(logits, n_vocab, token, Transforms{.temperature = temperature, .top_p = top_p}, thresholds);
}

Transforms TransformsOf(const SamplingParams& sampling) {
  return Transforms{.temperature = sampling.temperature, .top_k = sampling.top_k, .top_p = sampling.top_p,
                    .min_p = sampling.min_p};
}

bool ShapesLogits(const SamplingParams& sampling) {
  return !sampling.logit_bias.empty() || sampling.presence_penalty != 0 || sampling.frequency_penalty != 0 ||
         sampling.repeat_penalty != 1;
}

void ShapeLogits(const SamplingParams& sampling, std::span<const int32_t> history, std::vector<float>& row) {
  const int n_vocab = static_cast<int>(row.size());
  // llama_sampler_logit_bias: added to the logit; -100 forbids (runner/llama/record_sampler.cc).
  for (const LogitBias& b : sampling.logit_bias) {
    if (b.token < 0 || b.token >= n_vocab) continue;  // the producer's runner refused such a record
    row[static_cast<size_t>(b.token)] = b.bias <= -100.0f ? -INFINITY : row[static_cast<size_t>(b.token)] + b.bias;
  }
  if (sampling.presence_penalty == 0 && sampling.frequency_penalty == 0 && sampling.repeat_penalty == 1) return;
  // llama_sampler_penalties over the whole answer so far (its window is max_tokens): a token seen
  // `count` times has its logit divided by repeat_penalty (multiplied when <= 0), then lowered by
  // count * frequency_penalty + presence_penalty. The same float arithmetic, in the same order.
  std::map<int32_t, int> counts;
  for (int32_t t : history) ++counts[t];
  for (const auto& [t, count] : counts) {
    if (t < 0 || t >= n_vocab) continue;
    float& logit = row[static_cast<size_t>(t)];
    if (logit <= 0) {
      logit *= sampling.repeat_penalty;
    } else {
      logit /= sampling.repeat_penalty;
    }
    logit -= static_cast<float>(count) * sampling.frequency_penalty + static_cast<float>(count > 0) * sampling.presence_penalty;
  }
}

TokenScore ScoreLogits(const float* logits, int n_vocab, int32_t token, const Transforms& transforms,
                       const Thresholds& thresholds) {
  TokenScore score;
  score.token = token;
  if (token < 0 || token >= n_vocab) {
    score.rank = n_vocab;
    score.gap = std::numeric_limits<double>::infinity();
    score.logprob = kNegInf;
    score.excluded = true;
    return score;
  }
  const double claimed = logits[token];
  double max_logit = claimed;
  for (int i = 0; i < n_vocab; ++i) {
    max_logit = std::max(max_logit, static_cast<double>(logits[i]));
    score.rank += logits[i] > claimed;
  }
  score.gap = max_logit - claimed;
  double z1 = 0;
  for (int i = 0; i < n_vocab; ++i) z1 += std::exp(logits[i] - max_logit);
  if (transforms.temperature <= 0.0f) {
    score.logprob = (claimed - max_logit) - std::log(z1);
    return score;
  }
  // A token the biases forbid (-inf) cannot have been drawn.
  if (std::isinf(claimed)) {
    score.excluded = true;
    score.logprob = kNegInf;
    return score;
  }
  // What the chain keeps, stage by stage as llama.cpp applies them: top_k, top_p (its softmax at
  // temperature 1 over what top_k kept), min_p. Float noise moves every boundary, so a claimed
  // token just outside one is judged as if inside; one well outside is excluded.
  std::vector<char> kept(static_cast<size_t>(n_vocab), 1);
  std::vector<int32_t> order;
  if (transforms.top_k > 0 || transforms.top_p < 1.0f) {
    order.resize(static_cast<size_t>(n_vocab));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  }
  if (transforms.top_k > 0 && transforms.top_k < n_vocab) {
    const size_t k = static_cast<size_t>(transforms.top_k);
    for (size_t r = k; r < order.size(); ++r) kept[static_cast<size_t>(order[r])] = 0;
    if (!kept[static_cast<size_t>(token)]) {
      if (claimed < logits[order[k - 1]] - thresholds.gap_soft) score.excluded = true;
      kept[static_cast<size_t>(token)] = 1;
    }
  }
  if (transforms.top_p < 1.0f && !score.excluded) {
    // The nucleus: the most likely kept tokens until their mass reaches top_p (at least one).
    double z_kept = 0, above = 0;
    for (int i = 0; i < n_vocab; ++i) {
      if (!kept[static_cast<size_t>(i)]) continue;
      const double e = std::exp(logits[i] - max_logit);
      z_kept += e;
      if (logits[i] > claimed) above += e;
    }
    std::vector<char> nucleus(static_cast<size_t>(n_vocab), 0);
    double cumulative = 0;
    for (int32_t id : order) {
      if (!kept[static_cast<size_t>(id)]) continue;
      nucleus[static_cast<size_t>(id)] = 1;
      cumulative += std::exp(logits[id] - max_logit) / z_kept;
      if (cumulative >= transforms.top_p) break;
    }
    if (!nucleus[static_cast<size_t>(token)]) {
      if (above / z_kept >= transforms.top_p + thresholds.top_p_slack) score.excluded = true;
      nucleus[static_cast<size_t>(token)] = 1;
    }
    kept = std::move(nucleus);
  }
  if (transforms.min_p > 0.0f && !score.excluded) {
    // p_i >= min_p * p_max, i.e. logit_i >= max + log(min_p); the argmax is always kept.
    const double floor = max_logit + std::log(static_cast<double>(transforms.min_p));
    for (int i = 0; i < n_vocab; ++i) {
      if (logits[i] < floor) kept[static_cast<size_t>(i)] = 0;
    }
    if (claimed < floor) {
      if (claimed < floor - thresholds.gap_soft) score.excluded = true;
      kept[static_cast<size_t>(token)] = 1;
    }
  }
  if (score.excluded) {
    score.logprob = kNegInf;
    return score;
  }
  // The distribution the producer sampled from: softmax(logits / T) over what was kept.
  const double inv_t = 1.0 / transforms.temperature;
  double zt = 0, sum_lp = 0, sum_lp2 = 0;
  for (int i = 0; i < n_vocab; ++i) {
    if (kept[static_cast<size_t>(i)]) zt += std::exp((logits[i] - max_logit) * inv_t);
  }
  const double log_zt = std::log(zt);
  for (int i = 0; i < n_vocab; ++i) {
    if (!kept[static_cast<size_t>(i)] || std::isinf(logits[i])) continue;  // a forbidden token adds nothing
    const double lp = (logits[i] - max_logit) * inv_t - log_zt;
    const double p = std::exp(lp);
    sum_lp += p * lp;
    sum_lp2 += p * lp * lp;
  }
  score.entropy = -sum_lp;
  score.variance = std::max(0.0, sum_lp2 - sum_lp * sum_lp);
  score.logprob = (claimed - max_logit) * inv_t - log_zt;
  return score;
}

namespace {

// The greedy rules over one token; empty when it passes.
std::string GreedyMiss(const TokenScore& t, const Thresholds& th) {
  if (t.rank >= th.top_k) return absl::StrCat("is ranked ", t.rank + 1, ", outside the top ", th.top_k);
  if (t.gap > th.gap_hard) return absl::StrCat("is ", Nats(t.gap), " nats below the most likely token");
  return "";
}

std::string Describe(const Evidence& evidence, int index) {
  if (index == static_cast<int>(evidence.tokens.size())) return "the end of the answer";
  return absl::StrCat("answer token ", index);
}

}  // namespace

Verdict Decide(const Evidence& evidence, const Thresholds& th) {
  Verdict v;
  v.tokens_checked = static_cast<int>(evidence.tokens.size());
  v.counted_prompt_tokens = evidence.counted_prompt_tokens;
  v.counted_completion_tokens = evidence.counted_completion_tokens;
  auto fail = [&](std::string reason, int token = -1) {
    v.passed = false;
    v.reason = std::move(reason);
    v.failed_token = token;
    return v;
  };
  if (!evidence.structural_failure.empty()) return fail(evidence.structural_failure);

  // Every scored token, and the end-of-generation token last when the answer claims one.
  std::vector<const TokenScore*> scored;
  for (const TokenScore& t : evidence.tokens) scored.push_back(&t);
  if (evidence.end_token) scored.push_back(&*evidence.end_token);

  if (evidence.greedy) {
    int soft = 0;
    int first_soft = -1;
    for (size_t i = 0; i < scored.size(); ++i) {
      const TokenScore& t = *scored[i];
      v.max_gap = std::max(v.max_gap, t.gap);
      v.max_rank = std::max(v.max_rank, t.rank);
      if (std::string miss = GreedyMiss(t, th); !miss.empty()) {
        return fail(absl::StrCat("greedy: ", Describe(evidence, static_cast<int>(i)), " ", miss),
                    static_cast<int>(i));
      }
      if (t.gap > th.gap_soft && soft++ == 0) first_soft = static_cast<int>(i);
    }
    const double allowed = std::max<double>(th.soft_misses, th.soft_fraction * static_cast<double>(scored.size()));
    if (soft > allowed) {
      return fail(absl::StrCat("greedy: ", soft, " tokens are more than ", Nats(th.gap_soft),
                               " nats below the most likely one (at most ", allowed, " allowed)"),
                  first_soft);
    }
  } else {
    double sum_lp = 0, expected = 0, variance = 0;
    v.min_logprob = 0;
    for (size_t i = 0; i < scored.size(); ++i) {
      const TokenScore& t = *scored[i];
      v.min_logprob = std::min(v.min_logprob, t.logprob);
      v.max_rank = std::max(v.max_rank, t.rank);
      if (t.excluded) {
        return fail(absl::StrCat("sampled: ", Describe(evidence, static_cast<int>(i)),
                                 " lies outside what the record's sampling allows (top_k, top_p, min_p, logit_bias)"),
                    static_cast<int>(i));
      }
      if (t.logprob < th.min_logprob) {
        return fail(absl::StrCat("sampled: ", Describe(evidence, static_cast<int>(i)), " has log-probability ",
                                 Nats(t.logprob), ", below the floor of ", Nats(th.min_logprob)),
                    static_cast<int>(i));
      }
      sum_lp += t.logprob;
      expected -= t.entropy;
      variance += t.variance;
    }
    if (variance > 0) {
      v.sigmas = (sum_lp - expected) / std::sqrt(variance);
      if (v.sigmas < -th.max_sigmas) {
        return fail(absl::StrFormat("sampled: the answer's log-likelihood %.1f is %.1f standard deviations below "
                                    "the %.1f honest draws give (at most %.1f allowed)",
                                    sum_lp, -v.sigmas, expected, th.max_sigmas));
      }
    }
  }

  if (evidence.claimed_prompt_tokens != evidence.counted_prompt_tokens) {
    return fail(absl::StrCat("usage: prompt_tokens claims ", evidence.claimed_prompt_tokens, ", the verifier counts ",
                             evidence.counted_prompt_tokens));
  }
  const int claimed = evidence.claimed_completion_tokens;
  if (evidence.exact_completion_count && claimed != evidence.counted_completion_tokens) {
    return fail(absl::StrCat("usage: completion_tokens claims ", claimed, ", the verifier counts ",
                             evidence.counted_completion_tokens));
  }
  if (!evidence.exact_completion_count) {
    if (claimed < (evidence.counted_completion_tokens > 0 ? 1 : 0) || claimed > evidence.completion_upper_bound) {
      return fail(absl::StrCat("usage: completion_tokens claims ", claimed, "; an answer of this text has between ",
                               evidence.counted_completion_tokens > 0 ? 1 : 0, " and ",
                               evidence.completion_upper_bound));
    }
  }
  if (evidence.length_cap && claimed != *evidence.length_cap) {
    return fail(absl::StrCat("usage: the answer claims it stopped at its length limit of ", *evidence.length_cap,
                             " tokens after ", claimed));
  }
  v.passed = true;
  return v;
}

double Cosine(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return 0;
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    na += static_cast<double>(a[i]) * a[i];
    nb += static_cast<double>(b[i]) * b[i];
  }
  if (na <= 0 || nb <= 0) return 0;
  return dot / std::sqrt(na * nb);
}

Verdict DecideEmbeddings(const std::vector<std::vector<float>>& claimed,
                         const std::vector<std::vector<float>>& recomputed, int claimed_prompt_tokens,
                         int counted_prompt_tokens, const Thresholds& th) {
  Verdict v;
  v.counted_prompt_tokens = counted_prompt_tokens;
  v.tokens_checked = static_cast<int>(recomputed.size());
  if (claimed.size() != recomputed.size()) {
    v.reason = absl::StrCat("embeddings: the answer has ", claimed.size(), " vectors for ", recomputed.size(),
                            " inputs");
    return v;
  }
  for (size_t i = 0; i < claimed.size(); ++i) {
    if (claimed[i].size() != recomputed[i].size()) {
      v.reason = absl::StrCat("embeddings: vector ", i, " has ", claimed[i].size(), " dimensions; the model gives ",
                              recomputed[i].size());
      v.failed_token = static_cast<int>(i);
      return v;
    }
    const double cosine = Cosine(claimed[i], recomputed[i]);
    v.min_cosine = std::min(v.min_cosine, cosine);
    if (!(cosine >= th.min_cosine)) {
      v.reason = absl::StrFormat("embeddings: vector %d has cosine %.6f with the recomputed one (at least %.6f needed)",
                                 static_cast<int>(i), cosine, th.min_cosine);
      v.failed_token = static_cast<int>(i);
      return v;
    }
  }
  if (claimed_prompt_tokens != counted_prompt_tokens) {
    v.reason = absl::StrCat("usage: prompt_tokens claims ", claimed_prompt_tokens, ", the verifier counts ",
                            counted_prompt_tokens);
    return v;
  }
  v.passed = true;
  return v;
}

Json Verdict::ToJson() const {
  Json json = {{"passed", passed},
               {"tokens_checked", tokens_checked},
               {"max_gap", Finite(max_gap)},
               {"max_rank", max_rank},
               {"min_logprob", Finite(min_logprob)},
               {"sigmas", Finite(sigmas)},
               {"min_cosine", Finite(min_cosine)},
               {"counted_prompt_tokens", counted_prompt_tokens},
               {"counted_completion_tokens", counted_completion_tokens},
               {"resplits", resplits}};
  if (!reason.empty()) json["reason"] = reason;
  if (!skipped.empty()) json["skipped"] = skipped;
  if (failed_token >= 0) json["failed_token"] = failed_token;
  return json;
}

Verdict Verdict::FromJson(const Json& json) {
  Verdict v;
  v.passed = JsonBool(json, "passed");
  v.reason = JsonString(json, "reason");
  v.skipped = JsonString(json, "skipped");
  v.failed_token = static_cast<int>(JsonInt(json, "failed_token", -1));
  v.tokens_checked = static_cast<int>(JsonInt(json, "tokens_checked"));
  v.max_gap = JsonDouble(json, "max_gap");
  v.max_rank = static_cast<int>(JsonInt(json, "max_rank"));
  v.min_logprob = JsonField(json, "min_logprob").is_null() ? kNegInf : JsonDouble(json, "min_logprob");
  v.sigmas = JsonDouble(json, "sigmas");
  v.min_cosine = JsonDouble(json, "min_cosine", 1);
  v.counted_prompt_tokens = static_cast<int>(JsonInt(json, "counted_prompt_tokens"));
  v.counted_completion_tokens = static_cast<int>(JsonInt(json, "counted_completion_tokens"));
  v.resplits = static_cast<int>(JsonInt(json, "resplits"));
  return v;
}

absl::StatusOr<ClaimedAnswer> ParseClaimedAnswer(const Json& line) {
  ClaimedAnswer answer;
  if (!line.is_object()) return absl::InvalidArgumentError("the output line is not a JSON object");
  const Json& response = JsonField(line, "response");
  if (response.is_null()) {
    if (!JsonField(line, "error").is_object()) {
      return absl::InvalidArgumentError("the output line has neither a response nor an error");
    }
    answer.kind = ClaimedAnswer::Kind::kError;
    return answer;
  }
  // A refused request is answered as OpenAI's batch output has it (a 400 with an error body).
  if (IsErrorOutputLine(line) && JsonField(JsonField(response, "body"), "error").is_object()) {
    answer.kind = ClaimedAnswer::Kind::kError;
    return answer;
  }
  const Json& body = JsonField(response, "body");
  if (!body.is_object()) return absl::InvalidArgumentError("the output line's response has no body object");
  const Json& usage = JsonField(body, "usage");
  auto count = [&](const char* name, bool required, int* out) -> absl::Status {
    const Json& value = JsonField(usage, name);
    if (value.is_null() && !required) return absl::OkStatus();
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > (int64_t{1} << 30)) {
      return absl::InvalidArgumentError(absl::StrCat("the output line's usage.", name, " is not a token count"));
    }
    *out = value.get<int>();
    return absl::OkStatus();
  };
  if (JsonString(body, "object") == "list") {
    answer.kind = ClaimedAnswer::Kind::kEmbeddings;
    const Json& data = JsonField(body, "data");
    if (!data.is_array()) return absl::InvalidArgumentError("the embedding answer has no data array");
    answer.embeddings.resize(data.size());
    for (const Json& entry : data) {
      const int64_t index = JsonInt(entry, "index", -1);
      const Json& vector = JsonField(entry, "embedding");
      if (index < 0 || static_cast<size_t>(index) >= data.size() || !vector.is_array() ||
          !answer.embeddings[static_cast<size_t>(index)].empty()) {
        return absl::InvalidArgumentError("the embedding answer's data entries are not indexed 0..n-1 with vectors");
      }
      auto& out = answer.embeddings[static_cast<size_t>(index)];
      for (const Json& x : vector) {
        if (!x.is_number()) return absl::InvalidArgumentError("an embedding holds something other than numbers");
        out.push_back(x.get<float>());
      }
    }
    if (auto s = count("prompt_tokens", true, &answer.prompt_tokens); !s.ok()) return s;
    return answer;
  }
  const Json& choices = JsonField(body, "choices");
  if (!choices.is_array() || choices.size() != 1 || !choices[0].is_object()) {
    return absl::InvalidArgumentError("the answer must have exactly one choice");
  }
  const Json& choice = choices[0];
  const Json& text = choice.contains("message") ? JsonField(JsonField(choice, "message"), "content")
                                                : JsonField(choice, "text");
  if (!text.is_string()) return absl::InvalidArgumentError("the answer's choice has no text");
  answer.kind = ClaimedAnswer::Kind::kText;
  answer.text = text.get<std::string>();
  answer.finish_reason = JsonString(choice, "finish_reason");
  if (answer.finish_reason != "stop" && answer.finish_reason != "length") {
    return absl::InvalidArgumentError(
        absl::StrCat("the answer's finish_reason '", Excerpt(answer.finish_reason, 40), "' is not stop or length"));
  }
  if (auto s = count("prompt_tokens", true, &answer.prompt_tokens); !s.ok()) return s;
  if (auto s = count("completion_tokens", true, &answer.completion_tokens); !s.ok()) return s;
  return answer;
}

std::string EncodeRequest(const Request& request) {
  Json items = Json::array();
  for (const Item& item : request.items) items.push_back({{"record", item.record}, {"output", item.output}});
  return DumpJson({{"op", "rescore"},
                   {"batch", request.batch},
                   {"items", std::move(items)},
                   {"thresholds", request.thresholds.ToJson()}}) +
         "\n";
}

absl::StatusOr<Request> RequestFromJson(const Json& json) {
  Request request;
  if (!json.contains("batch") || !json["batch"].is_string()) {
    return absl::InvalidArgumentError("rescore needs a string \"batch\" id");
  }
  request.batch = json["batch"].get<std::string>();
  const Json& items = JsonField(json, "items");
  if (!items.is_array()) return absl::InvalidArgumentError("rescore needs \"items\": an array of {record, output}");
  if (items.size() > kMaxItems) {
    return absl::InvalidArgumentError(absl::StrCat("rescore takes at most ", kMaxItems, " items, not ", items.size()));
  }
  for (const Json& entry : items) {
    const Json& record = JsonField(entry, "record");
    const Json& output = JsonField(entry, "output");
    if (!(record.is_string() || record.is_object()) || !output.is_object()) {
      return absl::InvalidArgumentError("each rescore item needs \"record\" (an input line) and \"output\" (an object)");
    }
    request.items.push_back({record.is_string() ? record.get<std::string>() : DumpJson(record), output});
  }
  auto thresholds = Thresholds::FromJson(JsonField(json, "thresholds"));
  if (!thresholds.ok()) return thresholds.status();
  request.thresholds = *thresholds;
  return request;
}

std::string EncodeVerdict(const std::string& batch, size_t index, const std::string& custom_id,
                          const Verdict& verdict) {
  return DumpJson({{"type", "verdict"},
                   {"batch", batch},
                   {"index", index},
                   {"custom_id", custom_id},
                   {"verdict", verdict.ToJson()}}) +
         "\n";
}

std::string EncodeUncheckable(const std::string& batch, size_t index, const std::string& custom_id,
                              const std::string& message) {
  return DumpJson({{"type", "verdict"}, {"batch", batch}, {"index", index}, {"custom_id", custom_id},
                   {"error", message}}) +
         "\n";
}

}  // namespace minions::rescore
