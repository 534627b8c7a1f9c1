#pragma once
// Chat requests that need the model's own Jinja template, through llama.cpp's common chat engine
// (common_chat_templates, as llama-server --jinja uses it): requests with tools, histories with
// tool calls and tool results, and every chat request to a model whose template reasons
// (<think>...). The engine renders the prompt here, decodes under the tool-call grammar llama.cpp
// builds for that template (lazy for tool_choice "auto": free text until the model opens a call;
// from the first token for "required" and a named function), and parses the answer with
// llama.cpp's parser for the template into content, reasoning_content and tool_calls. Other chat
// requests keep llama_chat_apply_template (the same text for the formats both know, and cheaper).
//
// Ownership: ChatTemplates owns one model's parsed templates; a RenderedChat owns one record's
// prompt, grammar and parser (shared by the record's choices). Threads: the engine's serving
// thread only.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/json_util.h"
#include "runner/batch_record.h"

struct llama_model;
struct llama_vocab;
struct common_chat_templates;

namespace minions::llama_runner {

// The grammar a tool-calling answer decodes under.
struct ToolGrammar {
  std::string gbnf;  // empty: no constraint
  bool lazy = false;  // only from the first trigger on (tool_choice "auto")
  std::vector<std::string> trigger_patterns;  // regexes (lazy)
  std::vector<int32_t> trigger_tokens;        // tokens (lazy)
  // Not lazy: the text the grammar's root starts with that the template already put at the end
  // of the prompt (e.g. "<|im_start|>assistant\n"); the grammar is advanced over it first.
  std::string generation_prompt;
  // The cache key of the compiled grammar.
  std::string Key() const;
};

struct ChatParser;  // llama.cpp's parser settings for one rendered request (chat_tools.cc)

struct RenderedChat {
  std::string prompt;
  ToolGrammar grammar;
  std::vector<std::string> stops;  // the template's own stop strings, beside the request's
  std::shared_ptr<const ChatParser> parser;
  bool reasons = false;  // the template reasons: the answer's reasoning is split out and counted
};

// An answer split the way the template wrote it.
struct ChatAnswer {
  std::string content;
  std::string reasoning;              // reasoning_content ("" when none)
  Json tool_calls = Json::array();    // OpenAI's shape: [{id, type: "function", function: {name, arguments}}]
};

class ChatTemplates {
 public:
  // Null when the model stores no chat template (such a model cannot take tools).
  static std::unique_ptr<ChatTemplates> Create(const llama_model* model);
  ~ChatTemplates();
  ChatTemplates(const ChatTemplates&) = delete;
  ChatTemplates& operator=(const ChatTemplates&) = delete;

  // True when the request is rendered here (tools, tool history, or a reasoning template).
  bool Handles(const InferenceRequest& request) const;
  bool supports_tools() const { return supports_tools_; }
  bool reasons() const { return reasons_; }
  // The prompt, grammar and parser of a chat request; InvalidArgument naming what the template
  // or the tool-call grammar could not take (a tool schema the converter cannot express, ...).
  absl::StatusOr<RenderedChat> Render(const InferenceRequest& request);

 private:
  ChatTemplates() = default;
  common_chat_templates* templates_ = nullptr;
  bool supports_tools_ = false;
  bool reasons_ = false;
  // Tools arrays already checked (their compact JSON -> the error, "" when fine), so a job whose
  // records share one tools array converts its schemas once; at most 64 kept.
  std::unordered_map<std::string, std::string> checked_tools_;
  static constexpr size_t kMaxCachedTools = 64 << 10;
};

// True when a chat request has tools or tool-calling history (only a template that renders tools
// can serve it).
bool UsesTools(const InferenceRequest& request);
// Why a request that needs tools cannot be served by a model whose template does not render them.
absl::Status NoTemplateForTools();

// Splits the generated text with the record's parser. `finished`: the answer ended by itself (not
// cut by max_tokens): only then are tool calls read out of it (a cut call is not a call). Tool
// call ids are derived from the custom_id, the choice and the call's place, so re-runs repeat
// them.
ChatAnswer ParseChatAnswer(const ChatParser& parser, const std::string& text, bool finished,
                           std::string_view custom_id, int choice);

// Writes a finished chat choice the way OpenAI does for tools and reasoning: message.content (null
// when the answer is only tool calls), message.tool_calls, message.reasoning_content, and
// finish_reason "tool_calls" when the answer ended by itself with calls. Returns the reasoning's
// token count when the template reasons (nullopt otherwise).
std::optional<int> ShapeChatAnswer(const RenderedChat& chat, const std::string& text, const std::string& finish_reason,
                                   std::string_view custom_id, int choice, const llama_vocab* vocab, Json& out_choice);

}  // namespace minions::llama_runner
