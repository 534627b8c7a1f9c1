#include "common/json_util.h"

#include "absl/strings/str_cat.h"

namespace minions {

std::string DumpJson(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::StatusOr<Json> ParseJson(std::string_view text) {
  Json parsed = Json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    // Re-parse with exceptions only on the error path to get the position of the fault.
    try {
      Json reparsed = Json::parse(text);
      (void)reparsed;
    } catch (const Json::parse_error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("not valid JSON (byte ", e.byte, "): ", Excerpt(text)));
    }
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", Excerpt(text)));
  }
  return parsed;
}

const Json& JsonField(const Json& object, const std::string& key) {
  static const Json* const kNull = new Json();
  if (!object.is_object()) return *kNull;
  auto it = object.find(key);
  return it == object.end() ? *kNull : *it;
}

int64_t JsonInt(const Json& object, const std::string& key, int64_t fallback) {
  const Json& v = JsonField(object, key);
  return v.is_number() ? v.get<int64_t>() : fallback;
}

double JsonDouble(const Json& object, const std::string& key, double fallback) {
  const Json& v = JsonField(object, key);
  return v.is_number() ? v.get<double>() : fallback;
}

bool JsonBool(const Json& object, const std::string& key, bool fallback) {
  const Json& v = JsonField(object, key);
  return v.is_boolean() ? v.get<bool>() : fallback;
}

std::string JsonString(const Json& object, const std::string& key, const std::string& fallback) {
  const Json& v = JsonField(object, key);
  return v.is_string() ? v.get<std::string>() : fallback;
}

std::string Excerpt(std::string_view text, size_t max_len) {
  std::string out;
  for (char c : text.substr(0, max_len)) {
    unsigned char u = static_cast<unsigned char>(c);
    out.push_back(u >= 0x20 && u < 0x7f ? c : '?');
  }
  if (text.size() > max_len) out += "...";
  return out;
}

}  // namespace minions
