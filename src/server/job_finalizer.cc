#include "server/job_finalizer.h"

#include <cstdio>
#include <deque>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/random_hex.h"
#include "common/status_macros.h"
#include "server/chunk_check.h"
#include "runner/batch_record.h"
#include "server/keys.h"

namespace minions {

inline constexpr std::string_view kErrorTaskFailed = "task_failed";
inline constexpr std::string_view kErrorBatchExpired = "batch_expired";  // the OpenAI Batch API's code
inline constexpr std::string_view kErrorBatchCancelled = "batch_cancelled";

absl::Status JobFinalizer::WriteResults(const Job& job, const std::vector<Task>& tasks, bool cancelled,
                                        const std::string& output_key, const std::string& errors_key,
                                        std::map<std::pair<int64_t, int>, std::string>* rejected,
                                        TokenUsage* tokens) {
  // One pass over the tasks in input order writes the output file as it goes; what goes to the
  // error file is spooled to a temporary file and written after (the two files are in input order,
  // and every piece is read once). A task contributes its committed chunks whatever its end (a
  // failed or expired task keeps what it finished), then an error line per record it never
  // finished. Every chunk is checked again as it is merged, on the very bytes that are published
  // (server/chunk_check.h): one changed since its commit is not published, its records get
  // "output_rejected" error lines. Nothing of a job's results is held in memory but one chunk.
  std::FILE* spool = std::tmpfile();
  if (spool == nullptr) return absl::InternalError("cannot create a temporary file for the error lines");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> spool_closer(spool, &std::fclose);
  auto spool_write = [&](std::string_view data) -> absl::Status {
    if (data.empty()) return absl::OkStatus();
    if (std::fwrite(data.data(), 1, data.size(), spool) != data.size()) {
      return absl::InternalError("cannot write the temporary file of error lines");
    }
    if (data.back() != '\n') std::fputc('\n', spool);
    return absl::OkStatus();
  };
  size_t next_task = 0;
  std::deque<std::string> ready;  // output pieces of the current task, in order
  auto finish_task = [&](const Task& task) -> absl::Status {
    std::vector<std::string> records;  // the task's input records, read when first needed
    auto read_input = [&]() -> absl::Status {
      if (!records.empty()) return absl::OkStatus();
      auto input = blobs_->GetRange(job.spec.input_key, task.byte_begin, task.byte_end - task.byte_begin);
      if (!input.ok()) return input.status();
      records = SplitRecordLines(*input);
      return absl::OkStatus();
    };
    for (const Chunk& c : task.chunks) {
      const std::string output_key = keys::ChunkOutput(job.id, task.index, c.attempt, c.seq);
      auto output = ReadChunkObject(*blobs_, output_key, chunk_limits_.max_chunk_bytes);
      if (absl::IsNotFound(output.status())) {
        // Every committed chunk was uploaded before it was reported: a missing one means the
        // object store lost it. Refuse to publish results without those records.
        return absl::DataLossError(absl::StrCat(output_key, " is missing from the object store"));
      }
      auto errors = ReadChunkObject(*blobs_, keys::ChunkErrors(job.id, task.index, c.attempt, c.seq),
                                    chunk_limits_.max_chunk_bytes);
      if (absl::IsNotFound(errors.status())) errors = std::string();  // a chunk without error lines
      RETURN_IF_ERROR(read_input());
      std::vector<std::string> ids = ExpectedCustomIds(records, c.begin, c.end);
      // Too large is the chunk's fault (InvalidArgument); another error is the object store's.
      absl::Status verdict = !output.ok() ? output.status() : !errors.ok() ? errors.status()
                                                                           : VerifyChunk(c, *output, *errors, ids, tokens);
      if (!verdict.ok() && !absl::IsInvalidArgument(verdict)) return verdict;
      if (!verdict.ok()) {
        MINIONS_LOG(Warning) << "job=" << job.id << " task=" << task.index << " attempt=" << c.attempt
                             << " chunk " << c.seq << " changed after it was committed; not published: "
                             << verdict.message();
        (*rejected)[{task.index, c.seq}] = std::string(verdict.message());
        std::string lines;
        for (const std::string& id : ids) {
          lines += DumpJson(MakeErrorLine(id, kErrorOutputRejected,
                                          "the executor's output for this record failed its check after it was "
                                          "accepted, so it is not published; submit the record again"));
          lines += '\n';
        }
        RETURN_IF_ERROR(spool_write(lines));
        continue;
      }
      if (!output->empty()) ready.push_back(*std::move(output));
      RETURN_IF_ERROR(spool_write(*errors));
    }
    if (task.state != TaskState::kSucceeded && CommittedRecords(task) < task.n_records) {
      RETURN_IF_ERROR(read_input());
      const bool stopped = task.state == TaskState::kCancelled;
      std::string lines;
      for (size_t i = CommittedRecords(task); i < records.size(); ++i) {
        ParsedRecord parsed = ParseRecordLine(records[i]);
        lines += DumpJson(stopped && cancelled ? MakeErrorLine(parsed.custom_id, kErrorBatchCancelled,
                                                               "the job was cancelled before this record ran")
                          : stopped ? MakeErrorLine(parsed.custom_id, kErrorBatchExpired,
                                                    "the job's completion window passed before this record ran")
                                    : MakeErrorLine(parsed.custom_id, kErrorTaskFailed,
                                                  absl::StrCat("the task holding this record failed: ", task.last_error)));
        lines += '\n';
      }
      RETURN_IF_ERROR(spool_write(lines));
    }
    return absl::OkStatus();
  };
  auto output_source = [&]() -> absl::StatusOr<std::string> {
    while (ready.empty() && next_task < tasks.size()) RETURN_IF_ERROR(finish_task(tasks[next_task++]));
    if (ready.empty()) return std::string();
    std::string piece = std::move(ready.front());
    ready.pop_front();
    // A file whose last line lacks its '\n' must not run into the next piece's first line.
    if (piece.back() != '\n') piece.push_back('\n');
    return piece;
  };
  auto spool_source = [&, rewound = false]() mutable -> absl::StatusOr<std::string> {
    if (!rewound) {
      if (std::fflush(spool) != 0 || std::fseek(spool, 0, SEEK_SET) != 0) {
        return absl::InternalError("cannot read back the temporary file of error lines");
      }
      rewound = true;
    }
    std::string buffer(1 << 20, '\0');
    size_t n = std::fread(buffer.data(), 1, buffer.size(), spool);
    if (n == 0 && std::ferror(spool)) return absl::InternalError("cannot read back the temporary file of error lines");
    buffer.resize(n);
    return buffer;
  };

  if (auto s = blobs_->PutStream(output_key, output_source); !s.ok()) return s;
  return blobs_->PutStream(errors_key, spool_source);
}

void JobFinalizer::ChargeResults(const std::string& team, std::initializer_list<std::string> objects) {
  int64_t bytes = 0;
  for (const std::string& key : objects) {
    if (absl::StatusOr<int64_t> size = blobs_->Size(key); size.ok()) bytes += *size;
  }
  // Never refused: the work is done and its results are kept; the team's next submit is refused
  // instead while it keeps as much as its limit (JobService::Submit).
  if (auto charged = store_->ChargeTeamBytes(team, TeamBytes::kResults, bytes, /*enforce=*/false);
      !charged.ok() && !absl::IsNotFound(charged.status())) {
    MINIONS_LOG(Warning) << "team " << team << ": " << bytes << " bytes of results not counted: " << charged.status();
  }
}

absl::StatusOr<Job> JobFinalizer::Finalize(const std::string& job_id) {
  auto job = store_->GetJob(job_id);
  if (!job.ok()) return job.status();
  if (job->state != JobState::kFinalizing) return *job;
  // Published means verified so far: while spot checks of its chunks wait for their verdicts,
  // the job waits (a verdict that fails sends the producer's records back to run elsewhere).
  // A later sweep, or the last verdict, finalises it.
  auto open = store_->CountOpenVerifications(job_id);
  if (!open.ok()) return open.status();
  auto tasks = store_->ListTasks(job_id);
  if (!tasks.ok()) return tasks.status();
  if (*open > 0) {
    // Not for ever: a check goes only to another executor, and there may be none (a one-executor
    // pool) or none idle. After the wait it publishes with them open (counted, and still open: a
    // later verdict is kept and a failure quarantines its producer).
    absl::Time last_ended = job->updated_at;
    for (const Task& task : *tasks) {
      if (task.finished_at) last_ended = std::max(last_ended, *task.finished_at);
    }
    if (clock_->Now() < last_ended + verify_wait_) return *job;
    MINIONS_LOG(Warning) << "job=" << job_id << " publishes with " << *open << " spot checks still open: no other "
                         << "executor judged them within " << verify_wait_ << " of its last task's end";
  }
  // This finalisation's own keys: another server finalising the job at the same time writes
  // beside them, and only the FinishJob that wins publishes its keys (server/keys.h).
  const std::string writer = RandomHex(16);
  const std::string output_key = keys::JobOutput(job_id, writer);
  const std::string errors_key = keys::JobErrors(job_id, writer);
  const std::string manifest_key = keys::JobManifest(job_id, writer);
  std::map<std::pair<int64_t, int>, std::string> rejected;  // (task, chunk seq) -> why
  TokenUsage tokens;
  RETURN_IF_ERROR(WriteResults(*job, *tasks, /*cancelled=*/false, output_key, errors_key, &rejected, &tokens));
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
      if (auto it = rejected.find({task.index, c.seq}); it != rejected.end()) chunks.back()["rejected"] = it->second;
    }
    entry["chunks"] = std::move(chunks);
    if (task.state != TaskState::kSucceeded) entry["error"] = task.last_error;
    manifest_tasks.push_back(std::move(entry));
  }
  Json manifest = {{"job_id", job_id},
                   {"request_counts", {{"total", job->counts.total},
                                       {"completed", job->counts.completed},
                                       {"failed", job->counts.failed}}},
                   {"usage", {{"prompt_tokens", tokens.prompt_tokens},
                              {"completion_tokens", tokens.completion_tokens},
                              {"completion_tokens_details", {{"reasoning_tokens", tokens.reasoning_tokens}}}}},
                   {"output_key", output_key},
                   {"errors_key", errors_key},
                   {"tasks", std::move(manifest_tasks)}};
  // Its spot checks (docs/verification.md): how many records other executors re-scored, by whom,
  // and which failed (their producer is quarantined).
  if (auto verdicts = store_->ListVerifications(job_id); verdicts.ok()) {
    const VerificationTally tally = Tally(*verdicts);
    manifest["verification"] = {{"checked", tally.checked},     {"passed", tally.passed},
                                {"failed", tally.failed},       {"verifiers", tally.verifiers},
                                {"failed_records", tally.failed_records}, {"open_checks", *open}};
  } else if (!absl::IsUnimplemented(verdicts.status())) {
    return verdicts.status();
  }
  if (auto s = blobs_->Put(manifest_key, manifest.dump(2)); !s.ok()) return s;
  // Tasks are cancelled in a finalising job only when its completion window passed (ExpireJob).
  auto finished = store_->FinishJob(job_id, output_key, errors_key, manifest_key, clock_->Now(),
                                    expired ? JobState::kExpired : JobState::kCompleted, tokens);
  if (absl::IsFailedPrecondition(finished.status())) {
    // Another server won (or this FinishJob did, in a try whose answer was lost): unless the job
    // names this finalisation's objects, they are nobody's, and are removed.
    auto now = store_->GetJob(job_id);
    if (now.ok() && now->output_key != output_key) {
      for (const std::string& key : {output_key, errors_key, manifest_key}) {
        if (auto s = blobs_->Delete(key); !s.ok() && !absl::IsNotFound(s)) {
          MINIONS_LOG(Warning) << "job=" << job_id << " cannot remove " << key << " (another server's results won): "
                               << s.message();
        }
      }
    }
    return now;
  }
  if (finished.ok()) {
    MINIONS_LOG(Info) << "job=" << job_id << " completed: " << job->counts.completed << " served, "
                      << job->counts.failed << " failed";
    ChargeResults(job->spec.team, {output_key, errors_key, manifest_key});
  }
  return finished;
}

