#include "runner/llama/chat_tools.h"

#include <exception>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "chat.h"
#include "common.h"
#include "runner/llama/record_sampler.h"

namespace minions::llama_runner {

struct ChatParser {
  common_chat_parser_params params;
};

namespace {

common_chat_msg ToCommonMessage(const ChatMessage& m) {
  common_chat_msg msg;
  msg.role = m.role;
  msg.content = m.content;
  msg.tool_call_id = m.tool_call_id;
  if (m.tool_calls.is_array()) {
    for (const Json& call : m.tool_calls) {
      msg.tool_calls.push_back({call["function"]["name"].get<std::string>(),
                                call["function"]["arguments"].get<std::string>(), call["id"].get<std::string>()});
    }
  }
  return msg;
}

common_chat_tool ToCommonTool(const Json& tool) {
  const Json& function = tool["function"];
  return {function["name"].get<std::string>(), JsonString(function, "description"), DumpJson(function["parameters"])};
}

// Each tool's parameters through the same checks as a response_format schema (repetition bounds,
// outside $refs, patterns the converter would silently widen): llama.cpp builds the tool-call
// grammar with the same converter, and would accept what it cannot express without a word.
std::string CheckToolSchemas(const Json& tools) {
  for (size_t i = 0; i < tools.size(); ++i) {
    auto grammar = SchemaToGrammar(DumpJson(tools[i]["function"]["parameters"]));
    if (!grammar.ok()) {
      return absl::StrCat("body.tools[", i, "].function.parameters: ", grammar.status().message());
    }
  }
  return "";
}

// llama.cpp's tool-call grammar lets free text come before the calls even when a call is required
// (root ::= <generation prompt> [reasoning] until-N? tool-calls). OpenAI's answer to "required" or
// a named function is the call alone, and a model that never opens its call would write text until
// max_tokens; so for those choices the optional free text in the root rule is taken out, and the
// grammar demands the call from the first token. A grammar of another shape is left as it is (the
// call is still required, only text may precede it).
std::string CallsFirst(std::string gbnf) {
  size_t root = gbnf.rfind("root ::= ", 0) == 0 ? 0 : gbnf.find("\nroot ::= ");
  if (root == std::string::npos) return gbnf;
  if (gbnf[root] == '\n') ++root;
  size_t end = gbnf.find('\n', root);
  if (end == std::string::npos) end = gbnf.size();
  std::string line = gbnf.substr(root, end - root);
  static const std::regex free_text(R"( until-[0-9]+\?)");
  std::string calls_first = std::regex_replace(line, free_text, "");
  if (calls_first == line) return gbnf;
  return gbnf.replace(root, end - root, calls_first);
}

// llama.cpp's grammar for some templates (Qwen 2.5's among them) repeats the call whatever
// parallel_tool_calls says (tool-calls ::= (tool-call space)+). With parallel_tool_calls false, or a
// named function, the answer is one call, as OpenAI's is; the repetition is taken out. A grammar of
// another shape is left as it is.
std::string OneCall(std::string gbnf) {
  static const std::regex repeated(R"((^|\n)(tool-calls ::= )\(([^\n]*)\)\+(\n|$))");
  std::smatch match;
  if (!std::regex_search(gbnf, match, repeated)) return gbnf;
  // The parentheses must be one group around the whole rule ("(a) (b)+" is not), quotes aside.
  int depth = 0;
  bool quoted = false;
  const std::string inner = match[3].str();
  for (size_t i = 0; i < inner.size(); ++i) {
    const char c = inner[i];
    if (c == '\\') ++i;
    else if (c == '"') quoted = !quoted;
    else if (!quoted && c == '(') ++depth;
    else if (!quoted && c == ')' && --depth < 0) return gbnf;
  }
  if (depth != 0 || quoted) return gbnf;
  const std::string one = match[1].str() + match[2].str() + match[3].str() + match[4].str();
  return gbnf.replace(static_cast<size_t>(match.position(0)), static_cast<size_t>(match.length(0)), one);
}

}  // namespace

std::string ToolGrammar::Key() const {
  std::string key = absl::StrCat("tools:", lazy ? 1 : 0, ":", generation_prompt.size(), ":", generation_prompt);
  for (const auto& p : trigger_patterns) absl::StrAppend(&key, "p", p.size(), ":", p);
  for (int32_t t : trigger_tokens) absl::StrAppend(&key, "t", t, ":");
  absl::StrAppend(&key, gbnf);
  return key;
}

std::unique_ptr<ChatTemplates> ChatTemplates::Create(const llama_model* model) {
  std::unique_ptr<ChatTemplates> out(new ChatTemplates());
  try {
    common_chat_templates_ptr templates = common_chat_templates_init(model, "");
    if (!templates || !common_chat_templates_was_explicit(templates.get())) return nullptr;
    auto caps = common_chat_templates_get_caps(templates.get());
    out->supports_tools_ = caps["supports_tools"] && caps["supports_tool_calls"];
    out->reasons_ = common_chat_templates_support_enable_thinking(templates.get());
    out->templates_ = templates.release();
  } catch (const std::exception&) {
    // A template llama.cpp's Jinja engine cannot parse: chat keeps the built-in formats, and
    // tools are refused with NoTemplateForTools.
    return nullptr;
  }
  return out;
}

ChatTemplates::~ChatTemplates() {
  if (templates_) common_chat_templates_free(templates_);
}

absl::Status NoTemplateForTools() {
  return absl::InvalidArgumentError(
      "body.tools: this model's chat template does not render tools (it has no template of its own, or one "
      "without tool support), so tool calls cannot be served; use a model whose template takes tools");
}

bool UsesTools(const InferenceRequest& request) {
  if (request.endpoint != Endpoint::kChatCompletions) return false;
  if (request.tools.tools.is_array() && !request.tools.tools.empty()) return true;
  for (const ChatMessage& m : request.messages) {
    if (m.role == "tool" || m.tool_calls.is_array()) return true;
  }
  return false;
}

bool ChatTemplates::Handles(const InferenceRequest& request) const {
  return request.endpoint == Endpoint::kChatCompletions && (reasons_ || UsesTools(request));
}

absl::StatusOr<RenderedChat> ChatTemplates::Render(const InferenceRequest& request) {
  const ToolParams& tools = request.tools;
  const bool has_tools = tools.tools.is_array() && !tools.tools.empty();
  if (UsesTools(request) && !supports_tools_) return NoTemplateForTools();

  common_chat_templates_inputs inputs;
  for (const ChatMessage& m : request.messages) inputs.messages.push_back(ToCommonMessage(m));
  if (has_tools) {
    // Kept by their bytes only up to kMaxCachedTools bytes: 64 records of 4 MiB tools each must
    // not pin 256 MiB (a larger array is checked each time, which its size pays for anyway).
    std::string key = DumpJson(tools.tools);
    std::string error;
    if (key.size() > kMaxCachedTools) {
      error = CheckToolSchemas(tools.tools);
    } else {
      auto it = checked_tools_.find(key);
      if (it == checked_tools_.end()) {
        if (checked_tools_.size() >= 64) checked_tools_.clear();
        it = checked_tools_.emplace(std::move(key), CheckToolSchemas(tools.tools)).first;
      }
      error = it->second;
    }
    if (!error.empty()) return absl::InvalidArgumentError(error);
    for (const Json& tool : tools.tools) {
      // A named function: the template sees that function alone and the answer must call it
      // (llama.cpp's grammar knows "required", not a name).
      if (tools.choice == ToolParams::Choice::kNamed && tool["function"]["name"] != tools.function) continue;
      inputs.tools.push_back(ToCommonTool(tool));
    }
  }
  switch (tools.choice) {
    case ToolParams::Choice::kAuto: inputs.tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO; break;
    case ToolParams::Choice::kNone: inputs.tool_choice = COMMON_CHAT_TOOL_CHOICE_NONE; break;
    case ToolParams::Choice::kRequired:
    case ToolParams::Choice::kNamed: inputs.tool_choice = COMMON_CHAT_TOOL_CHOICE_REQUIRED; break;
  }
  inputs.parallel_tool_calls = tools.parallel;
  inputs.reasoning_format = reasons_ ? COMMON_REASONING_FORMAT_AUTO : COMMON_REASONING_FORMAT_NONE;
  inputs.use_jinja = true;
  inputs.add_generation_prompt = true;
  // A fixed date: templates that print today's date would otherwise make a re-run's prompt, and
  // so its answer, depend on the day it ran.
  inputs.now = std::chrono::system_clock::time_point{};

  common_chat_params params;
  try {
    params = common_chat_templates_apply(templates_, inputs);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model's chat template could not render this request: ", Excerpt(e.what(), 300)));
  }
  RenderedChat out;
  out.prompt = std::move(params.prompt);
  out.reasons = reasons_;
  out.stops = params.additional_stops;
  if (tools.Active() && !params.grammar.empty()) {
    out.grammar.gbnf = params.grammar_lazy ? params.grammar : CallsFirst(params.grammar);
    if (!tools.parallel || tools.choice == ToolParams::Choice::kNamed) out.grammar.gbnf = OneCall(out.grammar.gbnf);
    out.grammar.lazy = params.grammar_lazy;
    for (const common_grammar_trigger& trigger : params.grammar_triggers) {
      switch (trigger.type) {
        case COMMON_GRAMMAR_TRIGGER_TYPE_WORD: out.grammar.trigger_patterns.push_back(regex_escape(trigger.value)); break;
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN: out.grammar.trigger_patterns.push_back(trigger.value); break;
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: {
          // As common_sampler anchors it: the whole output so far must match.
          std::string anchored = trigger.value;
          if (anchored.empty() || anchored.front() != '^') anchored.insert(0, "^");
          if (anchored.back() != '$') anchored += "$";
          out.grammar.trigger_patterns.push_back(std::move(anchored));
          break;
        }
        case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN: out.grammar.trigger_tokens.push_back(trigger.token); break;
      }
    }
    if (!out.grammar.lazy) out.grammar.generation_prompt = params.generation_prompt;
  }
  auto parser = std::make_shared<ChatParser>();
  parser->params = common_chat_parser_params(params);
  parser->params.reasoning_format = inputs.reasoning_format;
  parser->params.parse_tool_calls = tools.Active();
  try {
    if (!params.parser.empty()) parser->params.parser.load(params.parser);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("llama.cpp's parser for this template did not load: ", Excerpt(e.what(), 200)));
  }
  out.parser = std::move(parser);
  return out;
}

