#pragma once
// The check of a batch's input file before it becomes a job (POST /v1/batches): every line a
// request to the batch's endpoint with a unique custom_id, all for one model. The file is fed in
// chunks as it is read; the errors are OpenAI's batch errors ({"code", "message", "param",
// "line"}), the first max_errors of them.
//
// Threads: one caller (the request's).

#include <cstdint>
#include <string>
#include <string_view>

#include "common/json_util.h"
#include "server/duplicate_ids.h"

namespace minions::openai {

class BatchInputCheck {
 public:
  // A line longer than this is not a request.
  static constexpr size_t kMaxLineBytes = size_t{64} << 20;

  BatchInputCheck(std::string endpoint, int max_errors) : endpoint_(std::move(endpoint)), max_errors_(max_errors) {}

  // Checks the whole lines of the next chunk; false once the unfinished line is longer than
  // kMaxLineBytes (reading may stop).
  bool Feed(std::string_view chunk);
  // After the last chunk: checks the last line (or refuses it as too long) and an empty file.
  void Finish();
  // Notes an error (kept while fewer than max_errors are).
  void Error(const std::string& code, const std::string& message, int64_t line, const Json& param);

  const Json& errors() const { return errors_; }
  // The model the requests name ("" when none named one).
  const std::string& model() const { return model_; }

 private:
  void CheckLine(std::string_view line);

  const std::string endpoint_;
  const int max_errors_;
  Json errors_ = Json::array();
  DuplicateCustomIds custom_ids_;  // the check every submission path makes (server/duplicate_ids.h)
  std::string model_;
  int64_t line_number_ = 0;
  int64_t records_ = 0;
  std::string pending_;  // the unfinished line
};

}  // namespace minions::openai
