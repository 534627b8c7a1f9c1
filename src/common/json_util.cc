#include "common/json_util.h"

#include "absl/strings/str_cat.h"

namespace minions {

std::string DumpJson(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace {

// The DOM builder nlohmann's own parse() uses, with the nesting checked as each array or object
// opens: parsing stops at the first one too deep, before anything deeper is built.
class DepthLimitedDom {
 public:
  DepthLimitedDom(Json* result, int max_depth) : dom_(*result, /*allow_exceptions=*/false), max_depth_(max_depth) {}

  bool null() { return dom_.null(); }
  bool boolean(bool value) { return dom_.boolean(value); }
  bool number_integer(Json::number_integer_t value) { return dom_.number_integer(value); }
  bool number_unsigned(Json::number_unsigned_t value) { return dom_.number_unsigned(value); }
  bool number_float(Json::number_float_t value, const Json::string_t& text) { return dom_.number_float(value, text); }
  bool string(Json::string_t& value) { return dom_.string(value); }
  bool binary(Json::binary_t& value) { return dom_.binary(value); }
  bool start_object(std::size_t n) { return Open() && dom_.start_object(n); }
  bool key(Json::string_t& value) { return dom_.key(value); }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return Open() && dom_.start_array(n); }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  bool parse_error(std::size_t position, const std::string& /*last_token*/, const nlohmann::detail::exception& /*e*/) {
    error_position_ = position;
    return false;
  }

  bool too_deep() const { return too_deep_; }
  std::size_t error_position() const { return error_position_; }

 private:
  bool Open() {
    if (++depth_ <= max_depth_) return true;
    too_deep_ = true;
    return false;
  }

  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  int max_depth_;
  int depth_ = 0;
  bool too_deep_ = false;
  std::size_t error_position_ = 0;
};

}  // namespace

absl::StatusOr<Json> ParseJson(std::string_view text, int max_depth) {
  Json parsed;
  DepthLimitedDom sax(&parsed, max_depth);
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &sax, Json::input_format_t::json, /*strict=*/true);
  } catch (const std::exception& e) {  // the DOM builder refuses sizes it cannot hold
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON (", e.what(), "): ", Excerpt(text)));
  }
  if (sax.too_deep()) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON nested deeper than ", max_depth, " levels of arrays and objects: ", Excerpt(text)));
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("not valid JSON (byte ", sax.error_position(), "): ", Excerpt(text)));
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