ChatAnswer ParseChatAnswer(const ChatParser& parser, const std::string& text, bool finished,
                           std::string_view custom_id, int choice) {
  ChatAnswer answer;
  common_chat_msg msg;
  try {
    msg = common_chat_parse(text, /*is_partial=*/!finished, parser.params);
  } catch (const std::exception&) {
    // Text the template's parser does not recognise (free text under "auto" that is not a call):
    // the answer is its content, as generated.
    answer.content = text;
    return answer;
  }
  if (!finished && !msg.tool_calls.empty()) {
    // A call cut off by max_tokens is not a call: the answer is the text as generated.
    answer.content = text;
    return answer;
  }
  answer.content = msg.content;
  answer.reasoning = msg.reasoning_content;
  for (size_t k = 0; k < msg.tool_calls.size(); ++k) {
    const common_chat_tool_call& call = msg.tool_calls[k];
    const uint64_t id = DefaultSeed(absl::StrCat(std::string(custom_id), "/tool_call/", choice, "/", k));
    answer.tool_calls.push_back({{"id", absl::StrFormat("call_%016x", id)},
                                 {"type", "function"},
                                 {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  }
  return answer;
}

std::optional<int> ShapeChatAnswer(const RenderedChat& chat, const std::string& text, const std::string& finish_reason,
                                   std::string_view custom_id, int choice, const llama_vocab* vocab, Json& out_choice) {
  ChatAnswer answer = ParseChatAnswer(*chat.parser, text, finish_reason == "stop", custom_id, choice);
  Json& message = out_choice["message"];
  const bool calls = !answer.tool_calls.empty();
  message["content"] = calls && answer.content.empty() ? Json(nullptr) : Json(answer.content);
  if (calls) {
    message["tool_calls"] = std::move(answer.tool_calls);
    out_choice["finish_reason"] = "tool_calls";
  }
  if (!chat.reasons) return std::nullopt;
  if (!answer.reasoning.empty()) message["reasoning_content"] = answer.reasoning;
  return static_cast<int>(common_tokenize(vocab, answer.reasoning, false, true).size());
}

}  // namespace minions::llama_runner
