// The pure part of verification by re-scoring (runner/rescore.h): per-token statistics from
// logits, the decision rules, the thresholds a team may override, the answer parser and the
// `rescore` protocol message. The engine side is tested in tests/llama/rescore_test.cc.
#include "runner/rescore.h"

#include <cmath>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runner/batch_record.h"
#include "runner/protocol.h"

namespace minions::rescore {
namespace {

using ::testing::HasSubstr;

TokenScore Greedy(double gap, int rank = 0) {
  TokenScore t;
  t.gap = gap;
  t.rank = rank;
  return t;
}

Evidence GreedyEvidence(std::vector<TokenScore> tokens) {
  Evidence e;
  e.greedy = true;
  e.tokens = std::move(tokens);
  e.claimed_prompt_tokens = e.counted_prompt_tokens = 5;
  e.claimed_completion_tokens = e.counted_completion_tokens = static_cast<int>(e.tokens.size());
  return e;
}

TEST(RescoreScore, GreedyGapAndRankComeFromRawLogits) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.5f, -1.0f};
  TokenScore top = ScoreLogits(logits.data(), 4, 1, 0.0f, 1.0f, {});
  EXPECT_EQ(top.rank, 0);
  EXPECT_DOUBLE_EQ(top.gap, 0.0);
  TokenScore third = ScoreLogits(logits.data(), 4, 0, 0.0f, 1.0f, {});
  EXPECT_EQ(third.rank, 2);
  EXPECT_NEAR(third.gap, 2.0, 1e-9);
  double z = std::exp(1.0) + std::exp(3.0) + std::exp(2.5) + std::exp(-1.0);
  EXPECT_NEAR(third.logprob, 1.0 - std::log(z), 1e-9);
}

TEST(RescoreScore, OutOfVocabularyTokenIsExcluded) {
  const std::vector<float> logits = {0.0f, 0.0f};
  TokenScore t = ScoreLogits(logits.data(), 2, 7, 1.0f, 1.0f, {});
  EXPECT_TRUE(t.excluded);
  EXPECT_TRUE(std::isinf(t.logprob));
  EXPECT_FALSE(Decide(GreedyEvidence({t}), {}).passed);
}

TEST(RescoreScore, SampledUsesTemperatureAndEntropy) {
  const std::vector<float> uniform(8, 0.5f);
  TokenScore u = ScoreLogits(uniform.data(), 8, 3, 0.7f, 1.0f, {});
  EXPECT_NEAR(u.logprob, -std::log(8.0), 1e-9);
  EXPECT_NEAR(u.entropy, std::log(8.0), 1e-9);
  EXPECT_NEAR(u.variance, 0.0, 1e-9);
  const std::vector<float> logits = {2.0f, 0.0f};
  TokenScore t = ScoreLogits(logits.data(), 2, 1, 0.5f, 1.0f, {});
  // softmax([4, 0]) at temperature 0.5
  EXPECT_NEAR(t.logprob, -std::log(1 + std::exp(4.0)), 1e-9);
}

TEST(RescoreScore, TopPExcludesTheTailButToleratesTheBoundary) {
  // probabilities about 0.6, 0.3, 0.1 (temperature 1)
  const std::vector<float> logits = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  TokenScore inside = ScoreLogits(logits.data(), 3, 1, 1.0f, 0.85f, {});
  EXPECT_FALSE(inside.excluded);
  EXPECT_NEAR(inside.logprob, std::log(0.3 / 0.9), 1e-6);  // renormalised over the nucleus
  TokenScore tail = ScoreLogits(logits.data(), 3, 2, 1.0f, 0.85f, {});
  EXPECT_TRUE(tail.excluded);
  // The mass above the tail token is 0.9: just past top_p = 0.89, inside the default slack.
  TokenScore boundary = ScoreLogits(logits.data(), 3, 2, 1.0f, 0.89f, {});
  EXPECT_FALSE(boundary.excluded);
  EXPECT_TRUE(std::isfinite(boundary.logprob));
}

