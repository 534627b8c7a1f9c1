#include "runner/request_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace minions {
namespace {

bool IsFalse(const Json& v) { return v.is_boolean() && !v.get<bool>(); }
bool IsOne(const Json& v) { return v.is_number_integer() && v.get<int64_t>() == 1; }
bool IsEmptyString(const Json& v) { return v.is_string() && v.get<std::string>().empty(); }
bool IsEmptyArray(const Json& v) { return v.is_array() && v.empty(); }
[[maybe_unused]] bool IsNoTool(const Json& v) { return v.is_string() && v.get<std::string>() == "none"; }
bool IsTextModality(const Json& v) { return v.is_array() && v.size() == 1 && v[0] == "text"; }

constexpr bool kC = true, kX = false;  // readability of the endpoint columns below

// Every field of OpenAI's chat, completions and embeddings request bodies, and llama.cpp's
// server's extensions that are served. Keep docs/openai-parameters.md in step (a test compares
// them).
const std::vector<ParameterRule>& Table() {
  using S = ParameterStatus;
  static const std::vector<ParameterRule> table = {
      // name, chat, completions, embeddings, status, accepted when, why, harmless
      {"model", kC, kC, kC, S::kServed, "", "names the model; a batch runs one model, the job's", nullptr},
      {"messages", kC, kX, kX, S::kServed, "", "system, developer, user and assistant messages with text content", nullptr},
      {"prompt", kX, kC, kX, S::kServed, "", "one string (or an array of one string) per record", nullptr},
      {"input", kX, kX, kC, S::kServed, "", "a string or up to 2048 strings", nullptr},
      {"max_tokens", kC, kC, kX, S::kServed, "", "", nullptr},
      {"max_completion_tokens", kC, kX, kX, S::kServed, "", "the newer name of max_tokens", nullptr},
      {"temperature", kC, kC, kX, S::kServed, "", "0 is greedy", nullptr},
      {"top_p", kC, kC, kX, S::kServed, "", "", nullptr},
      {"seed", kC, kC, kX, S::kServed, "", "without it the seed is derived from the custom_id, so a re-run reproduces the record", nullptr},
      {"stop", kC, kC, kX, S::kServed, "", "a string or up to 4", nullptr},
      {"presence_penalty", kC, kC, kX, S::kServed, "", "-2..2, llama.cpp's penalties sampler", nullptr},
      {"frequency_penalty", kC, kC, kX, S::kServed, "", "-2..2, llama.cpp's penalties sampler", nullptr},
      {"logit_bias", kC, kC, kX, S::kServed, "", "token ids (as strings) of the model's vocabulary, -100..100", nullptr},
      {"logprobs", kC, kC, kX, S::kServed, "", "chat: true or false; completions: 0..5 alternatives per token", nullptr},
      {"top_logprobs", kC, kX, kX, S::kServed, "", "0..20, with logprobs: true", nullptr},
      {"response_format", kC, kC, kX, S::kServed, "", "text, json_object, json_schema (strict or not): decoding under a grammar", nullptr},
      {"n", kC, kC, kX, S::kServed, "", "1..16 choices, each its own seeded stream; the prompt is computed once", nullptr},
      {"top_k", kC, kC, kX, S::kServed, "", "llama.cpp's extension; 0 is off", nullptr},
      {"min_p", kC, kC, kX, S::kServed, "", "llama.cpp's extension; 0 is off", nullptr},
      {"repeat_penalty", kC, kC, kX, S::kServed, "", "llama.cpp's extension; 1 is off", nullptr},
      {"grammar", kC, kC, kX, S::kServed, "", "llama.cpp's extension: GBNF text", nullptr},
      {"json_schema", kC, kC, kX, S::kServed, "", "llama.cpp's extension: a JSON schema", nullptr},
      {"tools", kC, kX, kX, S::kServed, "", "up to 128 functions, rendered by the model's chat template", nullptr},
      {"tool_choice", kC, kX, kX, S::kServed, "", "none, auto, required or a named function; required and named decode under a grammar", nullptr},
      {"parallel_tool_calls", kC, kX, kX, S::kServed, "", "true or false, as the model's template handles it", nullptr},
      {"encoding_format", kX, kX, kC, S::kServed, "", "\"float\" only", nullptr},
      {"user", kC, kC, kC, S::kIgnored, "", "an end-user id for abuse monitoring; no effect on the answer", nullptr},
      {"safety_identifier", kC, kX, kX, S::kIgnored, "", "an end-user id for abuse monitoring; no effect on the answer", nullptr},
      {"store", kC, kX, kX, S::kIgnored, "", "OpenAI's stored completions; answers are in the batch's output file", nullptr},
      {"metadata", kC, kX, kX, S::kIgnored, "", "tags for stored completions", nullptr},
      {"service_tier", kC, kC, kX, S::kIgnored, "", "a batch is its own tier", nullptr},
      {"prompt_cache_key", kC, kX, kX, S::kIgnored, "", "a caching hint; the runner shares prompt prefixes by itself", nullptr},
      {"prompt_cache_retention", kC, kX, kX, S::kIgnored, "", "a caching hint", nullptr},
      {"stream", kC, kC, kX, S::kRefused, "false", "a batch answer is one line; there is nothing to stream", &IsFalse},
      {"stream_options", kC, kC, kX, S::kRefused, "null", "only with stream", nullptr},
      {"modalities", kC, kX, kX, S::kRefused, "[\"text\"]", "text output only", &IsTextModality},
      {"echo", kX, kC, kX, S::kRefused, "false", "the prompt is not repeated in the answer", &IsFalse},
      {"best_of", kX, kC, kX, S::kRefused, "1", "one candidate per choice", &IsOne},
      {"suffix", kX, kC, kX, S::kRefused, "\"\"", "no fill-in-the-middle", &IsEmptyString},
      {"functions", kC, kX, kX, S::kRefused, "[]", "deprecated function calling is not served", &IsEmptyArray},
      {"function_call", kC, kX, kX, S::kRefused, "\"none\"", "deprecated function calling is not served", &IsNoTool},
      {"audio", kC, kX, kX, S::kRefused, "null", "text models only", nullptr},
      {"prediction", kC, kX, kX, S::kRefused, "null", "no predicted outputs", nullptr},
      {"reasoning_effort", kC, kX, kX, S::kRefused, "null", "the model's reasoning is not controlled", nullptr},
      {"verbosity", kC, kX, kX, S::kRefused, "null", "not a control llama.cpp has", nullptr},
      {"web_search_options", kC, kX, kX, S::kRefused, "null", "no web search", nullptr},
      {"dimensions", kX, kX, kC, S::kRefused, "null", "embeddings have the model's own size", nullptr},
  };
  return table;
}

const ParameterRule* FindRule(std::string_view name) {
  for (const ParameterRule& rule : Table()) {
    if (rule.name == name) return &rule;
  }
  return nullptr;
}

bool TakesField(const ParameterRule& rule, Endpoint endpoint) {
  switch (endpoint) {
    case Endpoint::kChatCompletions: return rule.chat;
    case Endpoint::kCompletions: return rule.completions;
    case Endpoint::kEmbeddings: return rule.embeddings;
  }
  return false;
}

BodyError Invalid(std::string message, std::string_view param) {
  return {kErrorInvalidRequest, std::move(message), absl::StrCat("body.", std::string(param))};
}

// Reads an optional number field; an error when present but not a number in [min, max].
std::optional<BodyError> ReadNumber(const Json& body, const char* name, double min, double max,
                                    std::optional<double>* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return Invalid(absl::StrCat("body.", name, " must be a number"), name);
  double value = it->get<double>();
  if (!(value >= min && value <= max)) {
    return Invalid(absl::StrFormat("body.%s must be between %g and %g, got %g", name, min, max, value), name);
  }
  *out = value;
  return std::nullopt;
}

// A float field in [min, max] into *out.
std::optional<BodyError> ReadFloat(const Json& body, const char* name, double min, double max, float* out) {
  std::optional<double> value;
  if (auto err = ReadNumber(body, name, min, max, &value)) return err;
  if (value) *out = static_cast<float>(*value);
  return std::nullopt;
}

// An integer field in [min, max].
std::optional<BodyError> ReadInt(const Json& body, const char* name, int min, int max, std::optional<int>* out) {
  std::optional<double> value;
  if (auto err = ReadNumber(body, name, min, max, &value)) return err;
  if (value) {
    if (*value != std::floor(*value)) return Invalid(absl::StrCat("body.", name, " must be an integer"), name);
    *out = static_cast<int>(*value);
  }
  return std::nullopt;
}

std::optional<BodyError> ReadSampling(const Json& body, SamplingParams* sampling) {
  // OpenAI accepts max_completion_tokens as the newer name of max_tokens.
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    std::optional<int> value;
    if (auto err = ReadInt(body, name, 1, 1 << 20, &value)) return err;
    if (value) sampling->max_tokens = *value;
  }
  if (auto err = ReadFloat(body, "temperature", 0, 2, &sampling->temperature)) return err;
  if (auto err = ReadFloat(body, "top_p", 0, 1, &sampling->top_p)) return err;
  if (auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) return Invalid("body.seed must be an integer", "seed");
    sampling->seed = it->is_number_unsigned() ? it->get<uint64_t>()
                                              : static_cast<uint64_t>(it->get<int64_t>());
  }
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    const char* expected = "body.stop must be a string or an array of up to 4 strings";
    if (it->is_string()) {
      sampling->stop.push_back(it->get<std::string>());
    } else if (it->is_array() && it->size() <= 4) {
      for (const auto& s : *it) {
        if (!s.is_string()) return Invalid(expected, "stop");
        sampling->stop.push_back(s.get<std::string>());
      }
    } else {
      return Invalid(expected, "stop");
    }
    for (const auto& s : sampling->stop) {
      if (s.empty()) return Invalid("body.stop must not contain an empty string", "stop");
    }
  }
  if (auto err = ReadFloat(body, "presence_penalty", -2, 2, &sampling->presence_penalty)) return err;
  if (auto err = ReadFloat(body, "frequency_penalty", -2, 2, &sampling->frequency_penalty)) return err;
  if (auto err = ReadFloat(body, "repeat_penalty", 0, 10, &sampling->repeat_penalty)) return err;
  if (!(sampling->repeat_penalty > 0)) return Invalid("body.repeat_penalty must be greater than 0", "repeat_penalty");
  std::optional<int> top_k;
  if (auto err = ReadInt(body, "top_k", 0, 1 << 20, &top_k)) return err;
  sampling->top_k = top_k.value_or(0);
  if (auto err = ReadFloat(body, "min_p", 0, 1, &sampling->min_p)) return err;
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return Invalid("body.logit_bias must be an object of token id -> bias", "logit_bias");
    if (it->size() > 1024) return Invalid("body.logit_bias may bias at most 1024 tokens", "logit_bias");
    for (const auto& [key, value] : it->items()) {
      // Token ids as decimal strings, as OpenAI takes them (JSON object keys are strings).
      bool digits = !key.empty() && key.size() <= 9 && key.find_first_not_of("0123456789") == std::string::npos;
      if (!digits) {
        return Invalid(absl::StrCat("body.logit_bias: '", Excerpt(key, 20), "' is not a token id (a non-negative integer)"),
                       "logit_bias");
      }
      if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100)) {
        return Invalid(absl::StrCat("body.logit_bias[\"", key, "\"] must be a number between -100 and 100"),
                       "logit_bias");
      }
      sampling->logit_bias.push_back({static_cast<int32_t>(std::stol(key)), static_cast<float>(value.get<double>())});
    }
  }
  return std::nullopt;
}

