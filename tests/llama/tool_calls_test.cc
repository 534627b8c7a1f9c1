// Tool calling on the real engine, on the test model with Qwen 2.5's own chat template
// (tools/text-tools.gguf): the template renders the tools, tool_choice "required" and a named function
// decode under llama.cpp's tool-call grammar (so even random weights write a well-formed call),
// and the answer is parsed into message.tool_calls with finish_reason "tool_calls". A model whose
// template has no tool support, and tool schemas the converter cannot express, are that record's
// error.

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "llama.h"
#include "runner/llama/llama_engine.h"
#include "runner/llama/rescorer.h"
#include "test_env.h"

namespace minions::llama_runner {
namespace {

using engine_test::ServeAll;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::unique_ptr<LlamaEngine> LoadToolEngine() {
  runner_protocol::LoadOptions options;
  options.n_parallel = 4;
  options.n_ctx_per_seq = 2048;
  options.flash_attn = "off";
  auto engine = LlamaEngine::Load(minions::testing::TestModel("tools/text-tools.gguf"), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Arguments are bounded (an enum, a short string) so that a grammar-following answer ends.
constexpr char kWeather[] =
    R"({"type":"function","function":{"name":"get_weather","description":"Weather of a city",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Paris","Oslo","Lima"]},)"
    R"("days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"],"additionalProperties":false}}})";
constexpr char kTime[] =
    R"({"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":)"
    R"({"zone":{"type":"string","enum":["UTC","CET"]}},"required":["zone"],"additionalProperties":false}}})";

std::string ToolRecord(const std::string& id, const std::string& extra, const std::string& messages = "") {
  return R"({"custom_id":")" + id + R"(","url":"/v1/chat/completions","body":{"model":"m","max_tokens":200,)" +
         R"("temperature":0,"messages":)" +
         (messages.empty() ? R"([{"role":"user","content":"What is the weather in Paris?"}])" : messages) + extra + "}}";
}

const Json& Body(const Json& line) { return line["response"]["body"]; }

// Checks one choice's call against the weather function's schema.
void ExpectWeatherCall(const Json& call) {
  EXPECT_THAT(call["id"].get<std::string>(), StartsWith("call_"));
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  ASSERT_TRUE(call["function"]["arguments"].is_string());
  Json args = Json::parse(call["function"]["arguments"].get<std::string>());
  ASSERT_TRUE(args.is_object()) << args.dump();
  EXPECT_THAT(std::vector<std::string>({"Paris", "Oslo", "Lima"}), ::testing::Contains(args["city"].get<std::string>()));
  EXPECT_GE(args["days"].get<int>(), 1);
  EXPECT_LE(args["days"].get<int>(), 7);
}

TEST(ToolCalls, RequiredAndNamedChoicesAnswerWithWellFormedCalls) {
  auto engine = LoadToolEngine();
  ASSERT_NE(engine, nullptr);
  const std::string tools = std::string(R"(,"tools":[)") + kWeather + "," + kTime + "]";
  auto out = ServeAll(*engine, {
                                   ToolRecord("req", tools + R"(,"tool_choice":"required","parallel_tool_calls":false)"),
                                   ToolRecord("named", tools + R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}})"),
                                   ToolRecord("n2", tools + R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}},"n":2,"temperature":1)"),
                               });
  for (const char* id : {"req", "named"}) {
    SCOPED_TRACE(id);
    const Json& line = out[std::string(id) == "req" ? 0 : 1];
    ASSERT_EQ(line["response"]["status_code"], 200) << line.dump();
    const Json& choice = Body(line)["choices"][0];
    ASSERT_EQ(choice["finish_reason"], "tool_calls") << choice.dump();
    const Json& calls = choice["message"]["tool_calls"];
    ASSERT_TRUE(calls.is_array() && !calls.empty()) << choice.dump();
    // The grammar demands the call from the first token: no text beside it, and one call (named,
    // or parallel_tool_calls false).
    EXPECT_TRUE(choice["message"]["content"].is_null()) << choice.dump();
    EXPECT_EQ(calls.size(), 1u) << choice.dump();
    if (std::string(id) == "named") {
      for (const Json& call : calls) ExpectWeatherCall(call);
    } else {
      for (const Json& call : calls) {
        EXPECT_THAT(std::vector<std::string>({"get_weather", "get_time"}),
                    ::testing::Contains(call["function"]["name"].get<std::string>()));
        Json args = Json::parse(call["function"]["arguments"].get<std::string>());
        EXPECT_TRUE(args.is_object());
      }
    }
  }
  // n = 2: each choice its own call, with its own ids.
  const Json& n2 = Body(out[2])["choices"];
  ASSERT_EQ(n2.size(), 2u) << out[2].dump();
  for (const Json& choice : n2) {
    ASSERT_EQ(choice["finish_reason"], "tool_calls") << choice.dump();
    ExpectWeatherCall(choice["message"]["tool_calls"][0]);
  }
  EXPECT_NE(n2[0]["message"]["tool_calls"][0]["id"], n2[1]["message"]["tool_calls"][0]["id"]);

  // A re-run writes the same lines (ids are derived from the custom_id, the choice and the place).
  auto again = ServeAll(*engine, {ToolRecord("req", tools + R"(,"tool_choice":"required","parallel_tool_calls":false)")});
  EXPECT_EQ(Body(again[0])["choices"], Body(out[0])["choices"]);
}

