// Per-token choices on the real engine: logprobs equal a log-softmax computed here from the model's
// own logits (llama.cpp used directly), a greedy token tops its list; penalties change a repetitive
// greedy answer; a -100 bias forbids a token; ids outside the vocabulary are that record's error.

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "direct_llama.h"
#include "engine_test_util.h"
#include "llama.h"
#include "runner/llama/llama_engine.h"
#include "runner/llama/record_sampler.h"
#include "test_env.h"

namespace minions::llama_runner {
namespace {

using engine_test::GeneratedText;
using engine_test::ServeAll;
using minions::testing::TestModel;
using ::testing::HasSubstr;

std::unique_ptr<LlamaEngine> LoadEngine() { return engine_test::LoadTextEngine(4, 512); }

// The model through llama.cpp's plain API, one prompt at a time: the reference for logprobs.
class Direct : public DirectModel {
 public:
  Direct()
      : DirectModel(TestModel("text.gguf"), [](llama_model*, llama_context_params& cp) {
          cp.n_ctx = 512;
          cp.n_seq_max = 1;
          cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        }) {}
  std::string Piece(llama_token t) const {
    char buf[256];
    int n = llama_token_to_piece(vocab(), t, buf, sizeof(buf), 0, false);
    return std::string(buf, n > 0 ? n : 0);
  }

