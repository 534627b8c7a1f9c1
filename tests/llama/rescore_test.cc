// Verification by re-scoring on the real llama.cpp engine (issue 38, point 1): answers the engine
// generated pass the check; forged, token-flipped, truncated, swapped and inflated-usage answers
// fail it. Also through the runner process (the `rescore` protocol command).

#include "runner/llama/rescorer.h"

#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "runner/llama/llama_engine.h"
#include "runner/runner_process.h"
#include "test_env.h"

namespace minions::llama_runner {
namespace {

using engine_test::GeneratedText;
using engine_test::ServeAll;
using ::testing::HasSubstr;
using minions::testing::TestModel;
using minions::testing::TestProgram;

std::string Completion(const std::string& id, const std::string& prompt, int max_tokens, double temperature = 0,
                       Json extra = Json::object()) {
  Json line = {{"custom_id", id}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", temperature}};
  for (auto& [key, value] : extra.items()) line[key] = value;
  return DumpJson(line);
}

std::string Chat(const std::string& id, const std::string& user, int max_tokens, double temperature = 0) {
  return DumpJson({{"custom_id", id},
                   {"url", "/v1/chat/completions"},
                   {"body",
                    {{"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", user}}}},
                     {"max_tokens", max_tokens},
                     {"temperature", temperature}}}});
}

runner_protocol::LoadOptions Options() {
  runner_protocol::LoadOptions options;
  options.n_parallel = 4;
  options.n_ctx_per_seq = 512;
  options.n_batch = 64;
  options.flash_attn = "off";
  return options;
}

Json& Body(Json& line) { return line["response"]["body"]; }
Json& Choice(Json& line) { return Body(line)["choices"][0]; }
void SetText(Json& line, const std::string& text) {
  Json& choice = Choice(line);
  if (choice.contains("message")) {
    choice["message"]["content"] = text;
  } else {
    choice["text"] = text;
  }
}

class Rescore : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    InstallLlamaLogging();
    auto engine = LlamaEngine::Load(TestModel("text.gguf"), Options());
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine).release();
    lines_ = {
        Completion("g0", "The quick brown fox", 24),
        Completion("g1", "Once upon a time, in a land far away,", 32),
        Chat("c0", "Name three colours.", 20),
        Completion("s0", "Tell me a story about the sea", 24, 0.8, {{"seed", 7}}),
        Completion("s1", "List some numbers: 1 2 3", 24, 1.0, {{"top_p", 0.9}}),
        Chat("s2", "Say something.", 16, 0.7),
        Completion("t0", "Stop here please", 24, 0, {{"stop", {"e", "a"}}}),
    };
    outputs_ = ServeAll(*engine_, lines_);
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }

  rescore::Verdict Check(size_t index, const Json& output) {
    Rescorer rescorer(*engine_);
    auto verdict = rescorer.Check(lines_[index], output, {});
    EXPECT_TRUE(verdict.ok()) << verdict.status();
    return verdict.ok() ? *verdict : rescore::Verdict{};
  }
  Json Output(size_t index) { return outputs_.at(index); }

  static LlamaEngine* engine_;
  static std::vector<std::string> lines_;
  static std::map<size_t, Json> outputs_;
};
LlamaEngine* Rescore::engine_ = nullptr;
std::vector<std::string> Rescore::lines_;
std::map<size_t, Json> Rescore::outputs_;

TEST_F(Rescore, HonestAnswersPass) {
  ASSERT_EQ(outputs_.size(), lines_.size());
  for (size_t i = 0; i < lines_.size(); ++i) {
    ASSERT_TRUE(outputs_[i]["error"].is_null()) << DumpJson(outputs_[i]);
    rescore::Verdict verdict = Check(i, Output(i));
    EXPECT_TRUE(verdict.passed) << lines_[i] << "\n" << DumpJson(Output(i)) << "\n" << verdict.ToJson();
    EXPECT_GT(verdict.tokens_checked, 0) << lines_[i];
    EXPECT_EQ(verdict.counted_prompt_tokens, Output(i)["response"]["body"]["usage"]["prompt_tokens"]);
  }
}

