// Rendering and parsing chat answers with the model's own template (chat_tools.h), on answers
// written here rather than generated (random weights never open a <think> block or choose to call a
// tool by themselves): tool_choice "auto" splits text from calls, a reasoning template's thinking
// goes to reasoning_content and is counted, a cut-off call is not a call.

#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "llama.h"
#include "runner/llama/chat_tools.h"
#include "runner/llama/test_model_writer.h"
#include "test_env.h"

namespace minions::llama_runner {
namespace {

using minions::testing::VocabDir;

// A tiny text model with `chat_template` and the small model's tokenizer.
struct TemplateModel : engine_test::VocabModel {
  TemplateModel(const std::string& chat_template, const std::string& name)
      : VocabModel("ggml-vocab-llama-spm.gguf", chat_template, "chat-tools-" + name) {}
};

std::string ReadTemplate(const std::string& file) {
  std::ifstream in(VocabDir() + "/templates/" + file);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_FALSE(text.str().empty()) << "no " << file << " under " << VocabDir() << "/templates";
  return text.str();
}

InferenceRequest ChatRequest(const std::string& extra) {
  auto parsed = ParseRecordLine(R"({"custom_id":"r1","url":"/v1/chat/completions","body":{"model":"m",)"
                                R"("messages":[{"role":"user","content":"Weather in Paris?"}])" + extra + "}}");
  EXPECT_TRUE(parsed.ok()) << parsed.error_message;
  return parsed.ok() ? *parsed.request : InferenceRequest{};
}

constexpr char kWeather[] =
    R"(,"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
    R"("properties":{"city":{"type":"string"}},"required":["city"]}}}])";

TEST(ChatTools, AutoSplitsTextFromCallsAndACutCallIsText) {
  TemplateModel m(kQwen25ToolChatTemplate, "qwen25");
  ASSERT_NE(m.model, nullptr);
  auto templates = ChatTemplates::Create(m.model);
  ASSERT_NE(templates, nullptr);
  EXPECT_TRUE(templates->supports_tools());
  EXPECT_FALSE(templates->reasons());
  InferenceRequest request = ChatRequest(kWeather);
  ASSERT_TRUE(templates->Handles(request));
  auto rendered = templates->Render(request);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  // The template wrote the tool into the prompt; "auto" waits for the call marker (lazy grammar).
  EXPECT_THAT(rendered->prompt, ::testing::HasSubstr("\"name\": \"get_weather\""));
  EXPECT_TRUE(rendered->grammar.lazy);
  EXPECT_FALSE(rendered->grammar.trigger_patterns.empty() && rendered->grammar.trigger_tokens.empty());

  const std::string answer = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  Json choice = {{"index", 0}, {"message", {{"role", "assistant"}, {"content", answer}}}, {"finish_reason", "stop"}};
  auto reasoning = ShapeChatAnswer(*rendered, answer, "stop", "r1", 0, llama_model_get_vocab(m.model), choice);
  EXPECT_FALSE(reasoning.has_value());  // the template does not reason
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["content"], "Let me look.\n");  // as llama.cpp's parser splits it
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << choice.dump();
  const Json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(Json::parse(call["function"]["arguments"].get<std::string>()), Json::parse(R"({"city":"Paris"})"));
  EXPECT_THAT(call["id"].get<std::string>(), ::testing::MatchesRegex("call_[0-9a-f]{16}"));

  // Cut off by max_tokens inside the call: no call, the raw text stays the content.
  const std::string cut = "<tool_call>\n{\"name\": \"get_weather\", \"argu";
  Json cut_choice = {{"index", 0}, {"message", {{"role", "assistant"}, {"content", cut}}}, {"finish_reason", "length"}};
  ShapeChatAnswer(*rendered, cut, "length", "r1", 0, llama_model_get_vocab(m.model), cut_choice);
  EXPECT_EQ(cut_choice["finish_reason"], "length");
  EXPECT_FALSE(cut_choice["message"].contains("tool_calls"));
  EXPECT_EQ(cut_choice["message"]["content"], cut);

  // Plain text under "auto" is the content, finish_reason unchanged.
  Json text_choice = {{"index", 0}, {"message", {{"role", "assistant"}, {"content", "Sunny."}}}, {"finish_reason", "stop"}};
  ShapeChatAnswer(*rendered, "Sunny.", "stop", "r1", 0, llama_model_get_vocab(m.model), text_choice);
  EXPECT_EQ(text_choice["finish_reason"], "stop");
  EXPECT_EQ(text_choice["message"]["content"], "Sunny.");
  EXPECT_FALSE(text_choice["message"].contains("tool_calls"));

