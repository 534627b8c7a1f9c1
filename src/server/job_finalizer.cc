#include "server/job_finalizer.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "runner/batch_record.h"
#include "server/keys.h"

namespace minions {

inline constexpr std::string_view kErrorTaskFailed = "task_failed";

absl::StatusOr<Job> JobFinalizer::Finalize(const std::string& job_id) {
  auto job = store_->GetJob(job_id);
  if (!job.ok()) return job.status();
  if (job->state != JobState::kFinalizing) return *job;
  auto tasks = store_->ListTasks(job_id);
  if (!tasks.ok()) return tasks.status();

  // Output and errors are streamed task by task, so a job's results are never held in memory.
  Json manifest_tasks = Json::array();
  size_t next_output = 0, next_errors = 0;
  absl::Status read_error;
  auto task_source = [&](bool errors, size_t& next) {
    return [&, errors]() -> absl::StatusOr<std::string> {
      while (next < tasks->size()) {
        const Task& task = (*tasks)[next++];
        if (task.state == TaskState::kSucceeded) {
          std::string key = errors ? keys::TaskErrors(job_id, task.index, task.attempt)
                                   : keys::TaskOutput(job_id, task.index, task.attempt);
          auto data = blobs_->Get(key);
          if (absl::IsNotFound(data.status())) {
            if (errors) continue;  // an attempt without error lines writes no error object
            // Every completed attempt uploaded its output before completing: a missing one means
            // the object store lost it. Refuse to publish results without those records.
            return absl::DataLossError(absl::StrCat("the output of task ", task.index, " attempt ", task.attempt,
                                                    " is missing from the object store"));
          }
          if (!data.ok()) return data.status();
          if (data->empty()) continue;
          // A file whose last line lacks its '\n' must not run into the next task's first line.
          if (data->back() != '\n') data->push_back('\n');
          return *std::move(data);
        } else if (errors && task.state == TaskState::kFailed) {
          // Every record of a task that failed for good gets an error line.
          auto input = blobs_->GetRange(job->spec.input_key, task.byte_begin, task.byte_end - task.byte_begin);
          if (!input.ok()) return input.status();
          std::string lines;
          for (const auto& line : SplitRecordLines(*input)) {
            ParsedRecord parsed = ParseRecordLine(line);
            lines += DumpJson(MakeErrorLine(parsed.custom_id, kErrorTaskFailed,
                                            absl::StrCat("the task holding this record failed: ", task.last_error)));
            lines += '\n';
          }
          if (!lines.empty()) return lines;
        }
      }
      return std::string();
    };
  };

  const std::string output_key = keys::JobOutput(job_id);
  const std::string errors_key = keys::JobErrors(job_id);
  const std::string manifest_key = keys::JobManifest(job_id);
  if (auto s = blobs_->PutStream(output_key, task_source(false, next_output)); !s.ok()) return s;
  if (auto s = blobs_->PutStream(errors_key, task_source(true, next_errors)); !s.ok()) return s;
  for (const Task& task : *tasks) {
    Json entry = {{"index", task.index},
                  {"state", std::string(TaskStateName(task.state))},
                  {"first_record", task.first_record},
                  {"n_records", task.n_records},
                  {"records_failed", task.records_failed},
                  {"attempt", task.attempt},
                  {"preemptions", task.preemptions},
                  {"failures", task.failures}};
    if (task.state == TaskState::kSucceeded) {
      entry["output_key"] = keys::TaskOutput(job_id, task.index, task.attempt);
      entry["errors_key"] = keys::TaskErrors(job_id, task.index, task.attempt);
    } else {
      entry["error"] = task.last_error;
    }
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
  auto finished = store_->FinishJob(job_id, output_key, errors_key, manifest_key, clock_->Now());
  if (absl::IsFailedPrecondition(finished.status())) return store_->GetJob(job_id);  // another server won
  if (finished.ok()) {
    MINIONS_LOG(Info) << "job=" << job_id << " completed: " << job->counts.completed << " served, "
                      << job->counts.failed << " failed";
  }
  return finished;
}

absl::StatusOr<int> JobFinalizer::FinalizeReady() {
  auto jobs = store_->JobsToFinalize(16);
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
