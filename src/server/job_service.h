#pragma once
// JobService: the Jobs gRPC service — submit, inspect, watch, cancel, fetch results; list and
// drain executors. Holds no state: everything is in the MetadataStore and the BlobStore.
//
// Every call is authorised (server/call_auth.h) and sees only its caller's team: a job belongs
// to its submitter's team, and another team's job is NotFound, exactly as an unknown one, so
// nothing tells a caller that it exists. Team and priority come from the credential (a team's
// ceiling bounds the priority); a job's input named by key must be one of the caller's own
// uploads. Admins see and touch every team's work.
// Threads: called on gRPC's threads; thread-safe.

#include <functional>

#include "blob/blob_store.h"
#include "common/clock.h"
#include "identity/authenticator.h"
#include "minions/v1/minions.grpc.pb.h"
#include "model/progress_estimator.h"
#include "server/job_finalizer.h"
#include "server/job_splitter.h"
#include "server/server_metrics.h"
#include "server/server_options.h"
#include "server/stream_limiter.h"
#include "store/metadata_store.h"

namespace minions {

class JobService final : public v1::Jobs::Service {
 public:
  // `work_added` is called when a submitted job becomes leasable; `metrics` (may be null) counts
  // submissions; WatchJob's rate and ETA come from `progress` (the server's; null: one of its
  // own). Every call is authorised by `auth`.
  JobService(MetadataStore* store, BlobStore* blobs, Clock* clock, Authenticator* auth, const ServerOptions& options,
             std::function<void()> work_added = nullptr, ServerMetrics* metrics = nullptr,
             ProgressTracker* progress = nullptr)
      : store_(store),
        blobs_(blobs),
        clock_(clock),
        auth_(auth),
        options_(options),
        work_added_(std::move(work_added)),
        metrics_(metrics),
        progress_(progress != nullptr ? progress : &own_progress_),
        finalizer_(store, blobs, clock, {options.max_chunk_bytes}),
        watch_streams_(options.max_watch_streams) {}

  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request, v1::Job* reply) override;
  // A job's input in parts of at most kInputPartBytes, written to the caller's uploads as they
  // arrive (never held whole) and charged to the team's file bytes: past max_input_bytes or the
  // team's room for files the stream is refused and nothing of it is kept.
  grpc::Status UploadInput(grpc::ServerContext* context, grpc::ServerReader<v1::UploadInputRequest>* reader,
                           v1::UploadInputResponse* reply) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request, v1::Job* reply) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* reply) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request, v1::Job* reply) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobProgress>* writer) override;
  grpc::Status GetResults(grpc::ServerContext* context, const v1::GetResultsRequest* request,
                          grpc::ServerWriter<v1::ResultsChunk>* writer) override;
  grpc::Status ListTasks(grpc::ServerContext* context, const v1::ListTasksRequest* request,
                         v1::ListTasksResponse* reply) override;
  grpc::Status ListExecutors(grpc::ServerContext* context, const v1::ListExecutorsRequest* request,
                             v1::ListExecutorsResponse* reply) override;
  grpc::Status DrainExecutor(grpc::ServerContext* context, const v1::DrainExecutorRequest* request,
                             v1::Executor* reply) override;
  grpc::Status ListTeams(grpc::ServerContext* context, const v1::ListTeamsRequest* request,
                         v1::ListTeamsResponse* reply) override;

  // The submit path without gRPC, for an authorised caller (holding jobs:write). An input named
  // by key must lie under `input_prefix` (empty: the caller's own uploads, keys::Uploads); the
  // OpenAI API passes its team's files (keys::OpenAiFiles), which it has authorised already.
  absl::StatusOr<Job> Submit(const Caller& caller, const v1::SubmitJobRequest& request,
                             const std::string& input_prefix = "");
  // A submission refused after its input was read (the OpenAI API's batch whose file fails
  // validation), kept as a failed job of the caller's team with `error`, so that the CLI, the
  // dashboard and the metrics show it like any other. `spec` gives the model, input and window;
  // team and owner come from the caller.
  absl::StatusOr<Job> SubmitRefused(const Caller& caller, JobSpec spec, const std::string& error);

 private:
  // A job's spot checks as GetJob answers them (v1::VerificationCounts): the tally of `verdicts`,
  // the checks still open, and the records that failed after the job published.
  absl::Status FillVerification(const Job& job, const std::vector<Verification>& verdicts,
                                v1::VerificationCounts& out);
  // The job, if the caller may see it; NotFound ("no job ID") otherwise, word for word what an
  // unknown id gets.
  absl::StatusOr<Job> VisibleJob(const Caller& caller, const std::string& job_id);
  // Sets spec.input_key: an inline input written under the caller's uploads (charged first to the
  // team's file bytes: over its limit, ResourceExhausted and nothing written; *written = its
  // bytes), or an object named by key, checked to be the caller's and small enough.
  // The team a caller's call acts for: its credential's; an admin's may name any existing team
  // ("": "default"). InvalidArgument for a team that does not exist.
  absl::StatusOr<Team> TeamFor(const Caller& caller, const std::string& requested);
  // UploadInput's work, for an authorised caller.
  absl::StatusOr<v1::UploadInputResponse> ReceiveInput(const Caller& caller,
                                                       grpc::ServerReaderInterface<v1::UploadInputRequest>& reader);
  absl::Status PlaceInput(const Caller& caller, const v1::SubmitJobRequest& request, const std::string& input_prefix,
                          JobSpec& spec, int64_t* written);
  // Submit's parts, in order. SpecFromRequest: the request's fields checked against the server's
  // limits and the caller's team, into `spec` (model, shard size, attempts, priority, gang, runner
  // and its options, window); nothing written.
  absl::Status SpecFromRequest(const Caller& caller, const v1::SubmitJobRequest& request, const Team& team,
                               JobSpec& spec);
  // The answer length per record read from the input, and the shard size from measured throughput
  // when the submitter asked for none (`sizing_why` says how it was chosen).
  absl::Status SizeTasks(bool sized_by_server, JobSpec& spec, std::string& sizing_why);
  // The input split into tasks; a server-sized job may change its shard size to keep within the
  // most tasks a job may have, or to give each free executor of `fleet` a task. An error here is
  // the job's failure (the job is still created, to keep its input), not the submission's.
  absl::StatusOr<SplitResult> SplitForJob(const std::vector<Executor>& fleet, bool sized_by_server, JobSpec& spec,
                                          std::string& sizing_why);
  // Sets out's wait_cause and wait_reason: why `job`, with `pending_tasks` pending, waits
  // (model/placement.h ExplainWait over the fleet, its running tasks and the teams' standing).
  absl::Status ExplainWaitInto(const Job& job, int64_t pending_tasks, v1::Job& out);

  MetadataStore* store_;
  BlobStore* blobs_;
  Clock* clock_;
  Authenticator* auth_;
  ServerOptions options_;
  std::function<void()> work_added_;  // a job became leasable
  ServerMetrics* metrics_;
  ProgressTracker own_progress_;
  ProgressTracker* progress_;
  JobFinalizer finalizer_;             // merges a cancelled job's partial results when first asked for
  StreamLimiter watch_streams_;        // open WatchJob streams
};

}  // namespace minions
