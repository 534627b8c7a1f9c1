#include "server/job_splitter.h"

#include "absl/strings/str_cat.h"
#include "runner/batch_record.h"

namespace minions {

void InputSplitter::Feed(std::string_view chunk) {
  size_t start = 0;
  while (start < chunk.size()) {
    size_t nl = chunk.find('\n', start);
    if (nl == std::string_view::npos) {
      partial_.append(chunk.substr(start));
      offset_ += static_cast<int64_t>(chunk.size() - start);
      return;
    }
    int64_t line_end = offset_ + static_cast<int64_t>(nl - start) + 1;  // just past the '\n'
    if (partial_.empty()) {
      EndLine(chunk.substr(start, nl - start), line_end);
    } else {
      partial_.append(chunk.substr(start, nl - start));
      EndLine(partial_, line_end);
      partial_.clear();
    }
    offset_ = line_end;
    start = nl + 1;
  }
}

void InputSplitter::EndLine(std::string_view line, int64_t line_end_offset) {
  ++line_number_;
  if (IsBlankLine(line)) return;  // not a record
  ParsedRecord parsed = ParseRecordLine(line);
  if (parsed.ok()) {
    ++valid_records_;
  } else {
    ++result_.invalid_records;
    if (result_.first_invalid.empty()) {
      result_.first_invalid = absl::StrCat("line ", line_number_, ": ", parsed.error_message);
    }
  }
  ++result_.total_records;
  if (++task_records_ == shard_size_) CloseTask(line_end_offset);
}

void InputSplitter::CloseTask(int64_t end_offset) {
  Task task;
  task.index = static_cast<int64_t>(result_.tasks.size());
  task.first_record = result_.total_records - task_records_;
  task.n_records = task_records_;
  task.byte_begin = task_begin_;
  task.byte_end = end_offset;
  result_.tasks.push_back(task);
  task_begin_ = end_offset;
  task_records_ = 0;
}

absl::StatusOr<SplitResult> InputSplitter::Finish() {
  if (!partial_.empty()) {  // a last line without '\n'
    std::string last = std::move(partial_);
    partial_.clear();
    EndLine(last, offset_);
  }
  if (task_records_ > 0) {
    CloseTask(offset_);
  } else if (!result_.tasks.empty()) {
    // Blank lines after the record that closed the last task: not records, but the ranges
    // still cover the whole input.
    result_.tasks.back().byte_end = offset_;
  }
  if (result_.total_records == 0) {
    return absl::InvalidArgumentError("the input has no records (it is empty or only blank lines)");
  }
  if (valid_records_ == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no line of the input is a valid request (expected JSONL of OpenAI Batch request lines); ",
        result_.first_invalid));
  }
  return std::move(result_);
}

absl::StatusOr<SplitResult> SplitInput(BlobStore& blobs, const std::string& input_key, int64_t shard_size) {
  if (shard_size <= 0) return absl::InvalidArgumentError("shard_size must be positive");
  InputSplitter splitter(shard_size);
  auto status = blobs.Read(input_key, [&](std::string_view chunk) {
    splitter.Feed(chunk);
    return true;
  });
  if (!status.ok()) return status;
  return splitter.Finish();
}

}  // namespace minions