TEST_F(Rescore, ForgedGreedyAnswerFails) {
  Json forged = Output(0);
  SetText(forged, " jumps over the lazy dog and runs into the forest.");
  rescore::Verdict verdict = Check(0, forged);
  EXPECT_FALSE(verdict.passed);
  EXPECT_THAT(verdict.reason, HasSubstr("greedy"));
}

TEST_F(Rescore, TokenFlippedGreedyAnswerFails) {
  for (size_t index : {0u, 1u, 2u}) {
    Json flipped = Output(index);
    std::string text = GeneratedText(flipped);
    ASSERT_GT(text.size(), 6u);
    // One character in the middle becomes another: a bit flip in a token.
    size_t at = text.size() / 2;
    text[at] = text[at] == 'x' ? 'q' : 'x';
    SetText(flipped, text);
    rescore::Verdict verdict = Check(index, flipped);
    EXPECT_FALSE(verdict.passed) << lines_[index] << " -> " << text;
  }
}

TEST_F(Rescore, TruncatedAnswerFails) {
  Json truncated = Output(1);
  std::string text = GeneratedText(truncated);
  SetText(truncated, text.substr(0, text.size() / 2));
  Choice(truncated)["finish_reason"] = "stop";
  EXPECT_FALSE(Check(1, truncated).passed);
  // Even with its usage made to fit the shorter text, the text was cut where the model went on.
  Body(truncated)["usage"]["completion_tokens"] = Check(1, truncated).counted_completion_tokens;
  EXPECT_FALSE(Check(1, truncated).passed);
  // An answer cut at its length limit that claims it ended there: the model would have gone on.
  Json cut = Output(1);
  ASSERT_EQ(Choice(cut)["finish_reason"], "length");
  Choice(cut)["finish_reason"] = "stop";
  rescore::Verdict verdict = Check(1, cut);
  EXPECT_FALSE(verdict.passed);
  EXPECT_THAT(verdict.reason, HasSubstr("end of the answer"));
}

TEST_F(Rescore, InflatedUsageFails) {
  for (size_t index : {0u, 3u}) {
    Json inflated = Output(index);
    Body(inflated)["usage"]["prompt_tokens"] = 999999;
    rescore::Verdict verdict = Check(index, inflated);
    EXPECT_FALSE(verdict.passed);
    EXPECT_THAT(verdict.reason, HasSubstr("prompt_tokens claims 999999"));
    inflated = Output(index);
    Body(inflated)["usage"]["completion_tokens"] = 999999;
    EXPECT_FALSE(Check(index, inflated).passed) << lines_[index];
  }
  Json greedy = Output(0);
  Body(greedy)["usage"]["completion_tokens"] = Body(greedy)["usage"]["completion_tokens"].get<int>() - 1;
  EXPECT_THAT(Check(0, greedy).reason, HasSubstr("completion_tokens"));
}

TEST_F(Rescore, AnswersSwappedBetweenRecordsFail) {
  Json swapped = Output(1);
  swapped["custom_id"] = "g0";
  EXPECT_THAT(Check(0, Output(1)).reason, HasSubstr("custom_id"));
  EXPECT_FALSE(Check(0, swapped).passed);
  Json chat = Output(0);
  chat["custom_id"] = "c0";
  EXPECT_FALSE(Check(2, chat).passed);
}

TEST_F(Rescore, ForgedSampledAnswerFails) {
  // A low temperature makes the random model's distributions peaked enough to tell a forgery.
  const std::string line = Completion("f0", "The weather today", 24, 0.3, {{"seed", 3}});
  std::map<size_t, Json> honest = ServeAll(*engine_, {line});
  Rescorer rescorer(*engine_);
  auto passed = rescorer.Check(line, honest.at(0), {});
  ASSERT_TRUE(passed.ok()) << passed.status();
  EXPECT_TRUE(passed->passed) << passed->ToJson();
  Json forged = honest.at(0);
  SetText(forged, " is sunny with a light breeze from the west, and warm.");
  auto failed = rescorer.Check(line, forged, {});
  ASSERT_TRUE(failed.ok());
  EXPECT_FALSE(failed->passed) << failed->ToJson();
}

