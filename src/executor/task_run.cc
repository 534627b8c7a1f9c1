#include "executor/task_run.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runner/batch_record.h"

namespace minions {
namespace {

inline constexpr std::string_view kErrorRunnerCrashed = "runner_crashed";

// A line that goes to the error file: an error, no usable response, or a refused request (400).
bool IsErrorLine(const Json& line) { return IsErrorOutputLine(line); }

}  // namespace

std::string TaskKey(const AttemptRef& ref) { return absl::StrCat(ref.job_id, "/", ref.task_index, "#", ref.attempt); }

absl::StatusOr<std::unique_ptr<TaskRun>> TaskRun::Start(LeaseGrant lease, std::string_view input,
                                                        const Options& options, absl::Time now) {
  std::vector<std::string> records = SplitRecordLines(input);
  if (static_cast<int64_t>(records.size()) != lease.n_records) {
    return absl::DataLossError(
        absl::StrCat("the input range holds ", records.size(), " records, the task ", lease.n_records));
  }
  if (lease.resume_from < 0 || lease.resume_from > lease.n_records || lease.chunk_urls.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the lease resumes at record ", lease.resume_from, " of ",
                                                   lease.n_records, " with ", lease.chunk_urls.size(),
                                                   " chunk URLs"));
  }
  return std::unique_ptr<TaskRun>(new TaskRun(std::move(lease), std::move(records), options, now));
}

TaskRun::TaskRun(LeaseGrant lease, std::vector<std::string> records, const Options& options, absl::Time now)
    : options_(options),
      lease_(std::move(lease)),
      key_(TaskKey(lease_.ref)),
      records_(std::move(records)),
      outputs_(records_.size()),
      started_(now),
      chunk_begin_(lease_.resume_from),
      prefix_end_(lease_.resume_from),
      last_chunk_at_(now) {}

std::optional<TaskRun::Batch> TaskRun::NextBatch(absl::Time now) {
  std::vector<size_t> indices;
  if (!isolation_.empty()) {
    indices = std::move(isolation_.front());
    isolation_.pop_front();
  } else {
    for (size_t i = static_cast<size_t>(lease_.resume_from); i < outputs_.size(); ++i) {
      if (!outputs_[i]) indices.push_back(i);
    }
  }
  if (indices.empty()) return std::nullopt;
  Batch batch;
  batch.id = batches_ == 0 ? key_ : absl::StrCat(key_, ".", batches_);
  ++batches_;
  batch.records.reserve(indices.size());
  for (size_t i : indices) batch.records.push_back(records_[i]);
  batch_ = batch.id;
  batch_records_ = std::move(indices);
  in_runner_ = true;
  yielding_ = yielded_ = false;
  started_ = now;
  return batch;
}

void TaskRun::SetOutput(size_t i, Json line) {
  if (!outputs_[i]) {
    ++records_done_;
    if (IsErrorOutputLine(line)) ++records_failed_;
    ++version_;
  }
  outputs_[i] = std::move(line);
}

void TaskRun::OnResult(std::string_view batch, size_t index, Json output) {
  if (!in_runner_ || batch != batch_ || index >= batch_records_.size()) return;
  const size_t i = batch_records_[index];
  if (outputs_[i]) return;  // the first line stands
  // Stopped for the owner: this record runs again later; "cancelled" is not its answer.
  if (yielding_ && JsonString(OutputLineError(output), "code") == kErrorCancelled) return;
  SetOutput(i, std::move(output));
}

TaskRun::BatchEnd TaskRun::OnBatchDone(std::string_view batch, bool cancelled) {
  if (!in_runner_ || batch != batch_) return BatchEnd::kIgnored;
  if (yielding_ && cancelled) {
    OnRunnerGone();  // what it did not finish runs again, in its isolation group if it has one
    yielded_ = true;
    return BatchEnd::kYielded;
  }
  in_runner_ = false;
  yielding_ = false;
  if (cancelled) return BatchEnd::kCancelled;
  if (!isolation_.empty()) return BatchEnd::kRunAgain;
  for (size_t i = static_cast<size_t>(lease_.resume_from); i < outputs_.size(); ++i) {
    if (outputs_[i]) continue;
    SetOutput(i, MakeErrorLine(ParseRecordLine(records_[i]).custom_id, kErrorRunnerFailed,
                               "the runner gave no result for this record"));
  }
  return BatchEnd::kFinished;
}

std::vector<size_t> TaskRun::UnfinishedInBatch() const {
  std::vector<size_t> left;
  for (size_t i : batch_records_) {
    if (!outputs_[i]) left.push_back(i);
  }
  return left;
}

