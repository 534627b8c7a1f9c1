#include "server/job_service.h"

#include <sys/stat.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "runner/protocol.h"
#include "server/auth.h"
#include "server/job_splitter.h"
#include "server/keys.h"
#include "server/proto_convert.h"

namespace minions {
namespace {

std::string RandomHex(int n) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string out;
  for (int i = 0; i < n; ++i) out += "0123456789abcdef"[rng() % 16];
  return out;
}

#define RETURN_IF_UNAUTHENTICATED(context)                  \
  do {                                                      \
    grpc::Status _auth = CheckToken(context, options_.token); \
    if (!_auth.ok()) return _auth;                          \
  } while (0)

}  // namespace

absl::StatusOr<Job> JobService::Submit(const v1::SubmitJobRequest& request) {
  JobSpec spec;
  spec.model = request.model();
  if (spec.model.empty()) {
    return absl::InvalidArgumentError("a job needs a model (--model PATH of a GGUF file)");
  }
  if (options_.check_model_paths && !spec.model.empty() && spec.model[0] == '/') {
    struct stat st;
    if (stat(spec.model.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat("model file '", spec.model, "' does not exist"));
    }
  }
  spec.shard_size = request.shard_size() > 0 ? request.shard_size() : options_.default_shard_size;
  if (spec.shard_size > 1'000'000) return absl::InvalidArgumentError("shard_size must be at most 1000000");
  if (spec.shard_size < options_.min_shard_size) {
    return absl::InvalidArgumentError(absl::StrCat("shard_size must be at least ", options_.min_shard_size,
                                                   " records per task on this server"));
  }
  if (request.max_attempts() < 0 || request.max_attempts() > 100) {
    return absl::InvalidArgumentError("max_attempts must be between 1 and 100");
  }
  if (request.max_attempts() > 0) spec.max_attempts = request.max_attempts();
  spec.priority = request.priority();
  if (!request.team().empty()) spec.team = request.team();
  spec.requirements.min_memory_bytes = request.min_memory_bytes();
  if (!request.runner_options_json().empty()) {
    auto options = ParseJson(request.runner_options_json());
    if (!options.ok() || !options->is_object()) {
      return absl::InvalidArgumentError("runner options must be a JSON object, e.g. {\"n_parallel\": 8}");
    }
    auto valid = runner_protocol::LoadOptions::FromJson(*options);
    if (!valid.ok()) return valid.status();
    spec.runner_options = *options;
  }
  if (request.completion_window_ms() > 0) spec.completion_window = absl::Milliseconds(request.completion_window_ms());

  if (!request.input().empty()) {
    if (static_cast<int64_t>(request.input().size()) > options_.max_input_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("input is larger than ", options_.max_input_bytes,
                                                     " bytes (this server's limit; split it into several jobs)"));
    }
    spec.input_key = absl::StrCat("inputs/", absl::FormatTime("%Y%m%d", clock_->Now(), absl::UTCTimeZone()), "-",
                                  RandomHex(16), ".jsonl");
    if (auto s = blobs_->Put(spec.input_key, request.input()); !s.ok()) return s;
  } else if (!request.input_key().empty()) {
    spec.input_key = request.input_key();
    auto size = blobs_->Size(spec.input_key);
    if (!size.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("input object '", spec.input_key, "': ", size.status().message()));
    }
    if (*size > options_.max_input_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("input object '", spec.input_key, "' is ", *size,
                                                     " bytes; the most is ", options_.max_input_bytes));
    }
  } else {
    // proto3 cannot tell an empty input from none: both are an input with no records.
    return absl::InvalidArgumentError(
        "the input is empty: the job has no records (send a JSONL file of request lines, or name an input_key)");
  }

  auto job = store_->CreateJob(spec, clock_->Now());
  if (!job.ok()) return job.status();
  auto split = SplitInput(*blobs_, spec.input_key, spec.shard_size, options_.max_tasks_per_job);
  if (!split.ok()) {
    (void)store_->FailJob(job->id, std::string(split.status().message()), clock_->Now());
    return absl::InvalidArgumentError(absl::StrCat("job ", job->id, " refused: ", split.status().message()));
  }
  if (auto s = store_->AddTasks(job->id, split->tasks, split->total_records, clock_->Now()); !s.ok()) {
    (void)store_->FailJob(job->id, std::string(s.message()), clock_->Now());
    return s;
  }
  if (metrics_) metrics_->JobSubmitted(*job);
  if (work_added_) work_added_();
  MINIONS_LOG(Info) << "job=" << job->id << " submitted: " << split->total_records << " records ("
                    << split->invalid_records << " invalid) in " << split->tasks.size() << " tasks";
  return store_->GetJob(job->id);
}

grpc::Status JobService::SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                                   v1::Job* reply) {
  RETURN_IF_UNAUTHENTICATED(context);
  auto job = Submit(*request);
  if (!job.ok()) return ToGrpc(job.status());
  *reply = ToProto(*job);
  return grpc::Status::OK;
}

grpc::Status JobService::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request, v1::Job* reply) {
  RETURN_IF_UNAUTHENTICATED(context);
  auto job = store_->GetJob(request->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  *reply = ToProto(*job);
  return grpc::Status::OK;
}

grpc::Status JobService::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                                  v1::ListJobsResponse* reply) {
  RETURN_IF_UNAUTHENTICATED(context);
  JobFilter filter;
  if (!request->state().empty()) {
    filter.state = ParseJobState(request->state());
    if (!filter.state) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat("unknown job state '", request->state(), "'"));
    }
  }
  filter.team = request->team();
  if (request->limit() > 0) filter.limit = request->limit();
  auto jobs = store_->ListJobs(filter);
  if (!jobs.ok()) return ToGrpc(jobs.status());
  for (const Job& job : *jobs) *reply->add_jobs() = ToProto(job);
  return grpc::Status::OK;
}

