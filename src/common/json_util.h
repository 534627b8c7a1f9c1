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

// Parses one JSON document; the error says where the text is malformed.
absl::StatusOr<Json> ParseJson(std::string_view text);

// A short, printable excerpt of possibly huge or binary input, for error messages.
std::string Excerpt(std::string_view text, size_t max_len = 80);

}  // namespace minions
