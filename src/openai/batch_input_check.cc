#include "openai/batch_input_check.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace minions::openai {

bool BatchInputCheck::Feed(std::string_view chunk) {
  pending_.append(chunk);
  size_t start = 0, eol;
  while ((eol = pending_.find('\n', start)) != std::string::npos) {
    CheckLine(std::string_view(pending_).substr(start, eol - start));
    start = eol + 1;
  }
  pending_.erase(0, start);
  return pending_.size() <= kMaxLineBytes;
}

void BatchInputCheck::Finish() {
  if (pending_.size() > kMaxLineBytes) {
    Error("line_too_long", "This line is longer than 64 MiB.", line_number_ + 1, nullptr);
  } else if (!pending_.empty()) {
    CheckLine(pending_);
  }
  if (records_ == 0 && errors_.empty()) Error("empty_file", "The input file has no requests.", 0, nullptr);
}

void BatchInputCheck::Error(const std::string& code, const std::string& message, int64_t line, const Json& param) {
  if (static_cast<int>(errors_.size()) < max_errors_) {
    errors_.push_back(Json{{"code", code}, {"message", message}, {"param", param}, {"line", line}});
  }
}

void BatchInputCheck::CheckLine(std::string_view line) {
  ++line_number_;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (absl::StripAsciiWhitespace(absl::string_view(line.data(), line.size())).empty()) return;
  ++records_;
  auto parsed = ParseJson(line);
  if (!parsed.ok() || !parsed->is_object()) {
    return Error("invalid_json_line",
                 absl::StrCat("This line is not a JSON object: ",
                              parsed.ok() ? "another JSON value" : std::string(parsed.status().message())),
                 line_number_, nullptr);
  }
  const Json& r = *parsed;
  if (!r.contains("custom_id") || !r["custom_id"].is_string() || r["custom_id"].get<std::string>().empty()) {
    return Error("missing_required_parameter", "The request has no custom_id (a non-empty string).", line_number_,
                 "custom_id");
  }
  const std::string& custom_id = r["custom_id"].get_ref<const std::string&>();
  if (int64_t first = custom_ids_.See(custom_id, line_number_); first > 0) {
    DuplicateCustomIds::Duplicate d{custom_id.substr(0, DuplicateCustomIds::kShownIdBytes), line_number_, first};
    return Error("duplicate_custom_id", absl::StrCat("The ", DuplicateCustomIds::Describe(d), "; each request needs its own."),
                 line_number_, "custom_id");
  }
  if (JsonString(r, "method") != "POST") {
    return Error("invalid_method", "The request's method must be POST.", line_number_, "method");
  }
  if (JsonString(r, "url") != endpoint_) {
    return Error("mismatched_endpoint",
                 absl::StrCat("The request's url '", JsonString(r, "url").substr(0, 80), "' is not the batch's endpoint ",
                              endpoint_, "."),
                 line_number_, "url");
  }
  const Json& body = JsonField(r, "body");
  if (!body.is_object() || !body.contains("model") || !body["model"].is_string()) {
    return Error("missing_required_parameter", "The request's body has no model.", line_number_, "body.model");
  }
  const std::string named = body["model"].get<std::string>();
  if (model_.empty()) {
    model_ = named;
  } else if (named != model_) {
    return Error("mismatched_model",
                 absl::StrCat("The request's model '", named.substr(0, 80), "' differs from the first request's '",
                              model_.substr(0, 80), "': a batch runs one model (split the file by model)."),
                 line_number_, "body.model");
  }
}

}  // namespace minions::openai