bool TaskRun::OnRunnerCrashed(bool alone, std::string_view why) {
  in_runner_ = false;
  yielding_ = false;
  if (++crashes_ > options_.max_crashes) return false;
  suspect_ = true;
  std::vector<size_t> left = UnfinishedInBatch();
  if (left.empty()) return true;
  if (!alone) {
    // Whose record killed it is unknown: this batch runs again, alone.
    isolation_.push_front(std::move(left));
    return true;
  }
  if (left.size() == 1) {
    const size_t i = left[0];
    SetOutput(i, MakeErrorLine(ParseRecordLine(records_[i]).custom_id, kErrorRunnerCrashed,
                               absl::StrCat("the runner crashed on this record, run alone: ", std::string(why))));
    return true;
  }
  // Halve the group: the half holding the poison record crashes again, the other goes through.
  std::vector<size_t> second(left.begin() + static_cast<std::ptrdiff_t>(left.size() / 2), left.end());
  left.resize(left.size() / 2);
  isolation_.push_front(std::move(second));
  isolation_.push_front(std::move(left));
  return true;
}

void TaskRun::Yield() {
  if (in_runner_) yielding_ = true;
}

void TaskRun::OnRunnerGone() {
  if (!in_runner_) return;
  in_runner_ = false;
  yielding_ = false;
  // A suspect's group keeps its place in the isolation order; any other attempt simply runs
  // whatever has no line yet (NextBatch).
  if (suspect_) {
    std::vector<size_t> left = UnfinishedInBatch();
    if (!left.empty()) isolation_.push_front(std::move(left));
  }
}

TaskRun::ChunkUpload TaskRun::MakeChunk(int64_t from, int64_t to) const {
  ChunkUpload upload;
  const int seq = static_cast<int>(chunks_.size());
  upload.urls = lease_.chunk_urls[seq];
  upload.chunk = {lease_.ref.attempt, seq, from, to, 0};
  for (int64_t i = from; i < to; ++i) {
    const Json& line = *outputs_[i];
    bool is_error = IsErrorLine(line);
    (is_error ? upload.errors : upload.output) += DumpJson(line) + "\n";
    upload.chunk.records_failed += is_error;
  }
  return upload;
}

std::optional<TaskRun::ChunkUpload> TaskRun::DueCheckpoint(absl::Time now, bool now_anyway) {
  const int64_t n = static_cast<int64_t>(records_.size());
  // The last URL pair is kept for the final chunk: with none other left, only the end uploads.
  if (chunks_.size() + 1 >= lease_.chunk_urls.size()) return std::nullopt;
  // The finished prefix only grows: each record is looked at once, whatever the result order.
  int64_t end = std::max(prefix_end_, chunk_begin_);
  while (end < n && outputs_[end]) ++end;
  prefix_end_ = end;
  if (end == chunk_begin_ || end >= n) return std::nullopt;  // nothing new, or the final chunk carries it
  bool due = now_anyway || end - chunk_begin_ >= options_.checkpoint_records ||
             now - last_chunk_at_ >= options_.checkpoint_interval;
  if (!due) return std::nullopt;
  return MakeChunk(chunk_begin_, end);
}

absl::StatusOr<std::optional<TaskRun::ChunkUpload>> TaskRun::FinalChunk() {
  const int64_t n = static_cast<int64_t>(records_.size());
  int64_t end = std::max(prefix_end_, chunk_begin_);
  while (end < n && outputs_[end]) ++end;
  prefix_end_ = end;
  if (end < n) return absl::InternalError("the final chunk has records without output");
  // Everything is in chunks already: this attempt's, or (an attempt that resumed at its end) the
  // committed ones of earlier attempts. An empty chunk is no chunk: the server refuses one.
  if (end == chunk_begin_) return std::nullopt;
  if (chunks_.size() >= lease_.chunk_urls.size()) return absl::FailedPreconditionError("no chunk URL left");
  return MakeChunk(chunk_begin_, end);
}

void TaskRun::ChunkUploaded(const Chunk& chunk, absl::Time now) {
  chunks_.push_back(chunk);
  chunk_begin_ = chunk.end;
  last_chunk_at_ = now;
  ++version_;
}

bool TaskRun::uploaded() const {
  return chunk_begin_ == static_cast<int64_t>(records_.size());
}

LeaseProgress TaskRun::Progress() const {
  LeaseProgress progress;
  progress.job_id = lease_.ref.job_id;
  progress.task_index = lease_.ref.task_index;
  progress.attempt = lease_.ref.attempt;
  progress.records_done = lease_.resume_from + records_done_;
  progress.records_failed = records_failed_;
  progress.chunks = chunks_;
  return progress;
}

LeaseProgress TaskRun::Completion() const {
  LeaseProgress report = Progress();
  report.records_done = lease_.n_records;
  report.records_failed = 0;
  for (const Chunk& chunk : chunks_) report.records_failed += chunk.records_failed;
  return report;
}

}  // namespace minions