// Token `token` of `logits` scored under `t` is kept, with `logprob` (renormalised over the kept tokens).
void ExpectKept(const std::vector<float>& logits, int token, const Transforms& t, double logprob) {
  TokenScore score = ScoreLogits(logits.data(), static_cast<int>(logits.size()), token, t, {});
  EXPECT_FALSE(score.excluded) << "token " << token;
  EXPECT_NEAR(score.logprob, logprob, 1e-6) << "token " << token;
}

TEST(RescoreScore, TopKKeepsTheKMostLikelyAndToleratesATieAtItsEdge) {
  // probabilities 0.5, 0.3, 0.2: top_k 2 renormalises over the first two.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Transforms t{.temperature = 1.0f, .top_k = 2};
  ExpectKept(logits, 1, t, std::log(0.3 / 0.8));
  TokenScore third = ScoreLogits(logits.data(), 3, 2, t, {});
  EXPECT_TRUE(third.excluded);
  EXPECT_TRUE(std::isinf(third.logprob));
  // Within gap_soft of the k-th token, float noise may have ordered them either way.
  const std::vector<float> near = {std::log(0.5f), std::log(0.25f), std::log(0.25f) - 0.01f};
  EXPECT_FALSE(ScoreLogits(near.data(), 3, 2, t, {}).excluded);
  // Greedy answers ignore top_k, as the producer's chain does.
  EXPECT_EQ(ScoreLogits(logits.data(), 3, 0, Transforms{.temperature = 0.0f, .top_k = 1}, {}).rank, 0);
}

TEST(RescoreScore, MinPDropsTokensFarBelowTheMostLikely) {
  // probabilities 0.6, 0.3, 0.1: min_p 0.2 keeps p >= 0.12.
  const std::vector<float> logits = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  Transforms t{.temperature = 1.0f, .min_p = 0.2f};
  ExpectKept(logits, 1, t, std::log(0.3 / 0.9));
  EXPECT_TRUE(ScoreLogits(logits.data(), 3, 2, t, {}).excluded);
  // min_p 0.17 keeps p >= 0.102: 0.1 is 0.02 nats short, inside gap_soft.
  EXPECT_FALSE(ScoreLogits(logits.data(), 3, 2, Transforms{.temperature = 1.0f, .min_p = 0.17f}, {}).excluded);
}

TEST(RescoreScore, StagesApplyInTheChainsOrder) {
  // top_k 3 keeps 0.4 0.3 0.2 (of 0.4 0.3 0.2 0.1); top_p 0.7 then takes 0.4/0.9 + 0.3/0.9 = 0.78.
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  Transforms t{.temperature = 1.0f, .top_k = 3, .top_p = 0.7f};
  TokenScore second = ScoreLogits(logits.data(), 4, 1, t, {});
  EXPECT_FALSE(second.excluded);
  EXPECT_NEAR(second.logprob, std::log(0.3 / 0.7), 1e-6);
  EXPECT_TRUE(ScoreLogits(logits.data(), 4, 2, t, {}).excluded);
}

TEST(RescoreShape, BiasesAndPenaltiesAreTheProducersArithmetic) {
  SamplingParams sampling;
  sampling.logit_bias = {{2, 1.5f}, {3, -100.0f}};
  sampling.repeat_penalty = 1.5f;
  sampling.frequency_penalty = 0.5f;
  sampling.presence_penalty = 0.25f;
  EXPECT_TRUE(ShapesLogits(sampling));
  EXPECT_FALSE(ShapesLogits(SamplingParams{}));
  std::vector<float> row = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f};
  const std::vector<int32_t> history = {0, 0, 1};
  ShapeLogits(sampling, history, row);
  EXPECT_FLOAT_EQ(row[0], 2.0f / 1.5f - 2 * 0.5f - 0.25f);  // seen twice, positive: divided
  EXPECT_FLOAT_EQ(row[1], -1.0f * 1.5f - 0.5f - 0.25f);     // seen once, negative: multiplied
  EXPECT_FLOAT_EQ(row[2], 2.0f);                            // biased, never seen
  EXPECT_TRUE(std::isinf(row[3]) && row[3] < 0);            // -100 forbids
  EXPECT_FLOAT_EQ(row[4], 0.0f);
}