// The test model's tokens that spell `text` (as its tokenizer splits it).
std::vector<llama_token> Tokens(const std::string& text) {
  llama_model_params params = llama_model_default_params();
  params.vocab_only = true;
  llama_model* model = llama_model_load_from_file(minions::testing::TestModel("tools/text-tools.gguf").c_str(), params);
  EXPECT_NE(model, nullptr);
  if (model == nullptr) return {};
  std::vector<llama_token> tokens(64);
  const int n = llama_tokenize(llama_model_get_vocab(model), text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                               static_cast<int32_t>(tokens.size()), false, false);
  llama_model_free(model);
  tokens.resize(static_cast<size_t>(std::max(n, 0)));
  return tokens;
}

TEST(ToolCalls, AutoAnswersWithACallWhenTheModelStartsOne) {
  // tool_choice "auto": the model chooses between text and a call; random weights never choose a
  // call, so this record makes greedy decoding spell "<tool_call>\\n" (the trigger): each of its tokens biased 8
  // below the one before, each halved once used (repeat_penalty 2), so they come out in order.
  // That wakes llama.cpp's lazy tool-call grammar, which from there keeps the call well formed;
  // the answer is parsed into message.tool_calls, as a trained model's would be.
  const std::vector<llama_token> tokens = Tokens("<tool_call>\n");
  ASSERT_FALSE(tokens.empty());
  ASSERT_EQ(std::set<llama_token>(tokens.begin(), tokens.end()).size(), tokens.size()) << "a token repeats";
  Json bias = Json::object();
  for (size_t i = 0; i < tokens.size(); ++i) bias[std::to_string(tokens[i])] = 100 - 8 * static_cast<int>(i);
  auto engine = LoadToolEngine();
  ASSERT_NE(engine, nullptr);
  auto out = ServeAll(*engine, {ToolRecord("auto", std::string(R"(,"tools":[)") + kWeather +
                                                       R"(],"tool_choice":"auto","parallel_tool_calls":false,)"
                                                       R"("repeat_penalty":2,"logit_bias":)" + bias.dump())});
  ASSERT_EQ(out[0]["response"]["status_code"], 200) << out[0].dump();
  const Json& choice = Body(out[0])["choices"][0];
  ASSERT_EQ(choice["finish_reason"], "tool_calls") << choice.dump();
  const Json& calls = choice["message"]["tool_calls"];
  ASSERT_TRUE(calls.is_array()) << choice.dump();
  ASSERT_EQ(calls.size(), 1u) << choice.dump();
  ExpectWeatherCall(calls[0]);
  // The call's text is not content: at most the space the tokenizer put before "<tool_call>".
  if (!choice["message"]["content"].is_null()) {
    EXPECT_THAT(choice["message"]["content"].get<std::string>(), ::testing::MatchesRegex("\\s*")) << choice.dump();
  }
}

