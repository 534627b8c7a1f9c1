#include "runner/batch_record.h"

#include <cmath>
#include <iterator>

#include "runner/record_lines.h"
#include "runner/request_params.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/enum_names.h"

namespace minions {
namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t Fnv1a(std::string_view text, uint64_t hash = kFnvOffset) {
  for (unsigned char c : text) {
    hash ^= c;
    hash *= kFnvPrime;
  }
  return hash;
}

ParsedRecord Fail(std::string custom_id, std::string_view code, std::string message, std::string param = "") {
  ParsedRecord record;
  record.custom_id = std::move(custom_id);
  record.error_code = std::string(code);
  record.error_message = std::move(message);
  record.error_param = std::move(param);
  return record;
}

// Chat content may be a string or an array of {"type":"text","text":...} parts.
std::optional<std::string> ReadContent(const Json& content, size_t index, std::string* out) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (content.is_array()) {
    for (const auto& part : content) {
      if (!part.is_object() || JsonString(part, "type") != "text" || !part.contains("text") ||
          !part["text"].is_string()) {
        return absl::StrCat("body.messages[", index,
                            "].content: only text parts ({\"type\":\"text\",\"text\":...}) are "
                            "supported");
      }
      *out += part["text"].get<std::string>();
    }
    return std::nullopt;
  }
  return absl::StrCat("body.messages[", index, "].content must be a string");
}

// The tool-calling fields of a chat message: an assistant's tool_calls, a tool message's
// tool_call_id. Any other message carrying them is refused (they would be dropped).
std::optional<std::string> ReadToolHistory(const Json& msg, size_t index, ChatMessage* message) {
  const std::string at = absl::StrCat("body.messages[", index, "]");
  auto calls = msg.find("tool_calls");
  if (calls != msg.end() && !calls->is_null()) {
    if (message->role != "assistant") return absl::StrCat(at, ".tool_calls: only assistant messages carry tool calls");
    if (!calls->is_array() || calls->empty() || calls->size() > 128) {
      return absl::StrCat(at, ".tool_calls must be an array of 1 to 128 calls");
    }
    for (size_t k = 0; k < calls->size(); ++k) {
      const Json& call = (*calls)[k];
      const std::string call_at = absl::StrCat(at, ".tool_calls[", k, "]");
      const Json& function = JsonField(call, "function");
      if (!call.is_object() || JsonString(call, "type") != "function" || !JsonField(call, "id").is_string() ||
          !function.is_object() || !JsonField(function, "name").is_string() ||
          !JsonField(function, "arguments").is_string()) {
        return absl::StrCat(call_at, " must be {\"id\": string, \"type\": \"function\", \"function\": {\"name\": "
                            "string, \"arguments\": string of JSON}}");
      }
      // The template renders the arguments as JSON (most write them with tojson).
      if (!ParseJson(function["arguments"].get<std::string>()).ok()) {
        return absl::StrCat(call_at, ".function.arguments is not JSON text");
      }
    }
    message->tool_calls = *calls;
  }
  auto id = msg.find("tool_call_id");
  if (message->role == "tool") {
    if (id == msg.end() || !id->is_string() || id->get<std::string>().empty()) {
      return absl::StrCat(at, ": a tool message needs tool_call_id (the id of the call it answers)");
    }
    message->tool_call_id = id->get<std::string>();
  } else if (id != msg.end() && !id->is_null()) {
    return absl::StrCat(at, ".tool_call_id: only tool messages carry it");
  }
  return std::nullopt;
}

}  // namespace

bool IsBlankLine(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

std::vector<std::string_view> NonBlankLines(std::string_view data) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < data.size()) {
    size_t nl = data.find('\n', start);
    if (nl == std::string_view::npos) nl = data.size();
    std::string_view line = data.substr(start, nl - start);
    if (!IsBlankLine(line)) lines.push_back(line);
    start = nl + 1;
  }
  return lines;
}

std::vector<std::string> SplitRecordLines(std::string_view data) {
  std::vector<std::string_view> lines = NonBlankLines(data);
  return {lines.begin(), lines.end()};
}

namespace {
constexpr const char* kEndpointUrls[] = {"/v1/completions", "/v1/chat/completions", "/v1/embeddings"};
static_assert(std::size(kEndpointUrls) == static_cast<size_t>(Endpoint::kEmbeddings) + 1);
}  // namespace

std::string_view EndpointUrl(Endpoint endpoint) { return NameIn(kEndpointUrls, endpoint, ""); }

namespace {
ParsedRecord ParseRecordLineUnchecked(std::string_view line);
}  // namespace

