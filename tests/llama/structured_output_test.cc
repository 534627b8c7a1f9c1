// Structured outputs on the real engine: answers to generated JSON schemas (the supported subset)
// all parse and validate; llama.cpp's grammar field; a schema the converter cannot express is that
// record's error; a grammar that cannot finish within max_tokens ends "length".

#include <map>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "runner/llama/llama_engine.h"
#include "runner/llama/record_sampler.h"
#include "test_env.h"

namespace minions::llama_runner {
namespace {

using engine_test::GeneratedText;
using engine_test::ServeAll;
using ::testing::HasSubstr;

std::unique_ptr<LlamaEngine> LoadEngine() { return engine_test::LoadTextEngine(8, 1024); }

// A random schema of the supported subset, every string and array bounded (so a grammar-following
// answer always ends).
Json RandomSchema(std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  int kind = depth >= 2 ? 2 + pick(6) : pick(8);
  switch (kind) {
    case 0: {  // object: every property required, nothing else
      Json properties = Json::object(), required = Json::array();
      int n = 1 + pick(3);
      for (int i = 0; i < n; ++i) {
        std::string name = std::string(1, static_cast<char>('a' + i)) + std::to_string(pick(100));
        properties[name] = RandomSchema(rng, depth + 1);
        required.push_back(name);
      }
      return {{"type", "object"}, {"properties", properties}, {"required", required}, {"additionalProperties", false}};
    }
    case 1: {  // array
      int min = pick(2);
      return {{"type", "array"}, {"items", RandomSchema(rng, depth + 1)}, {"minItems", min}, {"maxItems", min + 1 + pick(3)}};
    }
    case 2: return {{"type", "string"}, {"maxLength", 1 + pick(8)}};
    case 3: return {{"type", "integer"}, {"minimum", -5 - pick(50)}, {"maximum", 5 + pick(500)}};
    case 4: return {{"type", "boolean"}};
    case 5: return {{"enum", Json::array({"red", "green", std::string("c") + std::to_string(pick(9))})}};
    case 6: return {{"type", "null"}};
    default: return {{"const", "fixed-" + std::to_string(pick(9))}};
  }
}

// Validates the subset RandomSchema writes; the reason when the value does not fit.
std::string Violation(const Json& schema, const Json& value, const std::string& at = "$") {
  if (schema.contains("const")) return value == schema["const"] ? "" : at + ": not the const";
  if (schema.contains("enum")) {
    for (const auto& v : schema["enum"]) {
      if (v == value) return "";
    }
    return at + ": not in the enum";
  }
  const std::string type = schema["type"];
  if (type == "object") {
    if (!value.is_object()) return at + ": not an object";
    for (const auto& name : schema["required"]) {
      if (!value.contains(name.get<std::string>())) return at + ": misses " + name.get<std::string>();
    }
    for (const auto& [name, v] : value.items()) {
      if (!schema["properties"].contains(name)) return at + ": unexpected property " + name;
      if (auto bad = Violation(schema["properties"][name], v, at + "." + name); !bad.empty()) return bad;
    }
    return "";
  }
  if (type == "array") {
    if (!value.is_array()) return at + ": not an array";
    if (value.size() < schema["minItems"].get<size_t>() || value.size() > schema["maxItems"].get<size_t>()) {
      return at + ": wrong item count";
    }
    for (size_t i = 0; i < value.size(); ++i) {
      if (auto bad = Violation(schema["items"], value[i], at + "[" + std::to_string(i) + "]"); !bad.empty()) return bad;
    }
    return "";
  }
  if (type == "string") {
    if (!value.is_string()) return at + ": not a string";
    // maxLength counts code points.
    size_t points = 0;
    for (unsigned char c : value.get<std::string>()) points += (c & 0xC0) != 0x80;
    return points <= schema["maxLength"].get<size_t>() ? "" : at + ": too long";
  }
  if (type == "integer") {
    if (!value.is_number_integer()) return at + ": not an integer";
    int64_t v = value.get<int64_t>();
    return v >= schema["minimum"].get<int64_t>() && v <= schema["maximum"].get<int64_t>() ? "" : at + ": out of range";
  }
  if (type == "boolean") return value.is_boolean() ? "" : at + ": not a boolean";
  if (type == "null") return value.is_null() ? "" : at + ": not null";
  return at + ": unknown schema";
}

std::string SchemaRecord(const std::string& id, const Json& schema, int i, bool chat) {
  Json body = {{"max_tokens", 600}, {"temperature", i % 3 == 0 ? 0.0 : 0.9}, {"seed", i}};
  Json format = {{"type", "json_schema"}, {"json_schema", {{"name", "answer"}, {"strict", i % 2 == 0}, {"schema", schema}}}};
  if (chat) {
    body["messages"] = Json::array({{{"role", "user"}, {"content", "Describe item " + std::to_string(i) + " as JSON."}}});
    body["response_format"] = format;
    return DumpJson({{"custom_id", id}, {"url", "/v1/chat/completions"}, {"body", body}});
  }
  body["prompt"] = "Item " + std::to_string(i) + " as JSON:";
  body["response_format"] = format;
  return DumpJson({{"custom_id", id}, {"url", "/v1/completions"}, {"body", body}});
}

class StructuredOutput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { InstallLlamaLogging(); }
};

TEST_F(StructuredOutput, AnswersToAHundredGeneratedSchemasParseAndValidate) {
  auto engine = LoadEngine();
  ASSERT_TRUE(engine);
  std::mt19937 rng(20261207);
  std::vector<Json> schemas;
  std::vector<std::string> lines;
  for (int i = 0; i < 100; ++i) {
    schemas.push_back(RandomSchema(rng, 0));
    lines.push_back(SchemaRecord("s" + std::to_string(i), schemas.back(), i, i % 4 != 3));
  }
  auto outputs = ServeAll(*engine, lines);
  ASSERT_EQ(outputs.size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const Json& out = outputs[i];
    ASSERT_FALSE(IsErrorOutputLine(out)) << DumpJson(out);
    const std::string text = GeneratedText(out);
    EXPECT_EQ(out["response"]["body"]["choices"][0]["finish_reason"], "stop") << schemas[i].dump() << "\n" << text;
    auto parsed = ParseJson(text);
    ASSERT_TRUE(parsed.ok()) << "record " << i << " is not JSON: " << text << "\nschema: " << schemas[i].dump();
    EXPECT_EQ(Violation(schemas[i], *parsed), "") << text << "\nschema: " << schemas[i].dump();
  }
}

TEST_F(StructuredOutput, JsonObjectAndLlamaFieldsConstrainToo) {
  auto engine = LoadEngine();
  ASSERT_TRUE(engine);
  auto outputs = ServeAll(*engine, {
      R"({"custom_id":"g","prompt":"Answer:","max_tokens":8,"temperature":0,"grammar":"root ::= \"yes\" | \"no\""})",
      R"({"custom_id":"j","prompt":"Number:","max_tokens":50,"temperature":0,"json_schema":{"type":"integer","minimum":0,"maximum":99}})",
      R"({"custom_id":"o","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"hi"}],"max_tokens":400,)"
      R"("temperature":0,"response_format":{"type":"json_object"}}})",
  });
  EXPECT_THAT(GeneratedText(outputs[0]), ::testing::AnyOf("yes", "no"));
  EXPECT_EQ(outputs[0]["response"]["body"]["choices"][0]["finish_reason"], "stop");
  auto number = ParseJson(GeneratedText(outputs[1]));
  ASSERT_TRUE(number.ok()) << GeneratedText(outputs[1]);
  EXPECT_TRUE(number->is_number_integer() && *number >= 0 && *number <= 99) << GeneratedText(outputs[1]);
  // An object with unbounded keys and strings may run out of tokens; what there is starts as one.
  std::string object = GeneratedText(outputs[2]);
  ASSERT_FALSE(object.empty());
  EXPECT_EQ(object.find_first_not_of(" \n\t"), object.find('{')) << object;
  if (outputs[2]["response"]["body"]["choices"][0]["finish_reason"] == "stop") {
    auto parsed = ParseJson(object);
    ASSERT_TRUE(parsed.ok()) << object;
    EXPECT_TRUE(parsed->is_object());
  }
}