TEST(ToolCalls, ReScoringLeavesToolCallAnswersUnjudgedNeverFailed) {
  // An honest answer made only of tool calls has message.content null: re-scoring must not read
  // that as a forged answer; it does not replay the template's grammar yet, so it is not checked.
  auto engine = LoadToolEngine();
  ASSERT_NE(engine, nullptr);
  const std::string record = ToolRecord("req", std::string(R"(,"tools":[)") + kWeather + R"(],"tool_choice":"required","parallel_tool_calls":false)");
  auto out = ServeAll(*engine, {record});
  ASSERT_EQ(Body(out[0])["choices"][0]["finish_reason"], "tool_calls") << out[0].dump();
  Rescorer rescorer(*engine);
  auto verdict = rescorer.Check(record, out[0], {});
  ASSERT_FALSE(verdict.ok()) << verdict->ToJson();
  EXPECT_EQ(verdict.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(verdict.status().message()), HasSubstr("not checked"));
}

TEST(ToolCalls, ToolChoiceNoneAndHistoryAreServedAsText) {
  auto engine = LoadToolEngine();
  ASSERT_NE(engine, nullptr);
  const std::string history =
      R"([{"role":"user","content":"Weather in Paris?"},)"
      R"({"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":)"
      R"({"name":"get_weather","arguments":"{\"city\":\"Paris\",\"days\":1}"}}]},)"
      R"({"role":"tool","tool_call_id":"call_1","content":"sunny, 21 C"}])";
  auto out = ServeAll(*engine, {
                                   ToolRecord("none", std::string(R"(,"max_tokens":8,"tools":[)") + kWeather + R"(],"tool_choice":"none")"),
                                   ToolRecord("history", std::string(R"(,"max_tokens":8,"tools":[)") + kWeather + R"(],"tool_choice":"none")", history),
                               });
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(out[i]["response"]["status_code"], 200) << out[i].dump();
    const Json& choice = Body(out[i])["choices"][0];
    EXPECT_FALSE(choice["message"].contains("tool_calls")) << choice.dump();
    EXPECT_TRUE(choice["message"]["content"].is_string());
    EXPECT_NE(choice["finish_reason"], "tool_calls");
  }
  // The tool result and the earlier call are in the prompt the template rendered.
  EXPECT_GT(Body(out[1])["usage"]["prompt_tokens"].get<int>(), Body(out[0])["usage"]["prompt_tokens"].get<int>());
}

TEST(ToolCalls, RefusalsAreTheRecordsError) {
  // The plain test model's template (ChatML without tools) cannot render tools.
  auto plain = engine_test::LoadTextEngine(2, 1024);
  ASSERT_NE(plain, nullptr);
  auto out = ServeAll(*plain, {ToolRecord("t", std::string(R"(,"tools":[)") + kWeather + "]")});
  const Json& error = out[0]["response"]["body"]["error"];
  EXPECT_EQ(out[0]["response"]["status_code"], 400);
  EXPECT_THAT(error["message"].get<std::string>(), HasSubstr("does not render tools"));

  auto engine = LoadToolEngine();
  ASSERT_NE(engine, nullptr);
  out = ServeAll(*engine, {
                              // A schema the converter cannot express, in a tool's parameters.
                              ToolRecord("bad", R"(,"tools":[{"type":"function","function":{"name":"f","parameters":)"
                                                R"({"type":"object","properties":{"a":{"$ref":"https://example.com/s.json"}}}}}])"),
                              ToolRecord("big", R"(,"tools":[{"type":"function","function":{"name":"f","parameters":)"
                                                R"({"type":"array","maxItems":100000}}}])"),
                          });
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(out[i]["response"]["status_code"], 400) << out[i].dump();
    EXPECT_THAT(out[i]["response"]["body"]["error"]["message"].get<std::string>(),
                HasSubstr("body.tools[0].function.parameters"));
  }
}

}  // namespace
}  // namespace minions::llama_runner