std::optional<BodyError> ReadLogprobs(const Json& body, Endpoint endpoint, int* logprobs) {
  auto it = body.find("logprobs");
  const bool given = it != body.end() && !it->is_null();
  if (endpoint == Endpoint::kCompletions) {
    // The legacy shape: an integer, how many alternatives per token (OpenAI allows up to 5).
    if (!given) return std::nullopt;
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 5) {
      return Invalid("body.logprobs must be an integer between 0 and 5 (alternatives per token)", "logprobs");
    }
    *logprobs = static_cast<int>(it->get<int64_t>());
    return std::nullopt;
  }
  bool on = false;
  if (given) {
    if (!it->is_boolean()) return Invalid("body.logprobs must be true or false", "logprobs");
    on = it->get<bool>();
  }
  std::optional<int> top;
  if (auto err = ReadInt(body, "top_logprobs", 0, 20, &top)) return err;
  if (top && !on) return Invalid("body.top_logprobs needs body.logprobs: true", "top_logprobs");
  if (on) *logprobs = top.value_or(0);
  return std::nullopt;
}

std::optional<BodyError> ReadOutputFormat(const Json& body, OutputFormat* format) {
  int given = 0;
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    const char* expected =
        "body.response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
        "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}";
    if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string()) {
      return Invalid(expected, "response_format");
    }
    const std::string type = (*it)["type"].get<std::string>();
    if (type == "json_object") {
      format->kind = OutputFormat::Kind::kJsonObject;
      format->param = "body.response_format";
      ++given;
    } else if (type == "json_schema") {
      auto js = it->find("json_schema");
      if (js == it->end() || !js->is_object()) {
        return Invalid("body.response_format.json_schema must be an object with name and schema",
                       "response_format.json_schema");
      }
      if (auto strict = js->find("strict"); strict != js->end() && !strict->is_null() && !strict->is_boolean()) {
        return Invalid("body.response_format.json_schema.strict must be true or false",
                       "response_format.json_schema.strict");
      }
      auto schema = js->find("schema");
      if (schema == js->end() || schema->is_null()) {
        // OpenAI's schema is optional: without one, any JSON object.
        format->kind = OutputFormat::Kind::kJsonObject;
      } else if (!schema->is_object() && !schema->is_boolean()) {
        return Invalid("body.response_format.json_schema.schema must be a JSON schema (an object)",
                       "response_format.json_schema.schema");
      } else {
        format->kind = OutputFormat::Kind::kJsonSchema;
        format->text = DumpJson(*schema);
      }
      format->param = "body.response_format.json_schema.schema";
      ++given;
    } else if (type != "text") {
      return Invalid(expected, "response_format.type");
    }
  }
  if (auto it = body.find("json_schema"); it != body.end() && !it->is_null()) {
    if (!it->is_object() && !it->is_boolean()) return Invalid("body.json_schema must be a JSON schema (an object)", "json_schema");
    format->kind = OutputFormat::Kind::kJsonSchema;
    format->text = DumpJson(*it);
    format->param = "body.json_schema";
    ++given;
  }
  if (auto it = body.find("grammar"); it != body.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>().empty()) {
      return Invalid("body.grammar must be a non-empty string of GBNF", "grammar");
    }
    format->kind = OutputFormat::Kind::kGrammar;
    format->text = it->get<std::string>();
    format->param = "body.grammar";
    ++given;
  }
  if (given > 1) {
    return Invalid("give at most one of body.response_format (json_object or json_schema), body.json_schema and body.grammar",
                   "response_format");
  }
  return std::nullopt;
}

