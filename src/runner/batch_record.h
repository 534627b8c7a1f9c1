#pragma once
// The record format: OpenAI Batch request lines in, OpenAI Batch output lines out.
//
//   in:  {"custom_id": "...", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
//        or the shorthand {"custom_id": "...", "prompt": "..."} (a /v1/completions request)
//   out: {"id": "...", "custom_id": "...", "response": {"status_code": 200, "request_id": "...",
//        "body": {...}}, "error": null}
//        or, for a request that is wrong (what an HTTP server answers with 400), as OpenAI's batch
//        output has it: "response": {"status_code": 400, "request_id": "...", "body": {"error":
//        {"message", "type": "invalid_request_error", "param", "code"}}}, "error": null;
//        or, for what is not an answer to the request (cancelled, expired, the engine failed),
//        "response": null and "error": {"code": "...", "message": "..."}.
//
// Parsing is pure and engine-independent, so every runner (and the server's validation) shares it.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/json_util.h"

namespace minions {

enum class Endpoint { kCompletions, kChatCompletions, kEmbeddings };
std::string_view EndpointUrl(Endpoint endpoint);

struct ChatMessage {
  std::string role;  // system (developer too), user, assistant, tool
  std::string content;
  // assistant: the calls it made, OpenAI's tool_calls array as given (checked: id, type
  // "function", function {name, arguments string}); null when none.
  Json tool_calls;
  std::string tool_call_id;  // tool: the call this message answers
};

// Tool calling (chat): the functions the model may call and whether it must.
struct ToolParams {
  enum class Choice { kAuto, kNone, kRequired, kNamed };
  // The request's tools array, checked ({"type": "function", "function": {"name", "description",
  // "parameters"}}); null when the request has none.
  Json tools;
  Choice choice = Choice::kAuto;
  std::string function;  // kNamed: the function the answer must call
  bool parallel = true;  // parallel_tool_calls (OpenAI's default: true)
  // True when the answer may contain tool calls (tools given, tool_choice not "none").
  bool Active() const { return tools.is_array() && !tools.empty() && choice != Choice::kNone; }
};

struct LogitBias {
  int32_t token = 0;  // checked against the model's vocabulary by the runner
  float bias = 0;     // -100..100 (OpenAI's range); -100 forbids the token
};

struct SamplingParams {
  // Unset: the runner's default for the endpoint (OpenAI: 16 for completions).
  std::optional<int> max_tokens;
  float temperature = 1.0f;  // 0 means greedy
  float top_p = 1.0f;
  // Unset: derived from the custom_id, so that re-running a record reproduces its output.
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  // OpenAI's penalties (-2..2) and biases, and llama.cpp's extensions; neutral by default.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repeat_penalty = 1.0f;  // llama.cpp's multiplicative penalty; 1 is off
  int top_k = 0;                // 0 is off
  float min_p = 0.0f;           // 0 is off
  std::vector<LogitBias> logit_bias;
  // True when only temperature, top_p, seed and stop shape the sampling: the runner's plain path
  // (argmax for greedy, a three-stage chain otherwise), which costs nothing per token.
  bool Plain() const {
    return presence_penalty == 0 && frequency_penalty == 0 && repeat_penalty == 1 && top_k == 0 &&
           min_p == 0 && logit_bias.empty();
  }
};

// A constraint on the generated text (structured outputs): decoding follows a grammar.
struct OutputFormat {
  enum class Kind {
    kText,        // no constraint
    kJsonObject,  // any JSON object (response_format json_object)
    kJsonSchema,  // response_format json_schema, or llama.cpp's json_schema field
    kGrammar,     // llama.cpp's grammar field: GBNF text
  };
  Kind kind = Kind::kText;
  // kJsonSchema: the schema as compact JSON (also the runner's cache key); kGrammar: the GBNF.
  std::string text;
  // Where it came from, for error messages ("body.response_format.json_schema.schema").
  std::string param;
};

// One validated request.
struct InferenceRequest {
  std::string custom_id;
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                  // as the request named it (informational)
  std::string prompt;                 // kCompletions
  std::vector<ChatMessage> messages;  // kChatCompletions
  std::vector<std::string> inputs;    // kEmbeddings
  SamplingParams sampling;
  OutputFormat format;
  ToolParams tools;  // kChatCompletions
  // Log probabilities of generated tokens: -1 none; otherwise how many alternatives per token
  // (chat: logprobs true and top_logprobs 0..20; completions: the integer logprobs 0..5).
  int logprobs = -1;
  // Choices per record (1..kMaxChoices): each its own seeded stream, the prompt computed once.
  int n = 1;
};
inline constexpr int kMaxChoices = 16;
// Functions in one request's tools (OpenAI's limit).
inline constexpr size_t kMaxTools = 128;

// Error codes of per-record errors (the "code" of an error line).
inline constexpr std::string_view kErrorInvalidJson = "invalid_json";
inline constexpr std::string_view kErrorInvalidRequest = "invalid_request";
inline constexpr std::string_view kErrorUnsupportedUrl = "unsupported_url";
inline constexpr std::string_view kErrorPromptTooLong = "context_length_exceeded";
inline constexpr std::string_view kErrorEmptyPrompt = "empty_prompt";
inline constexpr std::string_view kErrorCancelled = "cancelled";
inline constexpr std::string_view kErrorRunnerFailed = "runner_error";
inline constexpr std::string_view kErrorRecordTooLarge = "record_too_large";
// A body field that is neither served nor on the harmless list (docs/openai-parameters.md).
inline constexpr std::string_view kErrorUnsupportedParameter = "unsupported_parameter";

// Limits on one input line, checked before and while it is parsed: a longer line, or JSON nested
// deeper, is that record's error (never a crash, never a refusal of the whole input).
inline constexpr size_t kMaxRecordBytes = size_t{4} << 20;
inline constexpr int kMaxRecordDepth = kMaxJsonDepth;
// The error message of a line longer than kMaxRecordBytes.
std::string RecordTooLargeMessage(size_t bytes);

// The outcome of parsing one line: a request, or an error that names the record when it can.
struct ParsedRecord {
  std::string custom_id;  // empty when the line did not carry a usable custom_id
  std::optional<InferenceRequest> request;
  std::string error_code;
  std::string error_message;
  std::string error_param;  // the field at fault ("body.n"), when known
  bool ok() const { return request.has_value(); }
};

// A line of only spaces, tabs and '\r' is not a record (blank lines are skipped everywhere).
bool IsBlankLine(std::string_view line);
// The records of a newline-delimited chunk (a task's byte range), blank lines dropped.
std::vector<std::string> SplitRecordLines(std::string_view data);

// Validates one input line. Never throws; every problem becomes an error the user can act on.
ParsedRecord ParseRecordLine(std::string_view line);

// Deterministic ids derived from the custom_id: a re-run of a record writes an identical line.
std::string OutputLineId(std::string_view custom_id);
uint64_t DefaultSeed(std::string_view custom_id);

// Output lines.
// A record that was not served: a 400 response for the codes of a wrong request (IsRequestError),
// the error object for the others. `param` names the field at fault when known ("body.n").
Json MakeErrorLine(std::string_view custom_id, std::string_view code, std::string_view message,
                   std::string_view param = "");
// True for the codes of a request that is wrong in itself (invalid_json, invalid_request,
// unsupported_url, unsupported_parameter, empty_prompt, context_length_exceeded, record_too_large).
bool IsRequestError(std::string_view code);
// True when an output line belongs in the error file: an error, no response, or a response whose
// status is not 200.
bool IsErrorOutputLine(const Json& line);
// The {code, message} of a line that failed, from either shape; null for a served line.
Json OutputLineError(const Json& line);
Json MakeResponseLine(std::string_view custom_id, Json body);

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  // Of completion_tokens, those of the answer's reasoning (models whose template reasons; then
  // reported as completion_tokens_details.reasoning_tokens).
  std::optional<int> reasoning_tokens;
  Json ToJson() const;
};

// Response bodies, in the shapes of OpenAI's endpoints.
Json MakeCompletionBody(std::string_view custom_id, std::string_view model, std::string_view text,
                        std::string_view finish_reason, const Usage& usage, int64_t created);
Json MakeChatCompletionBody(std::string_view custom_id, std::string_view model,
                            std::string_view text, std::string_view finish_reason,
                            const Usage& usage, int64_t created);
Json MakeEmbeddingBody(std::string_view model, const std::vector<std::vector<float>>& embeddings,
                       int prompt_tokens);

}  // namespace minions