TEST(RescoreShape, AForbiddenTokenFailsGreedyAndSampledAnswers) {
  SamplingParams sampling;
  sampling.logit_bias = {{1, -100.0f}};
  std::vector<float> row = {1.0f, 3.0f, 2.0f};  // token 1 was the raw argmax
  ShapeLogits(sampling, {}, row);
  TokenScore greedy = ScoreLogits(row.data(), 3, 1, Transforms{.temperature = 0.0f}, {});
  EXPECT_FALSE(Decide(GreedyEvidence({greedy}), {}).passed);
  EXPECT_EQ(ScoreLogits(row.data(), 3, 2, Transforms{.temperature = 0.0f}, {}).rank, 0);  // the new argmax
  TokenScore sampled = ScoreLogits(row.data(), 3, 1, Transforms{.temperature = 1.0f}, {});
  EXPECT_TRUE(sampled.excluded);
  Evidence e = GreedyEvidence({sampled});
  e.greedy = false;
  Verdict v = Decide(e, {});
  EXPECT_FALSE(v.passed);
  EXPECT_THAT(v.reason, HasSubstr("logit_bias"));
  // The others' distribution leaves the forbidden token out, without NaN.
  TokenScore other = ScoreLogits(row.data(), 3, 2, Transforms{.temperature = 1.0f}, {});
  EXPECT_NEAR(other.logprob, 2.0 - std::log(std::exp(1.0) + std::exp(2.0)), 1e-6);
  EXPECT_TRUE(std::isfinite(other.entropy));
}

TEST(RescoreScore, TopTokensAreMostLikelyFirst) {
  const std::vector<float> logits = {0.1f, 5.0f, 3.0f, 4.0f};
  EXPECT_EQ(TopTokens(logits.data(), 4, 3), (std::vector<int32_t>{1, 3, 2}));
  EXPECT_EQ(TopTokens(logits.data(), 4, 10).size(), 4u);
}

TEST(RescoreDecide, HonestGreedyAnswerPasses) {
  Verdict v = Decide(GreedyEvidence({Greedy(0), Greedy(0), Greedy(0.01, 1), Greedy(0)}), {});
  EXPECT_TRUE(v.passed) << v.reason;
  EXPECT_EQ(v.tokens_checked, 4);
  EXPECT_NEAR(v.max_gap, 0.01, 1e-12);
  EXPECT_EQ(v.max_rank, 1);
}

TEST(RescoreDecide, GreedyTokenFarFromTheArgmaxFails) {
  Verdict v = Decide(GreedyEvidence({Greedy(0), Greedy(0), Greedy(1.5, 1), Greedy(0)}), {});
  EXPECT_FALSE(v.passed);
  EXPECT_EQ(v.failed_token, 2);
  EXPECT_THAT(v.reason, HasSubstr("answer token 2"));
}

TEST(RescoreDecide, GreedyTokenOutsideTopKFails) {
  Thresholds th;
  th.top_k = 3;
  Verdict v = Decide(GreedyEvidence({Greedy(0), Greedy(0.01, 3)}), th);
  EXPECT_FALSE(v.passed);
  EXPECT_THAT(v.reason, HasSubstr("outside the top 3"));
}

TEST(RescoreDecide, TooManySoftMissesFail) {
  std::vector<TokenScore> tokens(20, Greedy(0));
  tokens[3] = tokens[7] = Greedy(0.2, 1);
  EXPECT_TRUE(Decide(GreedyEvidence(tokens), {}).passed);  // two allowed
  tokens[11] = Greedy(0.2, 1);
  Verdict v = Decide(GreedyEvidence(tokens), {});
  EXPECT_FALSE(v.passed);
  EXPECT_EQ(v.failed_token, 3);
}

TEST(RescoreDecide, AnAnswerThatStopsWhereTheModelWouldGoOnFails) {
  Evidence e = GreedyEvidence({Greedy(0), Greedy(0)});
  e.end_token = Greedy(4.0, 12);
  Verdict v = Decide(e, {});
  EXPECT_FALSE(v.passed);
  EXPECT_THAT(v.reason, HasSubstr("the end of the answer"));
  e.end_token = Greedy(0);
  EXPECT_TRUE(Decide(e, {}).passed);
}