  // "required": the grammar demands the call from the first token (no free text before it).
  auto required = templates->Render(ChatRequest(std::string(kWeather) + R"(,"tool_choice":"required")"));
  ASSERT_TRUE(required.ok()) << required.status();
  EXPECT_FALSE(required->grammar.lazy);
  EXPECT_FALSE(required->grammar.generation_prompt.empty());
  const std::string& gbnf = required->grammar.gbnf;
  const size_t root = gbnf.find("root ::= ");
  ASSERT_NE(root, std::string::npos) << gbnf;
  EXPECT_THAT(gbnf.substr(root, gbnf.find('\n', root) - root), ::testing::Not(::testing::HasSubstr("until")));
  auto rule = [](const std::string& grammar, const std::string& name) {
    size_t at = grammar.find("\n" + name + " ::= ");
    return at == std::string::npos ? std::string() : grammar.substr(at + 1, grammar.find('\n', at + 1) - at - 1);
  };
  // Parallel calls allowed (OpenAI's default): the calls repeat; with parallel_tool_calls false,
  // one call.
  EXPECT_THAT(rule(gbnf, "tool-calls"), ::testing::EndsWith(")+"));
  auto single = templates->Render(ChatRequest(std::string(kWeather) + R"(,"tool_choice":"required","parallel_tool_calls":false)"));
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ(rule(single->grammar.gbnf, "tool-calls"), "tool-calls ::= tool-call space");
}

TEST(ChatTools, AReasoningTemplatesThinkingIsSplitOutAndCounted) {
  TemplateModel m(ReadTemplate("Qwen-Qwen3-0.6B.jinja"), "qwen3");
  ASSERT_NE(m.model, nullptr);
  auto templates = ChatTemplates::Create(m.model);
  ASSERT_NE(templates, nullptr);
  ASSERT_TRUE(templates->reasons());
  // Every chat request to a reasoning template is rendered here, tools or not.
  InferenceRequest request = ChatRequest("");
  ASSERT_TRUE(templates->Handles(request));
  auto rendered = templates->Render(request);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  const std::string answer = "<think>\nThe user asks about Paris.\n</think>\n\nIt is sunny.";
  Json choice = {{"index", 0}, {"message", {{"role", "assistant"}, {"content", answer}}}, {"finish_reason", "stop"}};
  auto reasoning = ShapeChatAnswer(*rendered, answer, "stop", "r1", 0, llama_model_get_vocab(m.model), choice);
  ASSERT_TRUE(reasoning.has_value());
  EXPECT_GT(*reasoning, 0);
  EXPECT_EQ(choice["message"]["content"], "It is sunny.");
  EXPECT_THAT(choice["message"]["reasoning_content"].get<std::string>(), ::testing::HasSubstr("The user asks about Paris."));
  EXPECT_EQ(choice["finish_reason"], "stop");
}

// Plain chat (no tools, no reasoning) keeps llama_chat_apply_template: `templates` takes none of it.
void ExpectPlainChatKeepsThePlainPath(const ChatTemplates& templates) {
  EXPECT_FALSE(templates.reasons());
  EXPECT_FALSE(templates.Handles(ChatRequest("")));
}

TEST(ChatTools, AModelWithoutATemplateHasNoChatTemplates) {
  TemplateModel m("", "none");
  ASSERT_NE(m.model, nullptr);
  EXPECT_EQ(ChatTemplates::Create(m.model), nullptr);
  // The plain ChatML template renders no tools.
  TemplateModel chatml(kTestModelChatTemplate, "chatml");
  ASSERT_NE(chatml.model, nullptr);
  auto templates = ChatTemplates::Create(chatml.model);
  if (templates) {
    // Only tools, tool history or reasoning come here.
    ExpectPlainChatKeepsThePlainPath(*templates);
    EXPECT_FALSE(templates->supports_tools());
    auto rendered = templates->Render(ChatRequest(kWeather));
    ASSERT_FALSE(rendered.ok());
    EXPECT_THAT(std::string(rendered.status().message()), ::testing::HasSubstr("does not render tools"));
  }
}

TEST(ChatTools, TheBenchmarksLlama3TemplateKeepsThePlainPath) {
  TemplateModel m(kLlama3ChatTemplate, "llama3");
  ASSERT_NE(m.model, nullptr);
  auto templates = ChatTemplates::Create(m.model);
  if (templates) ExpectPlainChatKeepsThePlainPath(*templates);
}

}  // namespace
}  // namespace minions::llama_runner