absl::StatusOr<TokenUsage> JobFinalizer::MergeCancelled(const std::string& job_id) {
  auto job = store_->GetJob(job_id);
  if (!job.ok()) return job.status();
  if (job->state != JobState::kCancelled) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " is not cancelled"));
  }
  auto tasks = store_->ListTasks(job_id);
  if (!tasks.ok()) return tasks.status();
  std::map<std::pair<int64_t, int>, std::string> rejected;
  TokenUsage tokens;  // a cancelled job's row is left as it is
  RETURN_IF_ERROR(WriteResults(*job, *tasks, /*cancelled=*/true, keys::CancelledJobOutput(job_id),
                               keys::CancelledJobErrors(job_id), &rejected, &tokens));
  return tokens;
}

absl::StatusOr<JobFinalizer::ResultKeys> JobFinalizer::CancelledResults(const std::string& job_id) {
  ResultKeys result{keys::CancelledJobOutput(job_id), keys::CancelledJobErrors(job_id)};
  auto merged = blobs_->Size(result.errors);
  if (merged.ok()) return result;
  if (!absl::IsNotFound(merged.status())) return merged.status();
  // Two readers at once may both merge: the same bytes, each object replaced whole (and both
  // charged: a count one merge too high errs on the fleet's side).
  RETURN_IF_ERROR(MergeCancelled(job_id).status());
  if (auto job = store_->GetJob(job_id); job.ok()) ChargeResults(job->spec.team, {result.output, result.errors});
  return result;
}

absl::StatusOr<JobFinalizer::ResultKeys> JobFinalizer::ResultsOf(const Job& job) {
  if (job.state == JobState::kCancelled) return CancelledResults(job.id);
  // An expired job has results too: what it finished, and an error line for the rest.
  const bool ended = job.state == JobState::kCompleted || job.state == JobState::kExpired;
  if (!ended || job.output_key.empty() || job.errors_key.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job.id, " is ", std::string(JobStateName(job.state)),
                     "; results exist once it has completed, expired or been cancelled",
                     job.error.empty() ? "" : absl::StrCat(" (", job.error, ")")));
  }
  return ResultKeys{job.output_key, job.errors_key};
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