TEST(RescoreDecide, UsageClaimsMustMatch) {
  Evidence e = GreedyEvidence({Greedy(0), Greedy(0)});
  e.claimed_prompt_tokens = 999999;
  Verdict v = Decide(e, {});
  EXPECT_FALSE(v.passed);
  EXPECT_THAT(v.reason, HasSubstr("prompt_tokens claims 999999"));
  e = GreedyEvidence({Greedy(0), Greedy(0)});
  e.claimed_completion_tokens = 3;
  EXPECT_THAT(Decide(e, {}).reason, HasSubstr("completion_tokens claims 3, the verifier counts 2"));
  e = GreedyEvidence({Greedy(0), Greedy(0)});
  e.length_cap = 16;
  EXPECT_THAT(Decide(e, {}).reason, HasSubstr("length limit of 16"));
}

TEST(RescoreDecide, SampledUsageMayDifferInSplitButNotBeyondTheText) {
  Evidence e;
  e.greedy = false;
  e.tokens.assign(3, {});
  e.claimed_prompt_tokens = e.counted_prompt_tokens = 4;
  e.exact_completion_count = false;
  e.counted_completion_tokens = 3;
  e.completion_upper_bound = 12;
  e.claimed_completion_tokens = 5;  // another split of the same text
  EXPECT_TRUE(Decide(e, {}).passed);
  e.claimed_completion_tokens = 999999;
  EXPECT_FALSE(Decide(e, {}).passed);
  e.claimed_completion_tokens = 0;
  EXPECT_FALSE(Decide(e, {}).passed);
}

// Draws honest answers from fixed distributions and a forger's answers uniformly.
struct Simulated {
  std::vector<std::vector<float>> rows;
  std::vector<int32_t> honest, forged;
};
Simulated Simulate(int n_tokens, int n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 3.0f);
  Simulated s;
  for (int i = 0; i < n_tokens; ++i) {
    std::vector<float> row(static_cast<size_t>(n_vocab));
    for (float& x : row) x = noise(rng);
    std::vector<double> p(row.begin(), row.end());
    for (double& x : p) x = std::exp(x);
    std::discrete_distribution<int32_t> draw(p.begin(), p.end());
    s.honest.push_back(draw(rng));
    s.forged.push_back(std::uniform_int_distribution<int32_t>(0, n_vocab - 1)(rng));
    s.rows.push_back(std::move(row));
  }
  return s;
}

Evidence SampledEvidence(const Simulated& s, const std::vector<int32_t>& tokens, const Thresholds& th) {
  Evidence e;
  e.greedy = false;
  for (size_t i = 0; i < tokens.size(); ++i) {
    e.tokens.push_back(ScoreLogits(s.rows[i].data(), static_cast<int>(s.rows[i].size()), tokens[i], 1.0f, 1.0f, th));
  }
  e.claimed_completion_tokens = e.counted_completion_tokens = static_cast<int>(tokens.size());
  return e;
}

TEST(RescoreDecide, HonestSampledDrawsPassAndForgedOnesFail) {
  const Thresholds th;
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    Simulated s = Simulate(64, 200, seed);
    Verdict honest = Decide(SampledEvidence(s, s.honest, th), th);
    EXPECT_TRUE(honest.passed) << "seed " << seed << ": " << honest.reason;
    Verdict forged = Decide(SampledEvidence(s, s.forged, th), th);
    EXPECT_FALSE(forged.passed) << "seed " << seed;
  }
}

TEST(RescoreDecide, SampledTokenBelowTheFloorFails) {
  Evidence e;
  e.greedy = false;
  TokenScore t;
  t.logprob = -30;
  e.tokens = {TokenScore{}, t};
  Verdict v = Decide(e, {});
  EXPECT_FALSE(v.passed);
  EXPECT_EQ(v.failed_token, 1);
  EXPECT_THAT(v.reason, HasSubstr("below the floor"));
}

TEST(RescoreDecide, StructuralFailureWins) {
  Evidence e = GreedyEvidence({Greedy(0)});
  e.structural_failure = "bytes no token spells";
  EXPECT_EQ(Decide(e, {}).reason, "bytes no token spells");
}