grpc::Status JobService::CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                                   v1::Job* reply) {
  RETURN_IF_UNAUTHENTICATED(context);
  auto job = store_->CancelJob(request->job_id(), clock_->Now());
  if (!job.ok()) return ToGrpc(job.status());
  MINIONS_LOG(Info) << "job=" << job->id << " cancelled";
  *reply = ToProto(*job);
  return grpc::Status::OK;
}

grpc::Status JobService::WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                                  grpc::ServerWriter<v1::JobProgress>* writer) {
  RETURN_IF_UNAUTHENTICATED(context);
  StreamLimiter::Slot slot = watch_streams_.Acquire();
  if (!slot) return ToGrpc(watch_streams_.Refusal("watch streams"));
  absl::Duration interval = request->interval_ms() > 0 ? absl::Milliseconds(request->interval_ms())
                                                       : absl::Milliseconds(500);
  interval = std::max(interval, absl::Milliseconds(50));
  while (!context->IsCancelled()) {
    auto job = store_->GetJob(request->job_id());
    if (!job.ok()) return ToGrpc(job.status());
    const absl::Time now = clock_->Now();
    v1::JobProgress progress;
    *progress.mutable_job() = ToProto(*job);
    int64_t in_flight = 0;
    if (!IsTerminal(job->state)) {
      // Counted by the store: a job of 50,000 tasks is not listed twice a second.
      auto counts = store_->CountTasks(job->id);
      if (counts.ok()) {
        progress.set_tasks_running(counts->running);
        progress.set_tasks_pending(counts->pending);
        progress.set_executors_working(static_cast<int32_t>(counts->executors));
        in_flight = counts->records_in_flight;
      }
    }
    const ProgressEstimate estimate = progress_->Observe(*job, in_flight, now);
    progress.set_records_in_flight(estimate.in_flight);
    progress.set_records_per_second(estimate.records_per_second);
    progress.set_eta_seconds(estimate.eta_seconds);
    if (!writer->Write(progress)) break;
    if (IsTerminal(job->state)) break;
    clock_->SleepFor(interval);
  }
  return grpc::Status::OK;
}

grpc::Status JobService::GetResults(grpc::ServerContext* context, const v1::GetResultsRequest* request,
                                    grpc::ServerWriter<v1::ResultsChunk>* writer) {
  RETURN_IF_UNAUTHENTICATED(context);
  auto job = store_->GetJob(request->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  const std::string& key = request->errors() ? job->errors_key : job->output_key;
  // An expired job has results too: what it finished, and an error line for the rest.
  const bool has_results = job->state == JobState::kCompleted || job->state == JobState::kExpired;
  if (!has_results || key.empty()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("job ", job->id, " is ", std::string(JobStateName(job->state)),
                                     "; results exist once it has completed (or expired)",
                                     job->error.empty() ? "" : absl::StrCat(" (", job->error, ")")));
  }
  bool client_gone = false;
  auto status = blobs_->Read(key, [&](std::string_view chunk) {
    v1::ResultsChunk out;
    out.set_data(std::string(chunk));
    client_gone = !writer->Write(out);
    return !client_gone;
  });
  return ToGrpc(status);
}

grpc::Status JobService::ListTasks(grpc::ServerContext* context, const v1::ListTasksRequest* request,
                                   v1::ListTasksResponse* reply) {
  RETURN_IF_UNAUTHENTICATED(context);
  auto tasks = store_->ListTasks(request->job_id());
  if (!tasks.ok()) return ToGrpc(tasks.status());
  for (const Task& t : *tasks) *reply->add_tasks() = ToProto(t);
  return grpc::Status::OK;
}

grpc::Status JobService::ListExecutors(grpc::ServerContext* context, const v1::ListExecutorsRequest*,
                                       v1::ListExecutorsResponse* reply) {
  RETURN_IF_UNAUTHENTICATED(context);
  auto executors = store_->ListExecutors();
  if (!executors.ok()) return ToGrpc(executors.status());
  // Current tasks: every running task, asked of the store at once (not job by job).
  std::map<std::string, std::vector<std::string>> current;
  auto running = store_->ListRunningTasks();
  if (!running.ok()) return ToGrpc(running.status());
  for (const Task& t : *running) {
    current[t.executor_id].push_back(absl::StrCat(t.job_id, "/", t.index, "#", t.attempt));
  }
  for (const Executor& e : *executors) {
    v1::Executor* out = reply->add_executors();
    *out = ToProto(e);
    for (const auto& t : current[e.id]) out->add_current_tasks(t);
  }
  return grpc::Status::OK;
}

grpc::Status JobService::DrainExecutor(grpc::ServerContext* context, const v1::DrainExecutorRequest* request,
                                       v1::Executor* reply) {
  RETURN_IF_UNAUTHENTICATED(context);
  if (auto s = store_->RequestDrain(request->executor_id(), clock_->Now()); !s.ok()) return ToGrpc(s);
  auto executor = store_->GetExecutor(request->executor_id());
  if (!executor.ok()) return ToGrpc(executor.status());
  *reply = ToProto(*executor);
  return grpc::Status::OK;
}

}  // namespace minions
