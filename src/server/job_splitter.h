#pragma once
// JobSplitter: reads a job's input once, validates every line, and cuts it into tasks of
// `shard_size` records on newline-aligned byte ranges. A bad line stays in its task (the runner
// turns it into that record's error line, so every record gets exactly one output line); the
// input as a whole is refused only when it holds no valid record at all, when two records share a
// custom_id (server/duplicate_ids.h: their answers could not be told apart), or when it would make
// more tasks than a job may have.
//
// Limits: a line longer than kMaxRecordBytes is kept only up to that size (memory stays bounded
// whatever the input) and becomes that record's error; past `max_tasks` tasks the rest of the
// input is only counted, not parsed, so the refusal can say which shard size would fit.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "blob/blob_store.h"
#include "model/types.h"
#include "server/duplicate_ids.h"

namespace minions {

struct SplitResult {
  std::vector<Task> tasks;       // job_id unset; index, first_record, n_records, byte range set
  int64_t total_records = 0;     // non-blank lines
  int64_t invalid_records = 0;   // lines that will become error lines
  std::string first_invalid;     // "line N: message" of the first bad line
};

// The most tasks one job may have unless the server says otherwise (ServerOptions).
inline constexpr int64_t kDefaultMaxTasksPerJob = 10000;

// Splits a whole input held in memory (tests) or streamed from the store.
// `records_seen` (optional) gets the records counted, also when the input is refused.
absl::StatusOr<SplitResult> SplitInput(BlobStore& blobs, const std::string& input_key, int64_t shard_size,
                                       int64_t max_tasks = kDefaultMaxTasksPerJob, int64_t* records_seen = nullptr);

// Incremental form: feed chunks, then Finish().
class InputSplitter {
 public:
  explicit InputSplitter(int64_t shard_size, int64_t max_tasks = kDefaultMaxTasksPerJob)
      : shard_size_(shard_size), max_tasks_(max_tasks) {}
  void Feed(std::string_view chunk);
  // InvalidArgument when the input holds no record, or no valid one, or two records with one
  // custom_id (naming their lines), or makes more than `max_tasks` tasks.
  absl::StatusOr<SplitResult> Finish();
  // Records counted so far (after Finish, all of them, whether or not it refused the input).
  int64_t records_seen() const { return result_.total_records; }

 private:
  void EndLine(std::string_view line, int64_t line_end_offset);
  void CloseTask(int64_t end_offset);

  void AppendPartial(std::string_view bytes);

  int64_t shard_size_;
  int64_t max_tasks_;
  SplitResult result_;
  DuplicateCustomIds ids_;     // the custom_ids seen, hashed
  std::string partial_;        // the current line, when it spans chunks (at most kMaxRecordBytes + 1)
  int64_t partial_bytes_ = 0;  // its real length, which may exceed what partial_ keeps
  bool partial_blank_ = true;  // every byte of it so far is blank
  bool too_many_tasks_ = false;  // past max_tasks_: lines are only counted
  int64_t offset_ = 0;         // bytes fed so far
  int64_t line_number_ = 0;
  int64_t task_begin_ = 0;     // byte offset where the open task starts
  int64_t task_records_ = 0;
  int64_t valid_records_ = 0;
};

}  // namespace minions