bool IsFunctionName(const std::string& name) {
  // OpenAI's rule: a-z, A-Z, 0-9, underscores and dashes, at most 64.
  return !name.empty() && name.size() <= 64 &&
         name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == std::string::npos;
}

std::optional<BodyError> ReadToolList(const Json& list, Json* tools) {
  if (!list.is_array() || list.size() > kMaxTools) {
    return Invalid(absl::StrCat("body.tools must be an array of at most ", kMaxTools, " tools"), "tools");
  }
  *tools = Json::array();
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& tool = list[i];
    const std::string param = absl::StrCat("tools[", i, "]");
    if (!tool.is_object() || JsonString(tool, "type") != "function" || !JsonField(tool, "function").is_object()) {
      return Invalid(absl::StrCat("body.", param, " must be {\"type\": \"function\", \"function\": {\"name\", "
                                  "\"description\", \"parameters\"}} (only function tools are served)"),
                     param);
    }
    const Json& function = tool["function"];
    for (const auto& [key, value] : function.items()) {
      if (key != "name" && key != "description" && key != "parameters" && key != "strict") {
        return Invalid(absl::StrCat("body.", param, ".function.", Excerpt(key, 40), " is not a field of a function"),
                       absl::StrCat(param, ".function"));
      }
    }
    const std::string name = JsonString(function, "name");
    if (!IsFunctionName(name)) {
      return Invalid(absl::StrCat("body.", param, ".function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -"),
                     absl::StrCat(param, ".function.name"));
    }
    for (const Json& seen : *tools) {
      if (seen["function"]["name"] == name) {
        return Invalid(absl::StrCat("body.tools: the function name '", name, "' is given twice"), param);
      }
    }
    if (auto d = function.find("description"); d != function.end() && !d->is_null() && !d->is_string()) {
      return Invalid(absl::StrCat("body.", param, ".function.description must be a string"),
                     absl::StrCat(param, ".function.description"));
    }
    if (auto st = function.find("strict"); st != function.end() && !st->is_null() && !st->is_boolean()) {
      return Invalid(absl::StrCat("body.", param, ".function.strict must be true or false"),
                     absl::StrCat(param, ".function.strict"));
    }
    Json parameters = {{"type", "object"}, {"properties", Json::object()}};  // OpenAI's default: no arguments
    if (auto p = function.find("parameters"); p != function.end() && !p->is_null()) {
      if (!p->is_object()) {
        return Invalid(absl::StrCat("body.", param, ".function.parameters must be a JSON schema (an object)"),
                       absl::StrCat(param, ".function.parameters"));
      }
      parameters = *p;
    }
    Json checked = {{"type", "function"}, {"function", {{"name", name}, {"parameters", std::move(parameters)}}}};
    if (function.contains("description") && function["description"].is_string()) {
      checked["function"]["description"] = function["description"];
    }
    tools->push_back(std::move(checked));
  }
  return std::nullopt;
}

