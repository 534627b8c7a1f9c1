#include "runner/batch_record.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace minions {
namespace {

using ::testing::HasSubstr;

TEST(ParseRecordLine, ChatCompletionWithSampling) {
  auto r = ParseRecordLine(R"({"custom_id":"a1","method":"POST","url":"/v1/chat/completions",
    "body":{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],
    "max_tokens":12,"temperature":0.5,"top_p":0.9,"seed":7,"stop":["\n\n","END"]}})");
  ASSERT_TRUE(r.ok()) << r.error_message;
  EXPECT_EQ(r.custom_id, "a1");
  const auto& q = *r.request;
  EXPECT_EQ(q.endpoint, Endpoint::kChatCompletions);
  ASSERT_EQ(q.messages.size(), 2u);
  EXPECT_EQ(q.messages[1].role, "user");
  EXPECT_EQ(q.messages[1].content, "hi");
  EXPECT_EQ(q.sampling.max_tokens, 12);
  EXPECT_FLOAT_EQ(q.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(q.sampling.top_p, 0.9f);
  EXPECT_EQ(q.sampling.seed, 7u);
  EXPECT_THAT(q.sampling.stop, ::testing::ElementsAre("\n\n", "END"));
}

TEST(ParseRecordLine, ShorthandPromptIsACompletion) {
  auto r = ParseRecordLine(R"({"custom_id":"s","prompt":"Once upon a time","max_tokens":5})");
  ASSERT_TRUE(r.ok()) << r.error_message;
  EXPECT_EQ(r.request->endpoint, Endpoint::kCompletions);
  EXPECT_EQ(r.request->prompt, "Once upon a time");
  EXPECT_EQ(r.request->sampling.max_tokens, 5);
}

TEST(ParseRecordLine, ChatContentPartsAreJoined) {
  auto r = ParseRecordLine(R"({"custom_id":"p","url":"/v1/chat/completions","body":{"messages":[
    {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}})");
  ASSERT_TRUE(r.ok()) << r.error_message;
  EXPECT_EQ(r.request->messages[0].content, "ab");
}

TEST(ParseRecordLine, EmbeddingsTakeAStringOrAnArray) {
  auto one = ParseRecordLine(R"({"custom_id":"e1","url":"/v1/embeddings","body":{"input":"x"}})");
  ASSERT_TRUE(one.ok());
  EXPECT_THAT(one.request->inputs, ::testing::ElementsAre("x"));
  auto many = ParseRecordLine(R"({"custom_id":"e2","url":"/v1/embeddings","body":{"input":["x","y"]}})");
  ASSERT_TRUE(many.ok());
  EXPECT_EQ(many.request->inputs.size(), 2u);
}

struct BadLine {
  const char* line;
  const char* code;
  const char* custom_id;   // what the error line should carry
  const char* message_part;
};

class BadLines : public ::testing::TestWithParam<BadLine> {};

TEST_P(BadLines, GiveAnErrorThatSaysWhatIsWrong) {
  const BadLine& bad = GetParam();
  auto r = ParseRecordLine(bad.line);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error_code, bad.code);
  EXPECT_EQ(r.custom_id, bad.custom_id);
  EXPECT_THAT(r.error_message, HasSubstr(bad.message_part));
}