TEST(RescoreThresholds, TeamsOverrideWithinBounds) {
  auto t = Thresholds::FromJson(Json{{"gap_hard", 2.0}, {"top_k", 20}});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->gap_hard, 2.0);
  EXPECT_EQ(t->top_k, 20);
  EXPECT_EQ(t->gap_soft, Thresholds{}.gap_soft);
  // A team cannot switch the check off.
  EXPECT_FALSE(Thresholds::FromJson(Json{{"gap_hard", 1e9}}).ok());
  EXPECT_FALSE(Thresholds::FromJson(Json{{"min_cosine", 0.0}}).ok());
  EXPECT_FALSE(Thresholds::FromJson(Json{{"min_logprob", -1e6}}).ok());
  EXPECT_FALSE(Thresholds::FromJson(Json{{"top_k", 0}}).ok());
  EXPECT_FALSE(Thresholds::FromJson(Json{{"gap_soft", 2.0}}).ok());  // above gap_hard
  EXPECT_THAT(std::string(Thresholds::FromJson(Json{{"gapp", 1}}).status().message()),
              HasSubstr("unknown verification threshold"));
  EXPECT_FALSE(Thresholds::FromJson(Json::array()).ok());
  auto round = Thresholds::FromJson(Thresholds{}.ToJson());
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(round->ToJson(), Thresholds{}.ToJson());
}

TEST(RescoreEmbeddings, RecomputedVectorsMustAgree) {
  const std::vector<std::vector<float>> v = {{0.6f, 0.8f}, {1.0f, 0.0f}};
  EXPECT_TRUE(DecideEmbeddings(v, v, 7, 7, {}).passed);
  auto perturbed = v;
  perturbed[1] = {0.8f, 0.6f};
  Verdict bad = DecideEmbeddings(perturbed, v, 7, 7, {});
  EXPECT_FALSE(bad.passed);
  EXPECT_EQ(bad.failed_token, 1);
  EXPECT_FALSE(DecideEmbeddings({v[0]}, v, 7, 7, {}).passed);
  EXPECT_FALSE(DecideEmbeddings({{0.6f, 0.8f, 0.0f}, v[1]}, v, 7, 7, {}).passed);
  EXPECT_THAT(DecideEmbeddings(v, v, 70, 7, {}).reason, HasSubstr("prompt_tokens"));
  std::vector<std::vector<float>> nan = {{NAN, 0.0f}, v[1]};
  EXPECT_FALSE(DecideEmbeddings(nan, v, 7, 7, {}).passed);
}

TEST(RescoreAnswer, ParsesCompletionChatEmbeddingAndErrorLines) {
  Usage usage{3, 2};
  auto completion = ParseClaimedAnswer(MakeResponseLine("a", MakeCompletionBody("a", "m", "hi", "stop", usage, 0)));
  ASSERT_TRUE(completion.ok()) << completion.status();
  EXPECT_EQ(completion->kind, ClaimedAnswer::Kind::kText);
  EXPECT_EQ(completion->text, "hi");
  EXPECT_EQ(completion->prompt_tokens, 3);
  EXPECT_EQ(completion->completion_tokens, 2);
  auto chat = ParseClaimedAnswer(MakeResponseLine("a", MakeChatCompletionBody("a", "m", "yo", "length", usage, 0)));
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->text, "yo");
  EXPECT_EQ(chat->finish_reason, "length");
  auto embedding = ParseClaimedAnswer(MakeResponseLine("e", MakeEmbeddingBody("m", {{1, 0}, {0, 1}}, 4)));
  ASSERT_TRUE(embedding.ok()) << embedding.status();
  EXPECT_EQ(embedding->kind, ClaimedAnswer::Kind::kEmbeddings);
  EXPECT_EQ(embedding->embeddings.size(), 2u);
  EXPECT_EQ(embedding->prompt_tokens, 4);
  auto error = ParseClaimedAnswer(MakeErrorLine("x", "invalid_request", "no"));
  ASSERT_TRUE(error.ok());
  EXPECT_EQ(error->kind, ClaimedAnswer::Kind::kError);
}