// tools, tool_choice and parallel_tool_calls, as OpenAI checks them: a choice or parallel setting
// without tools is an error, and a named function must be one of the tools.
std::optional<BodyError> ReadTools(const Json& body, ToolParams* out) {
  const Json& list = JsonField(body, "tools");
  const Json& choice = JsonField(body, "tool_choice");
  const Json& parallel = JsonField(body, "parallel_tool_calls");
  if (!list.is_null()) {
    if (auto err = ReadToolList(list, &out->tools)) return err;
  }
  const bool has_tools = out->tools.is_array() && !out->tools.empty();
  if (!choice.is_null()) {
    const char* expected = "body.tool_choice must be \"none\", \"auto\", \"required\" or "
                           "{\"type\": \"function\", \"function\": {\"name\": ...}}";
    if (choice.is_string()) {
      const std::string c = choice.get<std::string>();
      if (c == "none") out->choice = ToolParams::Choice::kNone;
      else if (c == "auto") out->choice = ToolParams::Choice::kAuto;
      else if (c == "required") out->choice = ToolParams::Choice::kRequired;
      else return Invalid(expected, "tool_choice");
    } else if (choice.is_object() && JsonString(choice, "type") == "function" &&
               JsonField(JsonField(choice, "function"), "name").is_string()) {
      out->choice = ToolParams::Choice::kNamed;
      out->function = choice["function"]["name"].get<std::string>();
      bool known = false;
      for (const Json& tool : out->tools.is_array() ? out->tools : Json::array()) known |= tool["function"]["name"] == out->function;
      if (!known) {
        return Invalid(absl::StrCat("body.tool_choice names the function '", Excerpt(out->function, 64),
                                    "', which is not in body.tools"),
                       "tool_choice");
      }
    } else {
      return Invalid(expected, "tool_choice");
    }
    if (!has_tools && out->choice != ToolParams::Choice::kNone) {
      return Invalid("body.tool_choice is only allowed when body.tools has functions", "tool_choice");
    }
  }
  if (!parallel.is_null()) {
    if (!parallel.is_boolean()) return Invalid("body.parallel_tool_calls must be true or false", "parallel_tool_calls");
    if (!has_tools) return Invalid("body.parallel_tool_calls is only allowed when body.tools has functions", "parallel_tool_calls");
    out->parallel = parallel.get<bool>();
  }
  return std::nullopt;
}

}  // namespace

