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
void ExpectInvalid(const ParsedRecord& r, const std::string& param, const std::string& says) {
  ASSERT_FALSE(r.ok()) << param;
  EXPECT_EQ(r.error_code, kErrorInvalidRequest) << r.error_message;
  EXPECT_EQ(r.error_param, param) << r.error_message;
  EXPECT_THAT(r.error_message, HasSubstr(says));
}

constexpr char kWeather[] =
    R"({"type":"function","function":{"name":"get_weather","description":"Weather of a city",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}})";

TEST(Tools, ToolsAndChoicesAreRead) {
  auto r = Chat(std::string(R"(,"tools":[)") + kWeather + R"(,{"type":"function","function":{"name":"now"}}])" +
                R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}},"parallel_tool_calls":false)");
  ASSERT_TRUE(r.ok()) << r.error_message;
  const ToolParams& t = r.request->tools;
  ASSERT_EQ(t.tools.size(), 2u);
  EXPECT_EQ(t.tools[0]["function"]["description"], "Weather of a city");
  // A function without parameters takes none (OpenAI's default), written out for the template.
  EXPECT_EQ(t.tools[1]["function"]["parameters"], Json::parse(R"({"type":"object","properties":{}})"));
  EXPECT_EQ(t.choice, ToolParams::Choice::kNamed);
  EXPECT_EQ(t.function, "get_weather");
  EXPECT_FALSE(t.parallel);
  EXPECT_TRUE(t.Active());
  for (const auto& [choice, want] : std::vector<std::pair<std::string, ToolParams::Choice>>{
           {"none", ToolParams::Choice::kNone}, {"auto", ToolParams::Choice::kAuto},
           {"required", ToolParams::Choice::kRequired}}) {
    auto c = Chat(std::string(R"(,"tools":[)") + kWeather + R"(],"tool_choice":")" + choice + "\"");
    ASSERT_TRUE(c.ok()) << c.error_message;
    EXPECT_EQ(c.request->tools.choice, want);
  }
  // tools: [] and tool_choice "none" mean no tools, as before.
  auto none = Chat(R"(,"tools":[],"tool_choice":"none","parallel_tool_calls":null)");
  ASSERT_TRUE(none.ok()) << none.error_message;
  EXPECT_FALSE(none.request->tools.Active());
}

