#include "server/job_finalizer.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "runner/batch_record.h"
#include "server/keys.h"

namespace minions {

inline constexpr std::string_view kErrorTaskFailed = "task_failed";
inline constexpr std::string_view kErrorBatchExpired = "batch_expired";  // the OpenAI Batch API's code

absl::StatusOr<Job> JobFinalizer::Finalize(const std::string& job_id) {
  auto job = store_->GetJob(job_id);
  if (!job.ok()) return job.status();
  if (job->state != JobState::kFinalizing) return *job;
  auto tasks = store_->ListTasks(job_id);
  if (!tasks.ok()) return tasks.status();

  // The pieces of the two files, in input order. A task contributes its committed chunks whatever
  // its end (a failed or expired task keeps what it finished), then one error line per record it
  // never finished. Pieces are fetched one at a time, so a job's results are never held in memory.
  struct Piece {
    std::string key;            // a chunk object, or
    const Task* unfinished = nullptr;  // error lines for this task's records after its chunks
  };
  std::vector<Piece> output_pieces, error_pieces;
  for (const Task& task : *tasks) {
    for (const Chunk& c : task.chunks) {
      output_pieces.push_back({keys::ChunkOutput(job_id, task.index, c.attempt, c.seq)});
      error_pieces.push_back({keys::ChunkErrors(job_id, task.index, c.attempt, c.seq)});
    }
    if (task.state != TaskState::kSucceeded && CommittedRecords(task) < task.n_records) {
      error_pieces.push_back({"", &task});
    }
  }
  auto unfinished_lines = [&](const Task& task) -> absl::StatusOr<std::string> {
    auto input = blobs_->GetRange(job->spec.input_key, task.byte_begin, task.byte_end - task.byte_begin);
    if (!input.ok()) return input.status();
    const bool expired = task.state == TaskState::kCancelled;
    std::string lines;
    std::vector<std::string> records = SplitRecordLines(*input);
    for (size_t i = CommittedRecords(task); i < records.size(); ++i) {
      ParsedRecord parsed = ParseRecordLine(records[i]);
      lines += DumpJson(expired ? MakeErrorLine(parsed.custom_id, kErrorBatchExpired,
                                                "the job's completion window passed before this record ran")
                                : MakeErrorLine(parsed.custom_id, kErrorTaskFailed,
                                                absl::StrCat("the task holding this record failed: ", task.last_error)));
      lines += '\n';
    }
    return lines;
  };
  auto source = [&](const std::vector<Piece>& pieces, bool errors) {
    return [&, errors, next = size_t{0}]() mutable -> absl::StatusOr<std::string> {
      while (next < pieces.size()) {
        const Piece& piece = pieces[next++];
        if (piece.unfinished) {
          auto lines = unfinished_lines(*piece.unfinished);
          if (!lines.ok() || !lines->empty()) return lines;
          continue;
        }
        auto data = blobs_->Get(piece.key);
        if (absl::IsNotFound(data.status())) {
          if (errors) continue;  // a chunk without error lines writes no error object
          // Every committed chunk was uploaded before it was reported: a missing one means the
          // object store lost it. Refuse to publish results without those records.
          return absl::DataLossError(absl::StrCat(piece.key, " is missing from the object store"));
        }
        if (!data.ok()) return data.status();
        if (data->empty()) continue;
        // A file whose last line lacks its '\n' must not run into the next piece's first line.
        if (data->back() != '\n') data->push_back('\n');
        return *std::move(data);
      }
      return std::string();
    };
  };

  const std::string output_key = keys::JobOutput(job_id);
  const std::string errors_key = keys::JobErrors(job_id);
  const std::string manifest_key = keys::JobManifest(job_id);
  if (auto s = blobs_->PutStream(output_key, source(output_pieces, false)); !s.ok()) return s;
  if (auto s = blobs_->PutStream(errors_key, source(error_pieces, true)); !s.ok()) return s;
  Json manifest_tasks = Json::array();
  bool expired = false;
  for (const Task& task : *tasks) {
    expired |= task.state == TaskState::kCancelled;
    Json entry = {{"index", task.index},
                  {"state", std::string(TaskStateName(task.state))},
                  {"first_record", task.first_record},
                  {"n_records", task.n_records},
                  {"records_failed", task.records_failed},
                  {"attempt", task.attempt},
                  {"preemptions", task.preemptions},
                  {"failures", task.failures}};
    Json chunks = Json::array();
    for (const Chunk& c : task.chunks) {
      chunks.push_back({{"attempt", c.attempt},
                        {"begin", c.begin},
                        {"end", c.end},
                        {"records_failed", c.records_failed},
                        {"output_key", keys::ChunkOutput(job_id, task.index, c.attempt, c.seq)},
                        {"errors_key", keys::ChunkErrors(job_id, task.index, c.attempt, c.seq)}});
    }
    entry["chunks"] = std::move(chunks);
    if (task.state != TaskState::kSucceeded) entry["error"] = task.last_error;
    manifest_tasks.push_back(std::move(entry));
  }
  Json manifest = {{"job_id", job_id},
                   {"request_counts", {{"total", job->counts.total},
                                       {"completed", job->counts.completed},
                                       {"failed", job->counts.failed}}},
                   {"output_key", output_key},
                   {"errors_key", errors_key},
                   {"tasks", std::move(manifest_tasks)}};
  if (auto s = blobs_->Put(manifest_key, manifest.dump(2)); !s.ok()) return s;
  // Tasks are cancelled in a finalising job only when its completion window passed (ExpireJob).
  auto finished = store_->FinishJob(job_id, output_key, errors_key, manifest_key, clock_->Now(),
                                    expired ? JobState::kExpired : JobState::kCompleted);
  if (absl::IsFailedPrecondition(finished.status())) return store_->GetJob(job_id);  // another server won
  if (finished.ok()) {
    MINIONS_LOG(Info) << "job=" << job_id << " completed: " << job->counts.completed << " served, "
                      << job->counts.failed << " failed";
  }
  return finished;
}

absl::StatusOr<int> JobFinalizer::FinalizeReady() {
  auto jobs = store_->JobsToFinalize(16, clock_->Now());
  if (!jobs.ok()) return jobs.status();
  int done = 0;
  for (const Job& job : *jobs) {
    auto result = Finalize(job.id);
    if (!result.ok()) {
      MINIONS_LOG(Warning) << "job=" << job.id << " finalisation failed: " << result.status().message();
      continue;
    }
    done += result->state == JobState::kCompleted;
  }
  return done;
}

}  // namespace minions