TEST(RescoreAnswer, MalformedAnswersAreRefused) {
  Json line = MakeResponseLine("a", MakeCompletionBody("a", "m", "hi", "stop", Usage{3, 2}, 0));
  Json bad = line;
  bad["response"]["body"]["usage"]["prompt_tokens"] = -4;
  EXPECT_FALSE(ParseClaimedAnswer(bad).ok());
  bad = line;
  bad["response"]["body"]["usage"]["completion_tokens"] = "many";
  EXPECT_FALSE(ParseClaimedAnswer(bad).ok());
  bad = line;
  bad["response"]["body"]["choices"].push_back(bad["response"]["body"]["choices"][0]);
  EXPECT_FALSE(ParseClaimedAnswer(bad).ok());
  bad = line;
  bad["response"]["body"]["choices"][0]["finish_reason"] = "tool_calls";
  EXPECT_FALSE(ParseClaimedAnswer(bad).ok());
  EXPECT_FALSE(ParseClaimedAnswer(Json::array()).ok());
  EXPECT_FALSE(ParseClaimedAnswer(Json{{"response", nullptr}}).ok());
  Json embedding = MakeResponseLine("e", MakeEmbeddingBody("m", {{1, 0}}, 4));
  embedding["response"]["body"]["data"][0]["index"] = 5;
  EXPECT_FALSE(ParseClaimedAnswer(embedding).ok());
}

TEST(RescoreProtocol, RequestRoundTripsThroughTheRunnerProtocol) {
  Request request;
  request.batch = "v-1";
  request.items.push_back({R"({"custom_id":"a","prompt":"p"})", Json{{"custom_id", "a"}}});
  request.thresholds.gap_hard = 0.5;
  auto command = runner_protocol::DecodeCommand(EncodeRequest(request));
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->op, runner_protocol::Command::Op::kRescore);
  EXPECT_EQ(command->rescore.batch, "v-1");
  ASSERT_EQ(command->rescore.items.size(), 1u);
  EXPECT_EQ(command->rescore.items[0].record, request.items[0].record);
  EXPECT_EQ(command->rescore.thresholds.gap_hard, 0.5);

  Verdict verdict;
  verdict.passed = false;
  verdict.reason = "forged";
  verdict.failed_token = 3;
  verdict.max_rank = 412;
  verdict.min_logprob = -std::numeric_limits<double>::infinity();
  auto event = runner_protocol::DecodeEvent(EncodeVerdict("v-1", 0, "a", verdict));
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_EQ(event->type, runner_protocol::Event::Type::kVerdict);
  Verdict back = Verdict::FromJson(event->body["verdict"]);
  EXPECT_FALSE(back.passed);
  EXPECT_EQ(back.reason, "forged");
  EXPECT_EQ(back.failed_token, 3);
  EXPECT_EQ(back.max_rank, 412);
  EXPECT_TRUE(std::isinf(back.min_logprob));
  auto uncheckable = runner_protocol::DecodeEvent(EncodeUncheckable("v-1", 1, "b", "no model"));
  ASSERT_TRUE(uncheckable.ok());
  EXPECT_EQ(uncheckable->body["error"], "no model");
}

TEST(RescoreProtocol, BadRequestsSayWhatIsWrong) {
  EXPECT_FALSE(runner_protocol::DecodeCommand(R"({"op":"rescore","items":[]})").ok());
  EXPECT_FALSE(runner_protocol::DecodeCommand(R"({"op":"rescore","batch":"b","items":[{"record":"x"}]})").ok());
  EXPECT_FALSE(runner_protocol::DecodeCommand(R"({"op":"rescore","batch":"b","items":{}})").ok());
  EXPECT_FALSE(
      runner_protocol::DecodeCommand(R"({"op":"rescore","batch":"b","items":[],"thresholds":{"gap_hard":99}})").ok());
  Json many = {{"op", "rescore"}, {"batch", "b"}, {"items", Json::array()}};
  for (size_t i = 0; i <= kMaxItems; ++i) many["items"].push_back({{"record", "x"}, {"output", Json::object()}});
  auto refused = runner_protocol::DecodeCommand(DumpJson(many));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("at most"));
  EXPECT_FALSE(runner_protocol::DecodeEvent(R"({"type":"verdict","batch":"b","index":0})").ok());
}

}  // namespace
}  // namespace minions::rescore