INSTANTIATE_TEST_SUITE_P(
    Corpus, BadLines,
    ::testing::Values(
        BadLine{"", "invalid_json", "", "empty line"},
        BadLine{"{\"custom_id\": \"x\", oops", "invalid_json", "", "not valid JSON"},
        BadLine{"[1,2]", "invalid_request", "", "JSON object"},
        BadLine{R"({"prompt":"p"})", "invalid_request", "", "missing custom_id"},
        BadLine{R"({"custom_id":"","prompt":"p"})", "invalid_request", "", "must not be empty"},
        BadLine{R"({"custom_id":{"a":1},"prompt":"p"})", "invalid_request", "", "custom_id must be a string"},
        BadLine{R"({"custom_id":"u","url":"/v1/images","body":{}})", "unsupported_url", "u", "unsupported url"},
        BadLine{R"({"custom_id":"m","method":"GET","url":"/v1/completions","body":{"prompt":"p"}})", "invalid_request", "m", "POST"},
        BadLine{R"({"custom_id":"b","url":"/v1/completions"})", "invalid_request", "b", "missing body"},
        BadLine{R"({"custom_id":"n","url":"/v1/completions","body":{}})", "invalid_request", "n", "body.prompt"},
        BadLine{R"({"custom_id":"e","prompt":""})", "empty_prompt", "e", "empty"},
        BadLine{R"({"custom_id":"c","url":"/v1/chat/completions","body":{"messages":[]}})", "invalid_request", "c", "non-empty array"},
        BadLine{R"({"custom_id":"r","url":"/v1/chat/completions","body":{"messages":[{"role":"wizard","content":"x"}]}})", "invalid_request", "r", "role"},
        BadLine{R"({"custom_id":"z","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":""}]}})", "empty_prompt", "z", "empty"},
        BadLine{R"({"custom_id":"t","prompt":"p","temperature":9})", "invalid_request", "t", "temperature must be between 0 and 2"},
        BadLine{R"({"custom_id":"k","prompt":"p","max_tokens":0})", "invalid_request", "k", "max_tokens"},
        BadLine{R"({"custom_id":"k2","prompt":"p","max_tokens":2.5})", "invalid_request", "k2", "integer"},
        BadLine{R"({"custom_id":"s","prompt":"p","stop":[1]})", "invalid_request", "s", "body.stop"},
        BadLine{R"({"custom_id":"nn","prompt":"p","n":17})", "invalid_request", "nn", "body.n must be between 1 and 16"},
        BadLine{R"({"custom_id":"i","url":"/v1/embeddings","body":{"input":[1,2]}})", "invalid_request", "i", "token arrays"},
        BadLine{R"({"custom_id":"x","foo":1})", "invalid_request", "x", "url and body"},
        BadLine{R"({"custom_id":"f","prompt":"p","foo":1})", "unsupported_parameter", "f", "unsupported parameter: foo"}));

TEST(ParseRecordLine, WrongTypesAnywhereNeverThrow) {
  // Every field of every endpoint given every JSON type: each line parses or gives an error.
  const char* values[] = {"null", "true", "1", "-7", "1e300", "\"s\"", "[]", "[1]", "[\"a\"]", "{}",
                          "{\"type\":5}", "[{\"type\":5}]", "[{\"role\":1}]"};
  const char* fields[] = {"prompt", "messages", "input", "max_tokens", "temperature", "top_p",
                          "seed", "stop", "n", "model", "encoding_format", "max_completion_tokens"};
  const char* urls[] = {"/v1/completions", "/v1/chat/completions", "/v1/embeddings"};
  int parsed = 0;
  for (const char* url : urls) {
    for (const char* field : fields) {
      for (const char* value : values) {
        std::string line = std::string(R"({"custom_id":"w","url":")") + url + R"(","body":{")" + field +
                           "\":" + value + "}}";
        ParsedRecord r = ParseRecordLine(line);
        parsed += r.ok();
        if (!r.ok()) {
          EXPECT_FALSE(r.error_message.empty()) << line;
        }
      }
    }
  }
  EXPECT_LT(parsed, 3 * 12 * 13);
}

TEST(OutputLines, ResponseLineFollowsTheOpenAIBatchShape) {
  Json line = MakeResponseLine("r1", MakeCompletionBody("r1", "m", "hello", "stop", {3, 1}, 100));
  EXPECT_EQ(line["custom_id"], "r1");
  EXPECT_TRUE(line["error"].is_null());
  EXPECT_EQ(line["response"]["status_code"], 200);
  EXPECT_EQ(line["response"]["body"]["choices"][0]["text"], "hello");
  EXPECT_EQ(line["response"]["body"]["usage"]["total_tokens"], 4);
  // Deterministic ids: a re-run of a record writes the same line.
  EXPECT_EQ(line["id"], MakeResponseLine("r1", Json::object())["id"]);
  EXPECT_NE(line["id"], MakeResponseLine("r2", Json::object())["id"]);
}

TEST(OutputLines, AWrongRequestIsA400ResponseAsInOpenAIsBatchOutput) {
  Json line = MakeErrorLine("r9", kErrorUnsupportedParameter, "unsupported parameter: tools", "body.tools");
  EXPECT_TRUE(line["error"].is_null());
  EXPECT_EQ(line["response"]["status_code"], 400);
  EXPECT_EQ(line["response"]["body"]["error"],
            Json({{"message", "unsupported parameter: tools"}, {"type", "invalid_request_error"},
                  {"param", "body.tools"}, {"code", "unsupported_parameter"}}));
  EXPECT_TRUE(line["response"]["request_id"].is_string());
  EXPECT_TRUE(IsErrorOutputLine(line));
  EXPECT_EQ(OutputLineError(line), Json({{"code", "unsupported_parameter"}, {"message", "unsupported parameter: tools"}}));
  EXPECT_TRUE(MakeErrorLine("", kErrorInvalidJson, "bad")["custom_id"].is_null());
  EXPECT_TRUE(MakeErrorLine("u", kErrorUnsupportedUrl, "no")["response"]["body"]["error"]["param"].is_null());
}