  struct Step {
    llama_token greedy;
    std::vector<double> logprobs;  // log-softmax over the vocabulary, in double precision
  };
  // Greedy steps after the prompt: the log-softmax of each step's logits.
  std::vector<Step> Greedy(const std::string& prompt, int steps) {
    llama_memory_clear(llama_get_memory(ctx_), true);
    std::vector<llama_token> tokens = Tokenize(prompt, false);
    llama_batch batch = llama_batch_get_one(tokens.data(), (int)tokens.size());
    std::vector<Step> out;
    llama_token next = 0;
    const int n_vocab = llama_vocab_n_tokens(vocab());
    for (int i = 0; i < steps; ++i) {
      if (llama_decode(ctx_, batch) != 0) break;
      const float* logits = llama_get_logits_ith(ctx_, -1);
      Step step;
      double max = logits[0];
      for (int t = 0; t < n_vocab; ++t) max = std::max(max, (double)logits[t]);
      double sum = 0;
      for (int t = 0; t < n_vocab; ++t) sum += std::exp(logits[t] - max);
      step.greedy = 0;
      for (int t = 0; t < n_vocab; ++t) {
        step.logprobs.push_back(logits[t] - max - std::log(sum));
        if (logits[t] > logits[step.greedy]) step.greedy = t;
      }
      out.push_back(step);
      if (llama_vocab_is_eog(vocab(), step.greedy)) break;
      next = step.greedy;
      batch = llama_batch_get_one(&next, 1);
    }
    return out;
  }
};

// Each test serves its records on a fresh engine.
class Sampling : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { InstallLlamaLogging(); }
  void SetUp() override {
    engine_ = LoadEngine();
    ASSERT_TRUE(engine_);
  }
  std::unique_ptr<LlamaEngine> engine_;
};

const Json& Choice(const Json& out) { return out["response"]["body"]["choices"][0]; }

TEST_F(Sampling, LogprobsAreTheLogSoftmaxOfTheLogits) {
  Direct direct;
  ASSERT_TRUE(direct.ok());
  const std::string prompt = "The weather today is";
  auto outputs = ServeAll(*engine_, {
      DumpJson({{"custom_id", "c"}, {"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}, {"logprobs", 5}}),
      // Sampled: the chosen token's logprob is still the model's, whatever was drawn.
      DumpJson({{"custom_id", "s"}, {"prompt", prompt}, {"max_tokens", 8}, {"temperature", 1.5}, {"seed", 3}, {"logprobs", 0}}),
  });
  auto steps = direct.Greedy(prompt, 8);
  ASSERT_FALSE(steps.empty());
  const Json& lp = Choice(outputs[0])["logprobs"];
  ASSERT_TRUE(lp.is_object()) << DumpJson(outputs[0]);
  ASSERT_EQ(lp["tokens"].size(), std::min<size_t>(steps.size(), 8)) << DumpJson(lp);
  std::string joined;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    const Direct::Step& step = steps[i];
    EXPECT_EQ(lp["tokens"][i], direct.Piece(step.greedy)) << "step " << i;
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), step.logprobs[step.greedy], 1e-3) << "step " << i;
    // The alternatives: the five most likely, the greedy token first.
    const Json& top = lp["top_logprobs"][i];
    ASSERT_EQ(top.size(), 5u);
    double best = -1e9;
    for (const auto& [token, logprob] : top.items()) best = std::max(best, logprob.get<double>());
    EXPECT_NEAR(best, step.logprobs[step.greedy], 1e-3);
    EXPECT_NEAR(top[direct.Piece(step.greedy)].get<double>(), step.logprobs[step.greedy], 1e-3);
    EXPECT_EQ(lp["text_offset"][i], joined.size());
    joined += direct.Piece(step.greedy);
  }
  EXPECT_EQ(GeneratedText(outputs[0]), joined);
  const Json& sampled = Choice(outputs[1])["logprobs"];
  EXPECT_TRUE(sampled["top_logprobs"].is_null());
  EXPECT_EQ(sampled["tokens"].size(), Choice(outputs[1])["logprobs"]["token_logprobs"].size());
  for (const auto& v : sampled["token_logprobs"]) EXPECT_LE(v.get<double>(), 0.0);
}

TEST_F(Sampling, ChatLogprobsHaveOpenAIsShape) {
  auto outputs = ServeAll(*engine_, {
      R"({"custom_id":"a","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"Hello"}],)"
      R"("max_tokens":6,"temperature":0,"logprobs":true,"top_logprobs":20}})",
      R"({"custom_id":"b","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"Hello"}],)"
      R"("max_tokens":6,"temperature":0,"logprobs":true}})",
      R"({"custom_id":"c","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"Hello"}],)"
      R"("max_tokens":6,"temperature":0}})",
  });
  const Json& content = Choice(outputs[0])["logprobs"]["content"];
  ASSERT_TRUE(content.is_array()) << DumpJson(outputs[0]);
  ASSERT_EQ(content.size(), Choice(outputs[0])["finish_reason"] == "length" ? 6u : content.size());
  std::string text;
  for (const Json& entry : content) {
    ASSERT_TRUE(entry["token"].is_string());
    ASSERT_TRUE(entry["logprob"].is_number());
    ASSERT_TRUE(entry["bytes"].is_array());
    std::string bytes;
    for (const auto& b : entry["bytes"]) bytes += static_cast<char>(b.get<int>());
    text += bytes;
    ASSERT_EQ(entry["top_logprobs"].size(), 20u);
    // Greedy: the chosen token is the most likely of its list.
    EXPECT_EQ(entry["top_logprobs"][0]["token"], entry["token"]);
    EXPECT_NEAR(entry["top_logprobs"][0]["logprob"].get<double>(), entry["logprob"].get<double>(), 1e-6);
    for (size_t k = 1; k < 20; ++k) {
      EXPECT_LE(entry["top_logprobs"][k]["logprob"].get<double>(), entry["top_logprobs"][k - 1]["logprob"].get<double>());
    }
  }
  EXPECT_EQ(text, GeneratedText(outputs[0]));
  // Logprobs do not change the answer.
  EXPECT_EQ(GeneratedText(outputs[0]), GeneratedText(outputs[2]));
  EXPECT_EQ(Choice(outputs[1])["logprobs"]["content"].size(), content.size());
  EXPECT_TRUE(Choice(outputs[1])["logprobs"]["content"][0]["top_logprobs"].empty());
  EXPECT_TRUE(Choice(outputs[2])["logprobs"].is_null());
  // The engine's fingerprint: the same on every answer of one build and model.
  const Json& fingerprint = outputs[0]["response"]["body"]["system_fingerprint"];
  ASSERT_TRUE(fingerprint.is_string());
  EXPECT_THAT(fingerprint.get<std::string>(), ::testing::MatchesRegex("fp_[0-9a-f]{16}"));
  EXPECT_EQ(outputs[2]["response"]["body"]["system_fingerprint"], fingerprint);
}