std::string RecordTooLargeMessage(size_t bytes) {
  return absl::StrCat("the record is ", bytes, " bytes; a record may have at most ", kMaxRecordBytes,
                      " bytes (split long inputs across records)");
}

ParsedRecord ParseRecordLine(std::string_view line) {
  // Defence in depth: the parser checks every type before reading it, but a record is user input
  // and must never take a process down.
  try {
    return ParseRecordLineUnchecked(line);
  } catch (const std::exception& e) {
    return Fail("", kErrorInvalidRequest, absl::StrCat("malformed record: ", e.what()));
  }
}

namespace {

// The endpoint's own fields of a record's body into `request`: a failed record when they are
// wrong, nullopt when they are right.
std::optional<ParsedRecord> ReadPrompt(const Json& body, const std::string& custom_id, InferenceRequest* request) {
  auto p = body.find("prompt");
  if (p == body.end()) return Fail(custom_id, kErrorInvalidRequest, "missing body.prompt");
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    request->prompt = (*p)[0].get<std::string>();
  } else if (p->is_string()) {
    request->prompt = p->get<std::string>();
  } else {
    return Fail(custom_id, kErrorInvalidRequest,
                "body.prompt must be a string (one prompt per record)");
  }
  if (request->prompt.empty()) return Fail(custom_id, kErrorEmptyPrompt, "body.prompt is empty");
  return std::nullopt;
}

std::optional<ParsedRecord> ReadMessages(const Json& body, const std::string& custom_id, InferenceRequest* request) {
  auto m = body.find("messages");
  if (m == body.end() || !m->is_array() || m->empty()) {
    return Fail(custom_id, kErrorInvalidRequest,
                "body.messages must be a non-empty array of {role, content}");
  }
  for (size_t i = 0; i < m->size(); ++i) {
    const Json& msg = (*m)[i];
    if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string()) {
      return Fail(custom_id, kErrorInvalidRequest,
                  absl::StrCat("body.messages[", i, "] needs a string role"));
    }
    ChatMessage message;
    message.role = msg["role"].get<std::string>();
    if (message.role != "system" && message.role != "user" && message.role != "assistant" &&
        message.role != "developer" && message.role != "tool") {
      return Fail(custom_id, kErrorInvalidRequest,
                  absl::StrCat("body.messages[", i, "].role '", Excerpt(message.role, 40),
                               "' is not one of system, developer, user, assistant, tool"));
    }
    if (message.role == "developer") message.role = "system";
    if (auto err = ReadToolHistory(msg, i, &message)) {
      return Fail(custom_id, kErrorInvalidRequest, *err, absl::StrCat("body.messages[", i, "]"));
    }
    auto c = msg.find("content");
    if (c == msg.end() || c->is_null()) {
      // An assistant message that only calls tools has no content (OpenAI's shape).
      if (!message.tool_calls.is_array()) {
        return Fail(custom_id, kErrorInvalidRequest, absl::StrCat("body.messages[", i, "] has no content"));
      }
    } else if (auto err = ReadContent(*c, i, &message.content)) {
      return Fail(custom_id, kErrorInvalidRequest, *err);
    }
    request->messages.push_back(std::move(message));
  }
  bool any_text = false;
  for (const auto& msg : request->messages) any_text |= !msg.content.empty() || msg.tool_calls.is_array();
  if (!any_text) return Fail(custom_id, kErrorEmptyPrompt, "every message's content is empty");
  return std::nullopt;
}

std::optional<ParsedRecord> ReadInputs(const Json& body, const std::string& custom_id, InferenceRequest* request) {
  auto in = body.find("input");
  if (in == body.end()) return Fail(custom_id, kErrorInvalidRequest, "missing body.input");
  if (in->is_string()) {
    request->inputs.push_back(in->get<std::string>());
  } else if (in->is_array() && !in->empty() && in->size() <= 2048) {
    for (const auto& s : *in) {
      if (!s.is_string()) {
        return Fail(custom_id, kErrorInvalidRequest,
                    "body.input must be a string or an array of strings (token arrays are "
                    "not supported)");
      }
      request->inputs.push_back(s.get<std::string>());
    }
  } else {
    return Fail(custom_id, kErrorInvalidRequest,
                "body.input must be a string or an array of 1 to 2048 strings");
  }
  for (size_t i = 0; i < request->inputs.size(); ++i) {
    if (request->inputs[i].empty()) {
      return Fail(custom_id, kErrorEmptyPrompt, absl::StrCat("body.input[", i, "] is empty"));
    }
  }
  if (auto f = body.find("encoding_format");
      f != body.end() && !(f->is_string() && *f == "float")) {
    return Fail(custom_id, kErrorInvalidRequest, "body.encoding_format: only \"float\" is supported");
  }
  return std::nullopt;
}

