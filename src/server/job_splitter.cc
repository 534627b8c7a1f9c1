#include "server/job_splitter.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runner/batch_record.h"

namespace minions {

void InputSplitter::AppendPartial(std::string_view bytes) {
  partial_bytes_ += static_cast<int64_t>(bytes.size());
  partial_blank_ = partial_blank_ && IsBlankLine(bytes);
  // Enough of an overlong line to see that it is one (and whether it is blank); no more.
  const size_t keep = kMaxRecordBytes + 1;
  if (partial_.size() < keep) partial_.append(bytes.substr(0, keep - partial_.size()));
}

void InputSplitter::Feed(std::string_view chunk) {
  size_t start = 0;
  while (start < chunk.size()) {
    size_t nl = chunk.find('\n', start);
    if (nl == std::string_view::npos) {
      AppendPartial(chunk.substr(start));
      offset_ += static_cast<int64_t>(chunk.size() - start);
      return;
    }
    int64_t line_end = offset_ + static_cast<int64_t>(nl - start) + 1;  // just past the '\n'
    if (partial_bytes_ == 0) {
      EndLine(chunk.substr(start, nl - start), line_end);
    } else {
      AppendPartial(chunk.substr(start, nl - start));
      EndLine(partial_, line_end);
      partial_.clear();
      partial_bytes_ = 0;
      partial_blank_ = true;
    }
    offset_ = line_end;
    start = nl + 1;
  }
}

void InputSplitter::EndLine(std::string_view line, int64_t line_end_offset) {
  ++line_number_;
  // Not a record. (Of an overlong line only a prefix is kept; whether all of it is blank was
  // tracked as it came.)
  if (partial_bytes_ > 0 ? partial_blank_ : IsBlankLine(line)) return;
  ++result_.total_records;
  if (too_many_tasks_) return;  // only counted, for the refusal's message
  std::string error;
  if (partial_bytes_ > static_cast<int64_t>(kMaxRecordBytes)) {
    error = RecordTooLargeMessage(static_cast<size_t>(partial_bytes_));
  } else {
    ParsedRecord parsed = ParseRecordLine(line);
    // A custom_id too long to be one is cut short in `parsed`: not an id to compare.
    const bool id_cut = !parsed.ok() && absl::StrContains(parsed.error_message, "custom_id is longer");
    if (!parsed.custom_id.empty() && !id_cut) ids_.See(parsed.custom_id, line_number_);
    if (!parsed.ok()) error = std::move(parsed.error_message);
  }
  if (error.empty()) {
    ++valid_records_;
  } else {
    ++result_.invalid_records;
    if (result_.first_invalid.empty()) result_.first_invalid = absl::StrCat("line ", line_number_, ": ", error);
  }
  if (++task_records_ == shard_size_) CloseTask(line_end_offset);
}

void InputSplitter::CloseTask(int64_t end_offset) {
  if (static_cast<int64_t>(result_.tasks.size()) >= max_tasks_) {
    too_many_tasks_ = true;
    result_.tasks.clear();  // never stored: the job is refused
    result_.tasks.shrink_to_fit();
    return;
  }
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
  if (partial_bytes_ > 0) {  // a last line without '\n'
    std::string last = std::move(partial_);
    partial_.clear();
    EndLine(last, offset_);
    partial_bytes_ = 0;
    partial_blank_ = true;
  }
  if (too_many_tasks_ || (task_records_ > 0 && static_cast<int64_t>(result_.tasks.size()) >= max_tasks_)) {
    const int64_t records = result_.total_records;
    const int64_t tasks = (records + shard_size_ - 1) / shard_size_;
    const int64_t fitting = (records + max_tasks_ - 1) / max_tasks_;
    return absl::InvalidArgumentError(absl::StrCat(
        "the input's ", records, " records at shard size ", shard_size_, " make ", tasks,
        " tasks; a job may have at most ", max_tasks_, ": submit with a shard size of at least ", fitting,
        " (--shard-size ", fitting, "), or split the input into several jobs"));
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
  if (ids_.count() > 0) return absl::InvalidArgumentError(ids_.Refusal());
  if (valid_records_ == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no line of the input is a valid request (expected JSONL of OpenAI Batch request lines); ",
        result_.first_invalid));
  }
  return std::move(result_);
}

absl::StatusOr<SplitResult> SplitInput(BlobStore& blobs, const std::string& input_key, int64_t shard_size,
                                       int64_t max_tasks, int64_t* records_seen) {
  if (shard_size <= 0) return absl::InvalidArgumentError("shard_size must be positive");
  if (max_tasks <= 0) return absl::InvalidArgumentError("max_tasks must be positive");
  InputSplitter splitter(shard_size, max_tasks);
  auto status = blobs.Read(input_key, [&](std::string_view chunk) {
    splitter.Feed(chunk);
    return true;
  });
  if (!status.ok()) return status;
  absl::StatusOr<SplitResult> result = splitter.Finish();
  if (records_seen != nullptr) *records_seen = splitter.records_seen();
  return result;
}

}  // namespace minions