// A greedy answer from the random test model that repeats tokens, or skips the test's premise.
TEST_F(Sampling, PenaltiesChangeARepetitiveGreedyAnswer) {
  const std::string prompt = "one one one one one one";
  auto record = [&](const std::string& id, const Json& extra) {
    Json r = {{"custom_id", id}, {"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}, {"logprobs", 0}};
    r.update(extra);
    return DumpJson(r);
  };
  auto outputs = ServeAll(*engine_, {record("plain", Json::object()),
                                    record("presence", {{"presence_penalty", 2.0}}),
                                    record("frequency", {{"frequency_penalty", 2.0}}),
                                    record("repeat", {{"repeat_penalty", 1.5}})});
  const Json& tokens = Choice(outputs[0])["logprobs"]["tokens"];
  std::map<std::string, int> counts;
  int repeats = 0;
  for (const auto& t : tokens) repeats += counts[t.get<std::string>()]++ > 0;
  ASSERT_GT(repeats, 0) << "the greedy answer does not repeat itself: " << DumpJson(tokens);
  for (size_t i = 1; i < 4; ++i) {
    ASSERT_FALSE(IsErrorOutputLine(outputs[i])) << DumpJson(outputs[i]);
    EXPECT_NE(GeneratedText(outputs[i]), GeneratedText(outputs[0])) << "record " << i;
  }
  // A presence penalty of 2 on logits this flat: fewer repeated tokens than without.
  std::map<std::string, int> penalized;
  int penalized_repeats = 0;
  for (const auto& t : Choice(outputs[1])["logprobs"]["tokens"]) penalized_repeats += penalized[t.get<std::string>()]++ > 0;
  EXPECT_LT(penalized_repeats, repeats);
}

TEST_F(Sampling, AMinusHundredBiasForbidsAToken) {
  Direct direct;
  ASSERT_TRUE(direct.ok());
  const std::string prompt = "Tell me about the sea";
  auto steps = direct.Greedy(prompt, 1);
  ASSERT_EQ(steps.size(), 1u);
  const llama_token first = steps[0].greedy;
  const std::string id = std::to_string(first);
  auto outputs = ServeAll(*engine_, {
      DumpJson({{"custom_id", "biased"}, {"prompt", prompt}, {"max_tokens", 30}, {"temperature", 0},
                {"logprobs", 0}, {"logit_bias", {{id, -100}}}}),
      DumpJson({{"custom_id", "sampled"}, {"prompt", prompt}, {"max_tokens", 30}, {"temperature", 2}, {"seed", 9},
                {"logprobs", 0}, {"logit_bias", {{id, -100}}}}),
      DumpJson({{"custom_id", "favoured"}, {"prompt", prompt}, {"max_tokens", 3}, {"temperature", 0},
                {"logprobs", 0}, {"logit_bias", {{"42", 100}}}}),
      DumpJson({{"custom_id", "outside"}, {"prompt", prompt}, {"logit_bias", {{"99999999", 5}}}}),
  });
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_FALSE(IsErrorOutputLine(outputs[i])) << DumpJson(outputs[i]);
    for (const auto& t : Choice(outputs[i])["logprobs"]["tokens"]) EXPECT_NE(t, direct.Piece(first)) << i;
  }
  for (const auto& t : Choice(outputs[2])["logprobs"]["tokens"]) EXPECT_EQ(t, direct.Piece(42));
  ASSERT_TRUE(IsErrorOutputLine(outputs[3]));
  EXPECT_THAT(OutputLineError(outputs[3])["message"].get<std::string>(), HasSubstr("not in the model's vocabulary"));
}

TEST_F(Sampling, LlamaSamplersAreServed) {
  // top_k 1 is greedy whatever the temperature; min_p 1 keeps only the most likely tokens too
  // (ties included, so its picks are checked against the logprobs rather than the greedy text).
  auto outputs = ServeAll(*engine_, {
      R"({"custom_id":"g","prompt":"Cats","max_tokens":10,"temperature":0})",
      R"({"custom_id":"k","prompt":"Cats","max_tokens":10,"temperature":1.8,"top_k":1,"seed":4})",
      R"({"custom_id":"m","prompt":"Cats","max_tokens":10,"temperature":1.8,"min_p":1,"seed":5,"logprobs":1})",
  });
  EXPECT_EQ(GeneratedText(outputs[1]), GeneratedText(outputs[0]));
  const Json& lp = Choice(outputs[2])["logprobs"];
  ASSERT_FALSE(lp["token_logprobs"].empty()) << DumpJson(outputs[2]);
  for (size_t i = 0; i < lp["token_logprobs"].size(); ++i) {
    double best = -1e9;
    for (const auto& [token, logprob] : lp["top_logprobs"][i].items()) best = std::max(best, logprob.get<double>());
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), best, 1e-5) << "step " << i;
  }
}