TEST_F(StructuredOutput, AGrammarThatCannotFinishInMaxTokensEndsWithLength) {
  auto engine = LoadEngine();
  ASSERT_TRUE(engine);
  auto outputs = ServeAll(*engine, {
      R"({"custom_id":"l","prompt":"Long:","max_tokens":5,"temperature":0,"json_schema":{"type":"string","minLength":200,"maxLength":300}})",
  });
  ASSERT_FALSE(IsErrorOutputLine(outputs[0])) << DumpJson(outputs[0]);
  EXPECT_EQ(outputs[0]["response"]["body"]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(outputs[0]["response"]["body"]["usage"]["completion_tokens"], 5);
}

TEST_F(StructuredOutput, WhatTheConverterCannotExpressIsThatRecordsError) {
  auto engine = LoadEngine();
  ASSERT_TRUE(engine);
  auto outputs = ServeAll(*engine, {
      R"({"custom_id":"ref","prompt":"x","json_schema":{"$ref":"https://example.invalid/schema.json"}})",
      R"({"custom_id":"huge","prompt":"x","json_schema":{"type":"array","items":{"type":"integer"},"minItems":100000}})",
      R"({"custom_id":"gbnf","prompt":"x","grammar":"root ::= ( \"a\""})",
      R"({"custom_id":"fine","prompt":"x","max_tokens":3,"temperature":0})",
      R"({"custom_id":"pattern","prompt":"x","json_schema":{"type":"string","pattern":"^(a"}})",
  });
  auto message = [&](size_t i) { return OutputLineError(outputs[i])["message"].get<std::string>(); };
  ASSERT_TRUE(IsErrorOutputLine(outputs[0]));
  EXPECT_EQ(OutputLineError(outputs[0])["code"], "invalid_request");
  EXPECT_THAT(message(0), HasSubstr("body.json_schema"));
  EXPECT_THAT(message(0), HasSubstr("ref"));
  ASSERT_TRUE(IsErrorOutputLine(outputs[1]));
  EXPECT_THAT(message(1), HasSubstr("minItems"));
  ASSERT_TRUE(IsErrorOutputLine(outputs[2]));
  EXPECT_THAT(message(2), HasSubstr("body.grammar"));
  EXPECT_THAT(message(2), HasSubstr("expecting ')'"));
  EXPECT_FALSE(IsErrorOutputLine(outputs[3]));
  ASSERT_TRUE(IsErrorOutputLine(outputs[4]));
  EXPECT_THAT(message(4), HasSubstr("pattern"));
}

TEST_F(StructuredOutput, ASchemaIsCompiledOncePerRunner) {
  auto engine = LoadEngine();
  ASSERT_TRUE(engine);
  std::vector<std::string> lines;
  for (int i = 0; i < 12; ++i) {
    // The same schema with its keys in another order is the same bytes once parsed.
    lines.push_back(i % 2 ? R"({"custom_id":"a)" + std::to_string(i) +
                                R"(","prompt":"x","max_tokens":40,"json_schema":{"type":"boolean"}})"
                          : R"({"custom_id":"a)" + std::to_string(i) +
                                R"(","prompt":"x","max_tokens":40,"response_format":{"type":"json_schema","json_schema":{"name":"b","schema":{"type":"boolean"}}}})");
  }
  auto outputs = ServeAll(*engine, lines);
  for (auto& [i, out] : outputs) {
    ASSERT_FALSE(IsErrorOutputLine(out)) << DumpJson(out);
    EXPECT_THAT(GeneratedText(out), ::testing::AnyOf("true", "false"));
  }
  EXPECT_EQ(engine->grammars_compiled(), 1u);
}

TEST(SchemaToGrammar, NamesWhatItCannotExpress) {
  EXPECT_TRUE(SchemaToGrammar(R"({"type":"object","properties":{"a":{"type":"string"}}})").ok());
  auto huge = SchemaToGrammar(R"({"type":"object","properties":{"a":{"type":"array","maxItems":99999999}}})");
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(huge.status().message(), HasSubstr("maxItems 99999999"));
  auto bad = SchemaToGrammar(R"({"type":"string","pattern":"^(a"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("pattern"));
}

}  // namespace
}  // namespace minions::llama_runner
