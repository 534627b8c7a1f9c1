#pragma once
// JSON helpers shared by every module. Model output is arbitrary bytes: serialising it must never
// throw, so DumpJson replaces invalid UTF-8 instead of failing.

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace minions {

using Json = nlohmann::json;

// One-line serialisation (JSON Lines); invalid UTF-8 becomes U+FFFD.
std::string DumpJson(const Json& value);

// The deepest nesting of arrays and objects ParseJson accepts. Every JSON this system reads
// (records, runner and protocol lines, options) stays far below it; a deeper document is refused
// while it is being parsed, before anything is built from it, so a line of a million '[' costs
// linear time and a bounded stack (copying, comparing or printing a deep value recurses).
inline constexpr int kMaxJsonDepth = 64;

// Parses one JSON document; the error says where the text is malformed. Nesting deeper than
// `max_depth` is InvalidArgument ("nested deeper than ...").
absl::StatusOr<Json> ParseJson(std::string_view text, int max_depth = kMaxJsonDepth);

// Lenient readers for JSON that came from another process: a missing key, a null or a value of
// the wrong type gives the fallback, never an exception.
const Json& JsonField(const Json& object, const std::string& key);
int64_t JsonInt(const Json& object, const std::string& key, int64_t fallback = 0);
double JsonDouble(const Json& object, const std::string& key, double fallback = 0);
bool JsonBool(const Json& object, const std::string& key, bool fallback = false);
std::string JsonString(const Json& object, const std::string& key, const std::string& fallback = "");

// A short, printable excerpt of possibly huge or binary input, for error messages.
std::string Excerpt(std::string_view text, size_t max_len = 80);

}  // namespace minions