TEST(OutputLines, WhatIsNotAnAnswerKeepsTheErrorObject) {
  for (std::string_view code : {kErrorCancelled, kErrorRunnerFailed}) {
    Json line = MakeErrorLine("r9", code, "no");
    EXPECT_TRUE(line["response"].is_null());
    EXPECT_EQ(line["error"]["code"], std::string(code));
    EXPECT_EQ(line["error"]["message"], "no");
    EXPECT_TRUE(IsErrorOutputLine(line));
    EXPECT_EQ(OutputLineError(line)["code"], std::string(code));
  }
  Json served = MakeResponseLine("ok", Json::object());
  EXPECT_FALSE(IsErrorOutputLine(served));
  EXPECT_TRUE(OutputLineError(served).is_null());
}

TEST(OutputLines, InvalidUtf8InModelTextIsReplacedNotFatal) {
  Json line = MakeResponseLine("u", MakeCompletionBody("u", "m", std::string("a\xff\xfe" "b"), "stop", {}, 0));
  std::string text = DumpJson(line);
  EXPECT_THAT(text, HasSubstr("\"a\xEF\xBF\xBD"));
}

// The attack of issue 17: one 2 MB line of a million nested '[' in the shorthand crashed the
// server (deep copies and prints recurse). It must be that record's error, in linear time.
TEST(ParseRecordLine, AMillionNestedArraysAreThatRecordsErrorNotACrash) {
  std::string line = R"({"custom_id":"deep","prompt":)" + std::string(1'000'000, '[') + std::string(1'000'000, ']') + "}";
  ASSERT_LT(line.size(), kMaxRecordBytes);
  ParsedRecord r = ParseRecordLine(line);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.error_code, kErrorInvalidJson);
  EXPECT_THAT(r.error_message, HasSubstr("nested deeper than 64"));
  // Unbalanced, and objects: the same.
  EXPECT_THAT(ParseRecordLine(std::string(500'000, '[')).error_message, HasSubstr("nested deeper"));
  std::string objects;
  for (int i = 0; i < 100'000; ++i) objects += R"({"a":)";
  EXPECT_THAT(ParseRecordLine(objects).error_message, HasSubstr("nested deeper"));
}

TEST(ParseRecordLine, NestingUpToTheLimitIsAccepted) {
  // A body nested 60 deep (in an ignored field) is still a request (the prompt is what is served).
  std::string deep = std::string(60, '[') + std::string(60, ']');
  ParsedRecord r = ParseRecordLine(R"({"custom_id":"ok","prompt":"p","user":)" + deep + "}");
  ASSERT_TRUE(r.ok()) << r.error_message;
  EXPECT_EQ(r.custom_id, "ok");
}

TEST(ParseRecordLine, ALineLongerThanTheLimitIsThatRecordsError) {
  std::string prompt(kMaxRecordBytes, 'x');
  ParsedRecord r = ParseRecordLine(R"({"custom_id":"big","prompt":")" + prompt + R"("})");
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.error_code, kErrorRecordTooLarge);
  EXPECT_THAT(r.error_message, HasSubstr("at most 4194304 bytes"));
  // Just under the limit is fine.
  ParsedRecord fits = ParseRecordLine(R"({"custom_id":"fits","prompt":")" + prompt.substr(0, kMaxRecordBytes - 100) + R"("})");
  EXPECT_TRUE(fits.ok()) << fits.error_message;
}

TEST(ParseJson, DepthIsCheckedWhileParsing) {
  EXPECT_TRUE(ParseJson("[[[1]]]", 3).ok());
  auto too_deep = ParseJson("[[[[1]]]]", 3);
  ASSERT_FALSE(too_deep.ok());
  EXPECT_THAT(too_deep.status().message(), HasSubstr("nested deeper than 3"));
  auto bad = ParseJson("{\"a\": tru}");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("not valid JSON (byte"));
  EXPECT_FALSE(ParseJson("[1] trailing").ok());
  EXPECT_FALSE(ParseJson("").ok());
  ASSERT_TRUE(ParseJson(R"({"a":[1,{"b":null}],"c":"d"})").ok());
  EXPECT_EQ((*ParseJson(R"({"a":[1,{"b":null}]})"))["a"][1]["b"], nullptr);
}

}  // namespace
}  // namespace minions