ParsedRecord ParseRecordLineUnchecked(std::string_view line) {
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
  if (line.empty()) return Fail("", kErrorInvalidJson, "empty line");
  if (line.size() > kMaxRecordBytes) return Fail("", kErrorRecordTooLarge, RecordTooLargeMessage(line.size()));
  auto parsed = ParseJson(line, kMaxRecordDepth);
  if (!parsed.ok()) return Fail("", kErrorInvalidJson, std::string(parsed.status().message()));
  const Json& root = *parsed;
  if (!root.is_object()) return Fail("", kErrorInvalidRequest, "a record must be a JSON object");

  std::string custom_id;
  auto id_it = root.find("custom_id");
  if (id_it == root.end() || id_it->is_null()) {
    return Fail("", kErrorInvalidRequest, "missing custom_id (a unique string per record)");
  }
  if (id_it->is_string()) {
    custom_id = id_it->get<std::string>();
  } else if (id_it->is_number_integer()) {
    custom_id = id_it->dump();  // tolerated: numeric ids are common in hand-written files
  } else {
    return Fail("", kErrorInvalidRequest, "custom_id must be a string");
  }
  if (custom_id.empty()) return Fail("", kErrorInvalidRequest, "custom_id must not be empty");
  if (custom_id.size() > 512) {
    return Fail(custom_id.substr(0, 64), kErrorInvalidRequest, "custom_id is longer than 512 bytes");
  }

  InferenceRequest request;
  request.custom_id = custom_id;
  const Json* body = nullptr;
  if (root.contains("body") || root.contains("url")) {
    auto url_it = root.find("url");
    if (url_it == root.end() || !url_it->is_string()) {
      return Fail(custom_id, kErrorInvalidRequest,
                  "missing url (one of /v1/completions, /v1/chat/completions, /v1/embeddings)");
    }
    std::string url = url_it->get<std::string>();
    if (url == "/v1/completions") {
      request.endpoint = Endpoint::kCompletions;
    } else if (url == "/v1/chat/completions") {
      request.endpoint = Endpoint::kChatCompletions;
    } else if (url == "/v1/embeddings") {
      request.endpoint = Endpoint::kEmbeddings;
    } else {
      return Fail(custom_id, kErrorUnsupportedUrl,
                  absl::StrCat("unsupported url '", Excerpt(url, 100),
                               "'; use /v1/completions, /v1/chat/completions or /v1/embeddings"));
    }
    if (auto m = root.find("method"); m != root.end() && !(m->is_string() && *m == "POST")) {
      return Fail(custom_id, kErrorInvalidRequest, "method must be \"POST\"");
    }
    auto body_it = root.find("body");
    if (body_it == root.end() || !body_it->is_object()) {
      return Fail(custom_id, kErrorInvalidRequest, "missing body (a JSON object)");
    }
    body = &*body_it;
  } else if (root.contains("prompt")) {
    // The shorthand's fields are the body's (its custom_id is not read as one); never copied.
    request.endpoint = Endpoint::kCompletions;
    body = &root;
  } else {
    return Fail(custom_id, kErrorInvalidRequest,
                "a record needs url and body (OpenAI Batch format) or a prompt (shorthand)");
  }

  if (auto err = CheckBodyFields(*body, request.endpoint, /*shorthand=*/body == &root)) {
    return Fail(custom_id, err->code, std::move(err->message), std::move(err->param));
  }
  if (auto m = body->find("model"); m != body->end() && m->is_string()) {
    request.model = m->get<std::string>();
  }
  std::optional<ParsedRecord> failed;
  switch (request.endpoint) {
    case Endpoint::kCompletions: failed = ReadPrompt(*body, custom_id, &request); break;
    case Endpoint::kChatCompletions: failed = ReadMessages(*body, custom_id, &request); break;
    case Endpoint::kEmbeddings: failed = ReadInputs(*body, custom_id, &request); break;
  }
  if (failed) return std::move(*failed);
  if (request.endpoint != Endpoint::kEmbeddings) {
    if (auto err = ReadGenerationParams(*body, request.endpoint, &request)) {
      return Fail(custom_id, err->code, std::move(err->message), std::move(err->param));
    }
  }
  ParsedRecord record;
  record.custom_id = custom_id;
  record.request = std::move(request);
  return record;
}
}  // namespace

std::string OutputLineId(std::string_view custom_id) {
  return absl::StrFormat("batch_req_%016x", Fnv1a(custom_id));
}