TEST_F(Sampling, NChoicesEachHaveTheirOwnSeededStream) {
  // A prompt long enough (over 32 tokens) that the choices share its KV cells.
  std::string prompt;
  for (int i = 0; i < 12; ++i) prompt += "The river runs past the mill and the old stone bridge. ";
  auto record = [&](const std::string& id, int n) {
    return DumpJson({{"custom_id", id}, {"prompt", prompt}, {"max_tokens", 8}, {"temperature", 1.5}, {"seed", 11},
                     {"n", n}, {"logprobs", 0}});
  };
  auto results = engine_test::ServeResults(*engine_, {record("one", 1), record("four", 4)});
  const Json& one = results[0].output["response"]["body"];
  const Json& four = results[1].output["response"]["body"];
  ASSERT_EQ(four["choices"].size(), 4u) << DumpJson(results[1].output);
  std::set<std::string> texts;
  int tokens = 0;
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(four["choices"][k]["index"], k);
    texts.insert(four["choices"][k]["text"].get<std::string>());
    tokens += static_cast<int>(four["choices"][k]["logprobs"]["tokens"].size());
  }
  EXPECT_GE(texts.size(), 2u) << "sampled choices with their own seeds differ";
  // Choice 0 is the record's own stream: what n = 1 gives.
  EXPECT_EQ(four["choices"][0]["text"], one["choices"][0]["text"]);
  // The prompt counts once, every choice's tokens count.
  EXPECT_EQ(four["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);
  EXPECT_EQ(four["usage"]["completion_tokens"], tokens);
  EXPECT_EQ(results[1].usage.completion_tokens, tokens);
  // Computed once: the other choices took the prompt's cells.
  EXPECT_GT(results[1].cached_tokens, 0);
}

// The legacy completions shape keys alternatives by their text: two tokens that spell the same
// text (a byte token and its character; equal partial-UTF-8 bytes) would share a key. The most
// likely keeps it, with its own log probability; chat's list shape keeps all of them.
TEST(Logprobs, LegacyAlternativesThatSpellTheSameTextKeepTheMostLikely) {
  TokenLogprob entry;
  entry.token = 1;
  entry.logprob = -0.1f;
  entry.top = {{1, -0.1f}, {2, -1.5f}, {3, -2.0f}, {4, -3.0f}};
  auto piece = [](int32_t token) -> std::string {
    switch (token) {
      case 1: return "A";
      case 2: return "A";       // e.g. the byte-fallback token <0x41>
      case 3: return "\xe2";    // half a character
      default: return "\xe2";   // the same byte again
    }
  };
  Json legacy = LogprobsJson({entry}, Endpoint::kCompletions, 4, 100, piece);
  const Json& top = legacy["top_logprobs"][0];
  ASSERT_EQ(top.size(), 2u) << top.dump();
  EXPECT_FLOAT_EQ(top["A"].get<float>(), -0.1f);
  EXPECT_FLOAT_EQ(top["bytes:\\xe2"].get<float>(), -2.0f);
  EXPECT_FLOAT_EQ(legacy["token_logprobs"][0].get<float>(), -0.1f);

  Json chat = LogprobsJson({entry}, Endpoint::kChatCompletions, 4, 100, piece);
  const Json& alternatives = chat["content"][0]["top_logprobs"];
  ASSERT_EQ(alternatives.size(), 4u);
  EXPECT_EQ(alternatives[1]["token"], "A");
  EXPECT_FLOAT_EQ(alternatives[1]["logprob"].get<float>(), -1.5f);
  EXPECT_EQ(alternatives[3]["bytes"], Json::array({0xe2}));
}

}  // namespace
}  // namespace minions::llama_runner
