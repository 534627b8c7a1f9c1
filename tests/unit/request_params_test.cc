// The body fields of a record: each one served, ignored as harmless, or refused by name; and the
// table in docs/openai-parameters.md lists exactly the fields the code knows.
#include "runner/request_params.h"

#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace minions {
namespace {

using ::testing::HasSubstr;

ParsedRecord Chat(const std::string& extra) {
  return ParseRecordLine(R"({"custom_id":"c","url":"/v1/chat/completions","body":{"model":"m",)"
                         R"("messages":[{"role":"user","content":"hi"}])" + extra + "}}");
}
ParsedRecord Completion(const std::string& extra) {
  return ParseRecordLine(R"({"custom_id":"p","url":"/v1/completions","body":{"model":"m","prompt":"hi")" + extra + "}}");
}
ParsedRecord Embedding(const std::string& extra) {
  return ParseRecordLine(R"({"custom_id":"e","url":"/v1/embeddings","body":{"model":"m","input":"hi")" + extra + "}}");
}

void ExpectRefused(const ParsedRecord& r, const std::string& name) {
  ASSERT_FALSE(r.ok()) << name;
  EXPECT_EQ(r.error_code, kErrorUnsupportedParameter) << name;
  EXPECT_THAT(r.error_message, HasSubstr("unsupported parameter: " + name));
}

TEST(BodyFields, AnUnknownFieldIsRefusedByName) {
  ExpectRefused(Chat(R"(,"temprature":0.5)"), "temprature");
  ExpectRefused(Completion(R"(,"made_up":{"a":1})"), "made_up");
  ExpectRefused(Embedding(R"(,"temperature":0)"), "temperature");  // not an embeddings field
  ExpectRefused(ParseRecordLine(R"({"custom_id":"s","prompt":"p","bogus":null})"), "bogus");
  // Another endpoint's field.
  ExpectRefused(Chat(R"(,"prompt":"x")"), "prompt");
  ExpectRefused(Completion(R"(,"top_logprobs":2)"), "top_logprobs");
}

TEST(BodyFields, RefusedFieldsPassOnlyWithTheirNotUsedValues) {
  ExpectRefused(Chat(R"(,"stream":true)"), "stream");
  EXPECT_TRUE(Chat(R"(,"stream":false)").ok());
  ExpectRefused(Chat(R"(,"tools":[{"type":"function","function":{"name":"f"}}])"), "tools");
  EXPECT_TRUE(Chat(R"(,"tools":[],"tool_choice":"none","parallel_tool_calls":null)").ok());
  ExpectRefused(Chat(R"(,"tool_choice":"auto")"), "tool_choice");
  ExpectRefused(Chat(R"(,"parallel_tool_calls":true)"), "parallel_tool_calls");
  ExpectRefused(Chat(R"(,"functions":[{"name":"f"}])"), "functions");
  ExpectRefused(Chat(R"(,"audio":{"voice":"alloy"})"), "audio");
  ExpectRefused(Chat(R"(,"modalities":["text","audio"])"), "modalities");
  EXPECT_TRUE(Chat(R"(,"modalities":["text"])").ok());
  ExpectRefused(Chat(R"(,"reasoning_effort":"low")"), "reasoning_effort");
  ExpectRefused(Completion(R"(,"echo":true)"), "echo");
  ExpectRefused(Completion(R"(,"best_of":3)"), "best_of");
  ExpectRefused(Completion(R"(,"suffix":"end")"), "suffix");
  EXPECT_TRUE(Completion(R"(,"echo":false,"best_of":1,"suffix":"")").ok());
  ExpectRefused(Embedding(R"(,"dimensions":64)"), "dimensions");
}

TEST(BodyFields, HarmlessFieldsAreAccepted) {
  EXPECT_TRUE(Chat(R"(,"user":"u1","store":false,"metadata":{"k":"v"},"service_tier":"auto",)"
                   R"("safety_identifier":"x","prompt_cache_key":"k")").ok());
  EXPECT_TRUE(Completion(R"(,"user":"u1","service_tier":"default")").ok());
  EXPECT_TRUE(Embedding(R"(,"user":"u1","encoding_format":"float")").ok());
}

TEST(BodyFields, PenaltiesBiasesAndLlamaSamplersAreRead) {
  auto r = Chat(R"(,"presence_penalty":0.5,"frequency_penalty":-1,"repeat_penalty":1.2,"top_k":40,)"
                R"("min_p":0.05,"logit_bias":{"15":-100,"7":2.5})");
  ASSERT_TRUE(r.ok()) << r.error_message;
  const SamplingParams& s = r.request->sampling;
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, -1.0f);
  EXPECT_FLOAT_EQ(s.repeat_penalty, 1.2f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_FLOAT_EQ(s.min_p, 0.05f);
  ASSERT_EQ(s.logit_bias.size(), 2u);
  EXPECT_FALSE(s.Plain());
  EXPECT_TRUE(Chat(R"(,"temperature":0.7,"top_p":0.9,"seed":3)").request->sampling.Plain());
  EXPECT_EQ(Chat(R"(,"n":16)").request->n, 16);
  EXPECT_EQ(Chat("").request->n, 1);
}

TEST(BodyFields, OutOfRangeValuesSayWhatIsExpected) {
  struct Case {
    std::string extra, message;
  } cases[] = {
      {R"(,"presence_penalty":3)", "presence_penalty must be between -2 and 2"},
      {R"(,"frequency_penalty":"x")", "frequency_penalty must be a number"},
      {R"(,"logit_bias":{"abc":1})", "is not a token id"},
      {R"(,"logit_bias":{"-5":1})", "is not a token id"},
      {R"(,"logit_bias":{"5":101})", "between -100 and 100"},
      {R"(,"logit_bias":[1])", "must be an object"},
      {R"(,"top_k":-1)", "top_k must be between"},
      {R"(,"top_k":1.5)", "top_k must be an integer"},
      {R"(,"min_p":2)", "min_p must be between"},
      {R"(,"repeat_penalty":0)", "repeat_penalty must be greater than 0"},
      {R"(,"logprobs":3)", "logprobs must be true or false"},
      {R"(,"top_logprobs":3)", "needs body.logprobs: true"},
      {R"(,"logprobs":true,"top_logprobs":21)", "top_logprobs must be between 0 and 20"},
      {R"(,"response_format":{"type":"xml"})", "body.response_format must be"},
      {R"(,"response_format":{"type":"json_schema"})", "json_schema must be an object"},
      {R"(,"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":3}})", "must be a JSON schema"},
      {R"(,"grammar":"")", "body.grammar must be a non-empty string"},
      {R"(,"n":17)", "body.n must be between 1 and 16"},
      {R"(,"n":0)", "body.n must be between 1 and 16"},
      {R"(,"n":2.5)", "body.n must be an integer"},
      {R"(,"grammar":"root ::= \"a\"","json_schema":{"type":"string"})", "at most one of"},
  };
  for (const Case& c : cases) {
    auto r = Chat(c.extra);
    ASSERT_FALSE(r.ok()) << c.extra;
    EXPECT_EQ(r.error_code, kErrorInvalidRequest) << c.extra;
    EXPECT_THAT(r.error_message, HasSubstr(c.message)) << c.extra;
  }
  auto legacy = Completion(R"(,"logprobs":6)");
  ASSERT_FALSE(legacy.ok());
  EXPECT_THAT(legacy.error_message, HasSubstr("between 0 and 5"));
}

TEST(BodyFields, LogprobsTakeTheShapeOfTheirEndpoint) {
  EXPECT_EQ(Chat("").request->logprobs, -1);
  EXPECT_EQ(Chat(R"(,"logprobs":false)").request->logprobs, -1);
  EXPECT_EQ(Chat(R"(,"logprobs":true)").request->logprobs, 0);
  EXPECT_EQ(Chat(R"(,"logprobs":true,"top_logprobs":20)").request->logprobs, 20);
  EXPECT_EQ(Completion(R"(,"logprobs":3)").request->logprobs, 3);
  EXPECT_EQ(Completion(R"(,"logprobs":0)").request->logprobs, 0);
}

TEST(BodyFields, OutputFormatsAreRead) {
  auto object = Chat(R"(,"response_format":{"type":"json_object"})");
  ASSERT_TRUE(object.ok());
  EXPECT_EQ(object.request->format.kind, OutputFormat::Kind::kJsonObject);
  auto schema = Chat(R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,)"
                     R"("schema":{"type":"object","properties":{"a":{"type":"integer"}}}}})");
  ASSERT_TRUE(schema.ok()) << schema.error_message;
  EXPECT_EQ(schema.request->format.kind, OutputFormat::Kind::kJsonSchema);
  EXPECT_EQ(schema.request->format.text, R"({"properties":{"a":{"type":"integer"}},"type":"object"})");
  auto llama = Completion(R"(,"json_schema":{"type":"string"})");
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama.request->format.kind, OutputFormat::Kind::kJsonSchema);
  auto grammar = Completion(R"(,"grammar":"root ::= \"yes\" | \"no\"")");
  ASSERT_TRUE(grammar.ok());
  EXPECT_EQ(grammar.request->format.kind, OutputFormat::Kind::kGrammar);
  EXPECT_EQ(Chat(R"(,"response_format":{"type":"text"})").request->format.kind, OutputFormat::Kind::kText);
}

// docs/openai-parameters.md has one table row per parameter the code knows, with its status.
TEST(BodyFields, TheDocsTableListsEveryParameter) {
  std::ifstream in(std::string(MINIONS_TEST_SOURCE_DIR) + "/docs/openai-parameters.md");
  ASSERT_TRUE(in) << "docs/openai-parameters.md is missing";
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  for (const ParameterRule& rule : ParameterTable()) {
    const char* status = rule.status == ParameterStatus::kServed    ? "served"
                         : rule.status == ParameterStatus::kIgnored ? "ignored"
                                                                    : "refused";
    std::string row = "| `" + std::string(rule.name) + "` |";
    size_t at = doc.find(row);
    ASSERT_NE(at, std::string::npos) << "no row for " << rule.name;
    std::string line = doc.substr(at, doc.find('\n', at) - at);
    EXPECT_THAT(line, HasSubstr(status)) << rule.name;
  }
}

}  // namespace
}  // namespace minions