uint64_t DefaultSeed(std::string_view custom_id) { return Fnv1a(custom_id, Fnv1a("seed")); }

bool IsRequestError(std::string_view code) {
  return code == kErrorInvalidJson || code == kErrorInvalidRequest || code == kErrorUnsupportedUrl ||
         code == kErrorUnsupportedParameter || code == kErrorEmptyPrompt || code == kErrorPromptTooLong ||
         code == kErrorRecordTooLarge;
}

bool IsErrorOutputLine(const Json& line) {
  if (!line.is_object() || !JsonField(line, "error").is_null()) return true;
  const Json& response = JsonField(line, "response");
  if (!response.is_object()) return true;
  const Json& status = JsonField(response, "status_code");
  return status.is_number_integer() && status.get<int64_t>() != 200;
}

Json OutputLineError(const Json& line) {
  if (!IsErrorOutputLine(line)) return nullptr;
  const Json& error = JsonField(line, "error");
  if (error.is_object()) return {{"code", JsonString(error, "code")}, {"message", JsonString(error, "message")}};
  const Json& body_error = JsonField(JsonField(JsonField(line, "response"), "body"), "error");
  return {{"code", JsonString(body_error, "code")}, {"message", JsonString(body_error, "message")}};
}

Json MakeErrorLine(std::string_view custom_id, std::string_view code, std::string_view message,
                   std::string_view param) {
  if (IsRequestError(code)) {
    // OpenAI's batch output for a request its server refused: the HTTP answer, error null.
    Json line = MakeResponseLine(custom_id, {{"error",
                                              {{"message", std::string(message)},
                                               {"type", "invalid_request_error"},
                                               {"param", param.empty() ? Json(nullptr) : Json(std::string(param))},
                                               {"code", std::string(code)}}}});
    line["custom_id"] = custom_id.empty() ? Json(nullptr) : Json(std::string(custom_id));
    line["response"]["status_code"] = 400;
    return line;
  }
  Json line;
  line["id"] = OutputLineId(custom_id);
  line["custom_id"] = custom_id.empty() ? Json(nullptr) : Json(std::string(custom_id));
  line["response"] = nullptr;
  line["error"] = {{"code", std::string(code)}, {"message", std::string(message)}};
  return line;
}

Json MakeResponseLine(std::string_view custom_id, Json body) {
  Json line;
  line["id"] = OutputLineId(custom_id);
  line["custom_id"] = std::string(custom_id);
  line["response"] = {{"status_code", 200},
                      {"request_id", absl::StrFormat("req_%016x", Fnv1a(custom_id, 7))},
                      {"body", std::move(body)}};
  line["error"] = nullptr;
  return line;
}

Json Usage::ToJson() const {
  Json usage = {{"prompt_tokens", prompt_tokens},
                {"completion_tokens", completion_tokens},
                {"total_tokens", prompt_tokens + completion_tokens}};
  if (reasoning_tokens) usage["completion_tokens_details"] = {{"reasoning_tokens", *reasoning_tokens}};
  return usage;
}

Json MakeCompletionBody(std::string_view custom_id, std::string_view model, std::string_view text,
                        std::string_view finish_reason, const Usage& usage, int64_t created) {
  return {{"id", absl::StrFormat("cmpl-%016x", Fnv1a(custom_id))},
          {"object", "text_completion"},
          {"created", created},
          {"model", std::string(model)},
          {"choices",
           Json::array({{{"index", 0},
                         {"text", std::string(text)},
                         {"logprobs", nullptr},
                         {"finish_reason", std::string(finish_reason)}}})},
          {"usage", usage.ToJson()}};
}

Json MakeChatCompletionBody(std::string_view custom_id, std::string_view model,
                            std::string_view text, std::string_view finish_reason,
                            const Usage& usage, int64_t created) {
  return {{"id", absl::StrFormat("chatcmpl-%016x", Fnv1a(custom_id))},
          {"object", "chat.completion"},
          {"created", created},
          {"model", std::string(model)},
          {"choices", Json::array({{{"index", 0},
                                    {"message", {{"role", "assistant"}, {"content", std::string(text)}}},
                                    {"logprobs", nullptr},
                                    {"finish_reason", std::string(finish_reason)}}})},
          {"usage", usage.ToJson()}};
}

Json MakeEmbeddingBody(std::string_view model, const std::vector<std::vector<float>>& embeddings,
                       int prompt_tokens) {
  Json data = Json::array();
  for (size_t i = 0; i < embeddings.size(); ++i) {
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", embeddings[i]}});
  }
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", std::string(model)},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

}  // namespace minions
