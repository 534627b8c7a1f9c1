#pragma once
// The body fields of a record, one by one: which are served, which are ignored as harmless, and
// which are refused (docs/openai-parameters.md is the same table for people). A field that is on
// none of the lists is refused too: a request is never served with part of it dropped in silence.
//
// Parsing is pure and engine-independent (the llama.cpp runner checks what needs the model, such
// as logit_bias token ids against the vocabulary, and compiles schemas into grammars).

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_util.h"
#include "runner/batch_record.h"

namespace minions {

// Why a body was not accepted: an error code of batch_record.h, a message that names the field
// and says what is expected, and the field's path ("body.logit_bias").
struct BodyError {
  std::string_view code;
  std::string message;
  std::string param;
};

// How a body field is treated.
enum class ParameterStatus {
  kServed,    // honoured as OpenAI (or llama.cpp's server, for its extensions) defines it
  kIgnored,   // accepted and without effect on the answer (bookkeeping fields such as user)
  kRefused,   // the record's error line names it ("unsupported parameter: X")
};

// One row of the parameter table.
struct ParameterRule {
  std::string_view name;
  bool chat, completions, embeddings;  // which endpoints' bodies may carry it
  ParameterStatus status;
  // For kRefused: the values that mean "not used" and are accepted (e.g. stream: false); for
  // everything: why it is treated so. Shown in errors and in the docs' table.
  std::string_view accepted_when;
  std::string_view why;
  // kRefused: true for a value that means "not used" (null is always such a value).
  bool (*harmless)(const Json& value) = nullptr;
};
const std::vector<ParameterRule>& ParameterTable();

// Refuses the first field of `body` that the endpoint does not take: not in the table, or refused
// with a value that is not one of its harmless ones. `shorthand`: the body is the record itself,
// which carries custom_id beside the completions fields.
std::optional<BodyError> CheckBodyFields(const Json& body, Endpoint endpoint, bool shorthand);

// Reads the generation fields (sampling, penalties, logit_bias, logprobs, output format) of a
// completions or chat body into `request`.
std::optional<BodyError> ReadGenerationParams(const Json& body, Endpoint endpoint, InferenceRequest* request);

}  // namespace minions