const std::vector<ParameterRule>& ParameterTable() { return Table(); }

std::optional<BodyError> CheckBodyFields(const Json& body, Endpoint endpoint, bool shorthand) {
  for (const auto& [name, value] : body.items()) {
    if (shorthand && name == "custom_id") continue;
    const ParameterRule* rule = FindRule(name);
    if (rule == nullptr || !TakesField(*rule, endpoint)) {
      return BodyError{kErrorUnsupportedParameter,
                       absl::StrCat("unsupported parameter: ", Excerpt(name, 64), " (not a parameter of ",
                                    std::string(EndpointUrl(endpoint)), " that Minions serves; see docs/openai-parameters.md)"),
                       absl::StrCat("body.", Excerpt(name, 64))};
    }
    if (rule->status != ParameterStatus::kRefused || value.is_null()) continue;
    if (rule->harmless != nullptr && rule->harmless(value)) continue;
    return BodyError{kErrorUnsupportedParameter,
                     absl::StrCat("unsupported parameter: ", name, " (", std::string(rule->why), "; accepted only as ",
                                  std::string(rule->accepted_when), ")"),
                     absl::StrCat("body.", name)};
  }
  return std::nullopt;
}

std::optional<BodyError> ReadGenerationParams(const Json& body, Endpoint endpoint, InferenceRequest* request) {
  if (auto err = ReadSampling(body, &request->sampling)) return err;
  if (auto err = ReadLogprobs(body, endpoint, &request->logprobs)) return err;
  if (auto err = ReadOutputFormat(body, &request->format)) return err;
  if (endpoint == Endpoint::kChatCompletions) {
    if (auto err = ReadTools(body, &request->tools)) return err;
    if (request->tools.Active() && request->format.kind != OutputFormat::Kind::kText) {
      // The tool-call grammar and a format's grammar cannot both constrain one answer.
      return Invalid("give either body.tools (with tool_choice other than \"none\") or an output format "
                     "(response_format json_object/json_schema, json_schema, grammar), not both",
                     "tool_choice");
    }
  }
  std::optional<int> n;
  if (auto err = ReadInt(body, "n", 1, kMaxChoices, &n)) return err;
  request->n = n.value_or(1);
  return std::nullopt;
}

}  // namespace minions