TEST_F(Rescore, ErrorLinesAndInvalidRecordsAreJudgedByShape) {
  Rescorer rescorer(*engine_);
  auto error = rescorer.Check(lines_[0], MakeErrorLine("g0", "runner_error", "boom"), {});
  ASSERT_TRUE(error.ok());
  EXPECT_TRUE(error->passed);
  EXPECT_FALSE(error->skipped.empty());
  auto invalid = rescorer.Check(R"({"custom_id":"x","prompt":""})", Output(0), {});
  ASSERT_TRUE(invalid.ok());
  EXPECT_FALSE(invalid->passed);
  auto garbage = rescorer.Check(lines_[0], Json{{"custom_id", "g0"}, {"response", {{"body", 3}}}}, {});
  ASSERT_TRUE(garbage.ok());
  EXPECT_FALSE(garbage->passed);
}

TEST_F(Rescore, AnswersShapedByPenaltiesBiasesTopKAndMinPPass) {
  // The check applies the producer's logit_bias and penalties over the claimed answer, then top_k,
  // top_p and min_p: honest answers under each pass, greedy ones token for token.
  const Json penalties = {{"presence_penalty", 1.5}, {"frequency_penalty", 1.0}, {"repeat_penalty", 1.3}};
  const std::vector<std::string> lines = {
      Completion("p0", "Once upon a time, in a land far away,", 32, 0, penalties),
      Completion("p1", "List some numbers: 1 2 3", 24, 0.8, penalties),
      Completion("k0", "The quick brown fox", 16, 0.8, {{"top_k", 5}, {"seed", 1}}),
      Completion("m0", "The quick brown fox", 16, 1.0, {{"min_p", 0.1}, {"top_k", 40}, {"top_p", 0.95}}),
      Completion("b0", "The quick brown fox", 16, 0, {{"logit_bias", {{"100", 5}, {"200", -100}}}}),
  };
  std::map<size_t, Json> outputs = ServeAll(*engine_, lines);
  Rescorer rescorer(*engine_);
  for (size_t i = 0; i < lines.size(); ++i) {
    ASSERT_TRUE(outputs.at(i)["error"].is_null()) << DumpJson(outputs.at(i));
    auto verdict = rescorer.Check(lines[i], outputs.at(i), {});
    ASSERT_TRUE(verdict.ok()) << lines[i] << ": " << verdict.status();
    EXPECT_TRUE(verdict->passed) << lines[i] << "\n" << DumpJson(outputs.at(i)) << "\n" << verdict->ToJson();
    EXPECT_GT(verdict->tokens_checked, 0) << lines[i];
  }
}

TEST_F(Rescore, AnAnswerThatIgnoresItsPenaltiesOrBiasesFails) {
  // The unpenalised greedy answer, claimed for the record that asks for penalties: the random
  // test model repeats itself, which the penalties forbid.
  const Json penalties = {{"presence_penalty", 2.0}, {"frequency_penalty", 2.0}, {"repeat_penalty", 2.0}};
  const std::string penalised = Completion("g1", "Once upon a time, in a land far away,", 32, 0, penalties);
  std::map<size_t, Json> honest = ServeAll(*engine_, {penalised});
  ASSERT_NE(GeneratedText(honest.at(0)), GeneratedText(Output(1)));  // the penalties change the answer
  Rescorer rescorer(*engine_);
  auto ignored = rescorer.Check(penalised, Output(1), {});
  ASSERT_TRUE(ignored.ok()) << ignored.status();
  EXPECT_FALSE(ignored->passed) << ignored->ToJson();
  EXPECT_THAT(ignored->reason, HasSubstr("greedy"));

  // g0's unbiased answer, claimed for g0 with a bias that makes token 100 the greedy choice.
  const std::string biased = Completion("g0", "The quick brown fox", 24, 0, {{"logit_bias", {{"100", 100}}}});
  std::map<size_t, Json> honest_biased = ServeAll(*engine_, {biased});
  ASSERT_NE(GeneratedText(honest_biased.at(0)), GeneratedText(Output(0)));  // the bias changes the answer
  auto unbiased = rescorer.Check(biased, Output(0), {});
  ASSERT_TRUE(unbiased.ok()) << unbiased.status();
  EXPECT_FALSE(unbiased->passed) << unbiased->ToJson();
  // A bias naming a token outside the vocabulary: no runner serves the record, yet it claims one.
  const std::string outside = Completion("g0", "The quick brown fox", 24, 0, {{"logit_bias", {{"99999999", 1}}}});
  auto refused = rescorer.Check(outside, Output(0), {});
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_FALSE(refused->passed) << refused->ToJson();
}