TEST(Tools, BadToolSpecsAreRefusedNamingTheField) {
  const std::string w = kWeather;
  ExpectInvalid(Chat(R"(,"tools":{"a":1})"), "body.tools", "must be an array");
  ExpectInvalid(Chat(R"(,"tools":[{"type":"code_interpreter"}])"), "body.tools[0]", "only function tools");
  ExpectInvalid(Chat(R"(,"tools":[{"type":"function","function":{"name":"bad name!"}}])"),
                "body.tools[0].function.name", "a-z, A-Z, 0-9");
  ExpectInvalid(Chat(R"(,"tools":[{"type":"function","function":{"name":")" + std::string(65, 'a') + R"("}}])"),
                "body.tools[0].function.name", "1 to 64");
  ExpectInvalid(Chat(R"(,"tools":[{"type":"function","function":{"description":"no name"}}])"),
                "body.tools[0].function.name", "1 to 64");
  ExpectInvalid(Chat(",\"tools\":[" + w + "," + w + "]"), "body.tools[1]", "given twice");
  ExpectInvalid(Chat(R"(,"tools":[{"type":"function","function":{"name":"f","parameters":"x"}}])"),
                "body.tools[0].function.parameters", "a JSON schema");
  ExpectInvalid(Chat(R"(,"tools":[{"type":"function","function":{"name":"f","description":3}}])"),
                "body.tools[0].function.description", "a string");
  ExpectInvalid(Chat(R"(,"tools":[{"type":"function","function":{"name":"f","strict":"yes"}}])"),
                "body.tools[0].function.strict", "true or false");
  ExpectInvalid(Chat(R"(,"tools":[{"type":"function","function":{"name":"f","returns":{}}}])"),
                "body.tools[0].function", "not a field of a function");
  std::string many = ",\"tools\":[";
  for (int i = 0; i <= 128; ++i) many += (i ? "," : "") + std::string(R"({"type":"function","function":{"name":"f)") + std::to_string(i) + "\"}}";
  ExpectInvalid(Chat(many + "]"), "body.tools", "at most 128");
  // tool_choice and parallel_tool_calls need tools; a named function must be one of them.
  ExpectInvalid(Chat(R"(,"tool_choice":"auto")"), "body.tool_choice", "only allowed when body.tools");
  ExpectInvalid(Chat(R"(,"tool_choice":"required","tools":[])"), "body.tool_choice", "only allowed when body.tools");
  ExpectInvalid(Chat(R"(,"parallel_tool_calls":true)"), "body.parallel_tool_calls", "only allowed when body.tools");
  ExpectInvalid(Chat(",\"tools\":[" + w + R"(],"parallel_tool_calls":"yes")"), "body.parallel_tool_calls", "true or false");
  ExpectInvalid(Chat(",\"tools\":[" + w + R"(],"tool_choice":"always")"), "body.tool_choice", "\"required\"");
  ExpectInvalid(Chat(",\"tools\":[" + w + R"(],"tool_choice":{"type":"function","function":{"name":"other"}})"),
                "body.tool_choice", "'other', which is not in body.tools");
  ExpectInvalid(Chat(",\"tools\":[" + w + R"(],"tool_choice":{"type":"function"})"), "body.tool_choice", "\"required\"");
  // A tool-call grammar and an output format's grammar cannot both hold.
  ExpectInvalid(Chat(",\"tools\":[" + w + R"(],"response_format":{"type":"json_object"})"), "body.tool_choice", "not both");
  EXPECT_TRUE(Chat(",\"tools\":[" + w + R"(],"tool_choice":"none","response_format":{"type":"json_object"})").ok());
  // Deprecated function calling stays refused.
  ExpectRefused(Chat(R"(,"functions":[{"name":"f"}])"), "functions");
  ExpectRefused(Chat(R"(,"function_call":"auto")"), "function_call");
}

ParsedRecord ChatMessages(const std::string& messages) {
  return ParseRecordLine(R"({"custom_id":"c","url":"/v1/chat/completions","body":{"model":"m","messages":)" + messages + "}}");
}

TEST(Tools, ToolHistoryIsReadAndChecked) {
  auto r = ChatMessages(
      R"([{"role":"user","content":"weather?"},)"
      R"({"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},)"
      R"({"role":"tool","tool_call_id":"call_1","content":"sunny"}])");
  ASSERT_TRUE(r.ok()) << r.error_message;
  ASSERT_EQ(r.request->messages.size(), 3u);
  EXPECT_EQ(r.request->messages[1].tool_calls[0]["id"], "call_1");
  EXPECT_EQ(r.request->messages[2].role, "tool");
  EXPECT_EQ(r.request->messages[2].tool_call_id, "call_1");

  auto bad = [](const std::string& messages, const std::string& says) {
    auto p = ChatMessages(messages);
    ASSERT_FALSE(p.ok()) << messages;
    EXPECT_EQ(p.error_code, kErrorInvalidRequest);
    EXPECT_THAT(p.error_message, HasSubstr(says));
  };
  bad(R"([{"role":"tool","content":"sunny"}])", "needs tool_call_id");
  bad(R"([{"role":"user","content":"x","tool_calls":[]}])", "only assistant messages carry tool calls");
  bad(R"([{"role":"user","content":"x","tool_call_id":"c"}])", "only tool messages carry it");
  bad(R"([{"role":"assistant","tool_calls":[]}])", "1 to 128 calls");
  bad(R"([{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f"}}]}])", "arguments");
  bad(R"([{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{nope"}}]}])",
      "not JSON text");
  bad(R"([{"role":"assistant"}])", "has no content");
  bad(R"([{"role":"robot","content":"x"}])", "system, developer, user, assistant, tool");
}

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