TEST_F(Rescore, ConstrainedAnswersAreNotJudgedYet) {
  // A grammar or JSON schema is not applied by the check yet: uncheckable here, never failed.
  const std::string line = DumpJson({{"custom_id", "j0"},
                                     {"prompt", "A JSON object:"},
                                     {"max_tokens", 16},
                                     {"temperature", 0},
                                     {"response_format", {{"type", "json_object"}}}});
  std::map<size_t, Json> outputs = ServeAll(*engine_, {line});
  Rescorer rescorer(*engine_);
  auto verdict = rescorer.Check(line, outputs.at(0), {});
  EXPECT_FALSE(verdict.ok());
  EXPECT_THAT(std::string(verdict.status().message()), HasSubstr("not checked"));
}

TEST(RescoreEmbeddings, RecomputedEmbeddingsMatchAndPerturbedOnesFail) {
  InstallLlamaLogging();
  auto engine = LlamaEngine::Load(TestModel("embedding.gguf"), Options());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::string line =
      DumpJson({{"custom_id", "e0"}, {"url", "/v1/embeddings"}, {"body", {{"input", {"hello world", "goodbye"}}}}});
  std::map<size_t, Json> outputs = ServeAll(**engine, {line});
  Rescorer rescorer(**engine);
  auto honest = rescorer.Check(line, outputs.at(0), {});
  ASSERT_TRUE(honest.ok()) << honest.status();
  EXPECT_TRUE(honest->passed) << honest->ToJson();
  EXPECT_GE(honest->min_cosine, 0.999);
  Json perturbed = outputs.at(0);
  Json& vector = perturbed["response"]["body"]["data"][1]["embedding"];
  for (size_t i = 0; i < vector.size(); i += 2) vector[i] = -vector[i].get<double>();
  auto failed = rescorer.Check(line, perturbed, {});
  ASSERT_TRUE(failed.ok());
  EXPECT_FALSE(failed->passed);
  EXPECT_THAT(failed->reason, HasSubstr("cosine"));
}

TEST(RescoreRunner, TheRunnerAnswersRescoreWithVerdicts) {
  RunnerProcess::Options options;
  options.command = {TestProgram("minions-llama-runner")};
  auto runner = RunnerProcess::Start(options);
  ASSERT_TRUE(runner.ok()) << runner.status();
  rescore::Request request;
  request.batch = "v1";
  const std::string line = Completion("r0", "Hello there", 12);
  request.items.push_back({line, Json{{"custom_id", "r0"}}});
  // Without a model every item is uncheckable, never failed.
  std::map<size_t, Json> verdicts;
  auto done = (*runner)->Rescore(request, [&](size_t i, const Json& message) { verdicts[i] = message; });
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_TRUE(verdicts[0]["error"].is_string());

  runner_protocol::LoadRequest load{TestModel("text.gguf"), Options()};
  ASSERT_TRUE((*runner)->Load(load).ok());
  std::vector<Json> outputs(1);
  ASSERT_TRUE((*runner)->RunBatch("b1", {line}, [&](size_t i, const Json& out) { outputs[i] = out; }).ok());
  request.items = {{line, outputs[0]}};
  Json forged = outputs[0];
  forged["response"]["body"]["choices"][0]["text"] = " general Kenobi, you are a bold one.";
  request.items.push_back({line, forged});
  verdicts.clear();
  done = (*runner)->Rescore(request, [&](size_t i, const Json& message) { verdicts[i] = message; });
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ((*done)["records"], 2);
  ASSERT_EQ(verdicts.size(), 2u);
  EXPECT_EQ(verdicts[0]["custom_id"], "r0");
  EXPECT_TRUE(verdicts[0]["verdict"]["passed"].get<bool>()) << DumpJson(verdicts[0]);
  EXPECT_FALSE(verdicts[1]["verdict"]["passed"].get<bool>()) << DumpJson(verdicts[1]);
  // The runner still serves records after checking.
  ASSERT_TRUE((*runner)->RunBatch("b2", {line}, [&](size_t, const Json& out) {
    EXPECT_EQ(GeneratedText(out), GeneratedText(outputs[0]));
  }).ok());
  (*runner)->Shutdown();
}

}  // namespace
}  // namespace minions::llama_runner
