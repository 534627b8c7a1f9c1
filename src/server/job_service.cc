#include "server/job_service.h"

#include <sys/stat.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "blob/blob_store.h"
#include "common/logging.h"
#include "common/random_hex.h"
#include "common/status_macros.h"
#include "model/model_ref.h"
#include "model/placement.h"
#include "runner/protocol.h"
#include "server/admin_service.h"
#include "server/authorize_or_return.h"
#include "server/call_auth.h"
#include "server/job_splitter.h"
#include "server/keys.h"
#include "server/task_sizer.h"
#include "server/model_registry.h"
#include "server/proto_convert.h"
#include "store/gang_store.h"

namespace minions {
namespace {

constexpr int32_t kDefaultTaskPage = 1000;
constexpr int32_t kMaxTaskPage = 10000;

// Executors of `fleet` that could take a task of `spec` now: idle (not busy, draining, lost or
// with their owner present), offering its runner, holding its memory.
int FreeExecutorsFor(const std::vector<Executor>& fleet, const JobSpec& spec) {
  int free = 0;
  for (const Executor& e : fleet) {
    free += e.state == ExecutorState::kAvailable && !e.drain_requested && OffersRunner(e.info, spec.requirements.runner) &&
            HoldsMemory(e.info, spec.requirements);
  }
  return free;
}

}  // namespace

absl::StatusOr<Job> JobService::VisibleJob(const Caller& caller, const std::string& job_id) {
  absl::StatusOr<Job> job = store_->GetJob(job_id);
  if (job.ok() && !caller.SeesTeam(job->spec.team)) {
    return absl::NotFoundError(absl::StrCat("no job ", job_id));
  }
  return job;
}

absl::StatusOr<Team> JobService::TeamFor(const Caller& caller, const std::string& requested) {
  std::string name;
  // The team is the credential's. An admin may name any existing team (default: "default").
  if (caller.IsAdmin()) {
    name = requested.empty() ? std::string(kDefaultTeam) : requested;
  } else {
    if (!requested.empty() && requested != caller.team) {
      return absl::PermissionDeniedError(absl::StrCat("your token belongs to team ", caller.team,
                                                      "; it cannot submit jobs for team ", requested));
    }
    name = caller.team;
  }
  absl::StatusOr<Team> team = store_->GetTeam(name);
  if (absl::IsNotFound(team.status())) {
    return absl::InvalidArgumentError(
        absl::StrCat("there is no team ", name, " (an admin creates it: minions admin team create ", name, ")"));
  }
  return team;
}

absl::StatusOr<v1::UploadInputResponse> JobService::ReceiveInput(
    const Caller& caller, grpc::ServerReaderInterface<v1::UploadInputRequest>& reader) {
  v1::UploadInputRequest part;
  if (!reader.Read(&part)) return absl::InvalidArgumentError("the input is empty: the upload sent nothing");
  ASSIGN_OR_RETURN(Team team, TeamFor(caller, part.team()));
  // The team's room for files now; the store charges the whole input once it has arrived (other
  // uploads may have taken the room meanwhile).
  const int64_t room = team.max_file_bytes > 0 ? std::max<int64_t>(team.max_file_bytes - team.file_bytes, 0)
                                               : std::numeric_limits<int64_t>::max();
  const std::string key = absl::StrCat(keys::Uploads(team.name, caller.principal),
                                       absl::FormatTime("%Y%m%d", clock_->Now(), absl::UTCTimeZone()), "-",
                                       RandomHex(16), ".jsonl");
  int64_t bytes = 0;
  bool have_part = true;
  absl::Status refusal;  // why the stream was stopped, when this side stopped it
  absl::Status put = blobs_->PutStream(key, [&]() -> absl::StatusOr<std::string> {
    while (true) {
      if (!have_part && !reader.Read(&part)) return std::string();  // the end
      have_part = false;
      if (part.data().empty()) continue;  // an empty chunk would end the object early
      const auto size = static_cast<int64_t>(part.data().size());
      bytes += size;
      if (size > kInputPartBytes) {
        refusal = absl::InvalidArgumentError(
            absl::StrCat("an upload's parts have at most ", kInputPartBytes, " bytes (one had ", size, ")"));
      } else if (bytes > options_.max_input_bytes) {
        refusal = absl::InvalidArgumentError(absl::StrCat("input is larger than ", options_.max_input_bytes,
                                                          " bytes (this server's limit; split it into several jobs)"));
      } else if (bytes > room) {
        refusal = absl::ResourceExhaustedError(absl::StrCat(
            "team ", team.name, " keeps ", team.file_bytes, " bytes of files and job inputs; this input (", bytes,
            " bytes so far) would pass its limit of ", team.max_file_bytes,
            " (an admin raises it with `minions admin team set ", team.name, " --max-file-bytes N`)"));
      }
      if (!refusal.ok()) return refusal;
      return std::move(*part.mutable_data());
    }
  });
  auto drop = [&] {
    if (absl::Status s = blobs_->Delete(key); !s.ok() && !absl::IsNotFound(s)) {
      MINIONS_LOG(Warning) << "a refused upload's object " << key << " is left: " << s;
    }
  };
  if (!put.ok()) {
    drop();
    return refusal.ok() ? put : refusal;
  }
  if (bytes == 0) {
    drop();
    return absl::InvalidArgumentError("the input is empty: the job would have no records");
  }
  if (auto charged = store_->ChargeTeamBytes(team.name, TeamBytes::kFiles, bytes, /*enforce=*/true); !charged.ok()) {
    drop();
    return charged.status();
  }
  v1::UploadInputResponse reply;
  reply.set_input_key(key);
  reply.set_size_bytes(bytes);
  return reply;
}

absl::Status JobService::PlaceInput(const Caller& caller, const v1::SubmitJobRequest& request,
                                   const std::string& input_prefix, JobSpec& spec, int64_t* written) {
  // Inputs are the caller's own uploads: kept under its prefix, and only from there.
  const std::string uploads = keys::Uploads(spec.team, caller.principal);
  if (!request.input().empty()) {
    if (static_cast<int64_t>(request.input().size()) > options_.max_input_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("input is larger than ", options_.max_input_bytes,
                                                     " bytes (this server's limit; split it into several jobs)"));
    }
    spec.input_key = absl::StrCat(uploads, absl::FormatTime("%Y%m%d", clock_->Now(), absl::UTCTimeZone()), "-",
                                  RandomHex(16), ".jsonl");
    const auto size = static_cast<int64_t>(request.input().size());
    // Charged first: over the team's limit, nothing is written.
    RETURN_IF_ERROR(store_->ChargeTeamBytes(spec.team, TeamBytes::kFiles, size, /*enforce=*/true).status());
    *written = size;
    return blobs_->Put(spec.input_key, request.input());
  } else if (!request.input_key().empty()) {
    spec.input_key = request.input_key();
    if (auto valid = ValidateBlobKey(spec.input_key); !valid.ok()) return valid;
    const std::string& allowed = input_prefix.empty() ? uploads : input_prefix;
    if (!caller.IsAdmin() && !absl::StartsWith(spec.input_key, allowed)) {
      return absl::PermissionDeniedError(absl::StrCat("input_key must name one of your own uploads (under ", allowed,
                                                      "); send the input inline instead"));
    }
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
  return absl::OkStatus();
}

absl::Status JobService::SpecFromRequest(const Caller& caller, const v1::SubmitJobRequest& request, const Team& team,
                                         JobSpec& spec) {
  spec.team = team.name;
  // Results are never refused once computed: a team keeping as many bytes of results as its limit
  // gets no new job instead.
  if (team.max_result_bytes > 0 && team.result_bytes >= team.max_result_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "team ", spec.team, " keeps ", team.result_bytes, " bytes of results, its limit of ", team.max_result_bytes,
        " (an admin raises it with `minions admin team set ", spec.team, " --max-result-bytes N`)"));
  }
  spec.owner = caller.principal;
  spec.model = request.model();
  if (spec.model.empty()) {
    return absl::InvalidArgumentError("a job needs a model (--model NAME of a pushed model, or PATH of a GGUF file)");
  }
  // Only an admin is told whether a path exists on the server's machine: to anyone else the answer
  // would be an oracle over the server's file system (issue 40, point 7). A team's path is checked
  // against the folders its executors report (CheckModelPathInFolders, in Submit), and by the executor.
  if (options_.check_model_paths && caller.IsAdmin() && spec.model[0] == '/') {
    struct stat st;
    if (stat(spec.model.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat("model file '", spec.model, "' does not exist"));
    }
  }
  // A shard size asked for is kept; without one, the tasks are sized from measured throughput
  // once the model is known (SizeTasks).
  const bool sized_by_server = request.shard_size() <= 0;
  spec.shard_size = sized_by_server ? options_.task_sizing.default_records : request.shard_size();
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
  if (!caller.IsAdmin() && spec.priority > team.max_priority) {
    return absl::PermissionDeniedError(absl::StrCat("team ", spec.team, "'s jobs may have priority ",
                                                    team.max_priority, " at most (asked for ", spec.priority,
                                                    "); an admin sets the ceiling"));
  }
  spec.requirements.min_memory_bytes = request.min_memory_bytes();
  if (request.gang_size() != 0 && (request.gang_size() < 2 || request.gang_size() > static_cast<int>(kMaxGangSize))) {
    return absl::InvalidArgumentError(
        absl::StrCat("a gang has 2 to ", kMaxGangSize, " executors (--gang N), not ", request.gang_size()));
  }
  spec.gang_size = request.gang_size();
  if (!request.runner_options_json().empty()) {
    auto options = ParseJson(request.runner_options_json());
    if (!options.ok() || !options->is_object()) {
      return absl::InvalidArgumentError("runner options must be a JSON object, e.g. {\"n_parallel\": 8}");
    }
    auto valid = runner_protocol::LoadOptions::FromJson(*options);
    if (!valid.ok()) return valid.status();
    spec.runner_options = *options;
  }
  if (!request.runner().empty()) {
    RETURN_IF_ERROR(ValidateRunnerName(request.runner()));
    spec.requirements.runner = request.runner();
  }
  // The team's own rules (docs/security.md 40.3 and 40.6a), for every caller, an admin too: they
  // keep the team's prompts off runners and machines an admin did not allow for it.
  if (!team.runners.empty() &&
      std::find(team.runners.begin(), team.runners.end(), spec.requirements.runner) == team.runners.end()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "team ", spec.team, "'s jobs may use the runners ", absl::StrJoin(team.runners, ", "), ", not '",
        spec.requirements.runner, "' (an admin allows more with `minions admin team set ", spec.team, " --runners`)"));
  }
  spec.requirements.confined = request.require_confined() || team.require_confined;
  if (request.completion_window_ms() > 0) spec.completion_window = absl::Milliseconds(request.completion_window_ms());
  return absl::OkStatus();
}

absl::Status JobService::SizeTasks(bool sized_by_server, JobSpec& spec, std::string& sizing_why) {
  // From what tasks of this model, runner and answer length measured (the answer length read from
  // the input's first records).
  ASSIGN_OR_RETURN(spec.tokens_per_record, EstimateTokensPerRecord(*blobs_, spec.input_key, spec.runner_options));
  if (sized_by_server) {
    ASSIGN_OR_RETURN(TaskSize size, SizeTasksFor(*store_, spec, options_.task_sizing));
    spec.shard_size = std::max(size.records, options_.min_shard_size);
    sizing_why = std::move(size.why);
  }
  return absl::OkStatus();
}

absl::StatusOr<SplitResult> JobService::SplitForJob(const std::vector<Executor>& fleet, bool sized_by_server,
                                                    JobSpec& spec, std::string& sizing_why) {
  int64_t records_seen = 0;
  auto split = SplitInput(*blobs_, spec.input_key, spec.shard_size, options_.max_tasks_per_job, &records_seen);
  if (!split.ok() && sized_by_server && records_seen > spec.shard_size * options_.max_tasks_per_job) {
    // Measured tasks so small that the job would have too many: the fewest that fit instead (the
    // submitter asked for no particular size).
    spec.shard_size = (records_seen + options_.max_tasks_per_job - 1) / options_.max_tasks_per_job;
    absl::StrAppend(&sizing_why, "; ", spec.shard_size, " so that the job has at most ", options_.max_tasks_per_job,
                    " tasks");
    split = SplitInput(*blobs_, spec.input_key, spec.shard_size, options_.max_tasks_per_job);
  }
  if (split.ok() && sized_by_server && spec.gang_size == 0) {
    // A small job on an idle fleet: a task for each free executor (the input is read again, which
    // only a job smaller than its free executors' share costs).
    const int64_t spread = SpreadOverFreeExecutors(split->total_records, spec.shard_size, FreeExecutorsFor(fleet, spec),
                                                   options_.min_shard_size, &sizing_why);
    if (spread != spec.shard_size) {
      spec.shard_size = spread;
      split = SplitInput(*blobs_, spec.input_key, spec.shard_size, options_.max_tasks_per_job);
    }
  }
  if (sized_by_server) spec.sizing = sizing_why;
  return split;
}

absl::StatusOr<Job> JobService::Submit(const Caller& caller, const v1::SubmitJobRequest& request,
                                       const std::string& input_prefix) {
  JobSpec spec;
  absl::StatusOr<Team> team = TeamFor(caller, request.team());
  if (!team.ok()) return team.status();
  RETURN_IF_ERROR(SpecFromRequest(caller, request, *team, spec));
  const bool sized_by_server = request.shard_size() <= 0;
  // A registry model: its digest, size and the memory a task needs (InvalidArgument for an
  // unknown one, with the names the team has).
  RETURN_IF_ERROR(ResolveJobModel(*store_, spec));
  // Placement: a job no executor could ever run says so now, not by waiting for ever.
  absl::StatusOr<std::vector<Executor>> fleet = store_->ListExecutors();
  if (!fleet.ok()) return fleet.status();
  PlanAutomaticGang(*fleet, spec);  // a model no single executor can hold: the fewest that can
  RETURN_IF_ERROR(CheckFleetCanHold(*fleet, spec));
  RETURN_IF_ERROR(CheckModelPathInFolders(*fleet, spec));  // a file no executor would load

  // An inline input written here is charged to the team's files; it goes again, uncharged, unless
  // a job is created to keep it.
  int64_t written = 0;
  bool created = false;
  auto drop_input = absl::MakeCleanup([&] {
    if (written == 0 || created) return;
    (void)blobs_->Delete(spec.input_key);
    (void)store_->ChargeTeamBytes(spec.team, TeamBytes::kFiles, -written, /*enforce=*/false);
  });
  RETURN_IF_ERROR(PlaceInput(caller, request, input_prefix, spec, &written));
  std::string sizing_why;
  RETURN_IF_ERROR(SizeTasks(sized_by_server, spec, sizing_why));
  // Split before the job is created, so that the job records the shard size its tasks have.
  absl::StatusOr<SplitResult> split = SplitForJob(*fleet, sized_by_server, spec, sizing_why);
  auto job = store_->CreateJob(spec, clock_->Now());
  if (!job.ok()) return job.status();  // ResourceExhausted: the team's quota of jobs
  created = true;  // the job keeps its input, failed or not
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
  MINIONS_LOG(Info) << "job=" << job->id << " submitted by " << caller.Describe() << ": " << split->total_records
                    << " records (" << split->invalid_records << " invalid) in " << split->tasks.size() << " tasks of "
                    << spec.shard_size << (sized_by_server ? absl::StrCat(" (", sizing_why, ")") : std::string(" (as asked)"));
  return store_->GetJob(job->id);
}

absl::StatusOr<Job> JobService::SubmitRefused(const Caller& caller, JobSpec spec, const std::string& error) {
  spec.team = caller.team.empty() ? std::string(kDefaultTeam) : caller.team;
  spec.owner = caller.principal;
  auto job = store_->CreateJob(spec, clock_->Now());
  if (!job.ok()) return job.status();  // ResourceExhausted: the team's quota of jobs
  if (metrics_) metrics_->JobSubmitted(*job);
  MINIONS_LOG(Info) << "job=" << job->id << " submitted by " << caller.Describe() << " and refused: " << error;
  return store_->FailJob(job->id, error, clock_->Now());
}

grpc::Status JobService::SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                                   v1::Job* reply) {
  AUTHORIZE_OR_RETURN(context, Scope::kJobsWrite);
  auto job = Submit(caller, *request);
  if (!job.ok()) return ToGrpc(job.status());
  *reply = ToProto(*job);
  return grpc::Status::OK;
}

grpc::Status JobService::UploadInput(grpc::ServerContext* context, grpc::ServerReader<v1::UploadInputRequest>* reader,
                                     v1::UploadInputResponse* reply) {
  AUTHORIZE_OR_RETURN(context, Scope::kJobsWrite);
  absl::StatusOr<v1::UploadInputResponse> received = ReceiveInput(caller, *reader);
  if (!received.ok()) return ToGrpc(received.status());
  *reply = std::move(*received);
  return grpc::Status::OK;
}

absl::Status JobService::FillVerification(const Job& job, const std::vector<Verification>& verdicts,
                                          v1::VerificationCounts& out) {
  out = ToProto(Tally(verdicts));
  ASSIGN_OR_RETURN(int64_t open, store_->CountOpenVerifications(job.id));
  out.set_open_checks(open);
  if (out.failed() == 0 || (job.state != JobState::kCompleted && job.state != JobState::kExpired)) {
    return absl::OkStatus();
  }
  // A failure before publication redid its producer's chunks (none of them is left in the job);
  // one that came after finds them still there: the published files keep that producer's
  // answers (a published job is never rewritten). Named, with how many of the job's records it
  // wrote, so the team knows what to run again.
  std::set<std::string> failed_producers;
  for (const Verification& v : verdicts) {
    if (!v.passed) failed_producers.insert(v.producer_id);
  }
  ASSIGN_OR_RETURN(std::vector<Task> tasks, store_->ListTasks(job.id));
  std::set<std::string> published;
  int64_t records = 0;
  for (const Task& task : tasks) {
    for (const Chunk& chunk : task.chunks) {
      if (!failed_producers.contains(chunk.executor_id)) continue;
      published.insert(chunk.executor_id);
      records += chunk.end - chunk.begin;
    }
  }
  if (published.empty()) return absl::OkStatus();
  std::set<std::string> named;
  for (const Verification& v : verdicts) {
    if (!v.passed && published.contains(v.producer_id) && named.insert(v.custom_id).second) {
      out.add_failed_after_publication(v.custom_id);
    }
  }
  out.set_records_of_quarantined(records);
  return absl::OkStatus();
}

grpc::Status JobService::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request, v1::Job* reply) {
  AUTHORIZE_OR_RETURN(context, Scope::kJobsRead);
  auto job = VisibleJob(caller, request->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  *reply = ToProto(*job);
  // Its spot checks so far (a store that keeps none has none to show).
  auto verdicts = store_->ListVerifications(job->id);
  if (!verdicts.ok() && !absl::IsUnimplemented(verdicts.status())) return ToGrpc(verdicts.status());
  if (verdicts.ok()) {
    if (absl::Status s = FillVerification(*job, *verdicts, *reply->mutable_verification()); !s.ok()) return ToGrpc(s);
  }
  if (!IsTerminal(job->state)) {
    auto counts = store_->CountTasks(job->id);
    if (!counts.ok()) return ToGrpc(counts.status());
    if (absl::Status explained = ExplainWaitInto(*job, counts->pending, *reply); !explained.ok()) {
      return ToGrpc(explained);
    }
  }
  return grpc::Status::OK;
}

absl::Status JobService::ExplainWaitInto(const Job& job, int64_t pending_tasks, v1::Job& out) {
  if (pending_tasks <= 0) return absl::OkStatus();
  const absl::Time now = clock_->Now();
  ASSIGN_OR_RETURN(std::vector<Executor> executors, store_->ListExecutors());
  ASSIGN_OR_RETURN(std::vector<Task> running, store_->ListRunningTasks());
  ASSIGN_OR_RETURN(std::vector<TeamUsage> teams, store_->ListTeamUsage(now));
  std::map<std::string, int64_t> running_by_executor;
  for (const Task& t : running) ++running_by_executor[t.executor_id];
  std::vector<FleetMember> fleet;
  fleet.reserve(executors.size());
  for (Executor& e : executors) {
    const int64_t tasks = running_by_executor[e.id];
    fleet.push_back({std::move(e), tasks});
  }
  WaitExplanation why = ExplainWait(job, pending_tasks, fleet, teams, now, store_->WarmWait());
  if (why.cause == WaitCause::kInLine) {
    // Free executors can take it, but do its attempts end at once? Then that is what the waiting
    // line says, as the task table does (an input executors cannot read, a model they cannot load).
    ASSIGN_OR_RETURN(std::vector<Task> tasks, store_->ListTasks(job.id));
    const Task* failing = nullptr;
    for (const Task& t : tasks) {
      if (t.state == TaskState::kPending && t.failures > 0 && !t.last_error.empty() &&
          (failing == nullptr || t.failures > failing->failures)) {
        failing = &t;
      }
    }
    if (failing != nullptr) {
      absl::StrAppend(&why.message, "; but its attempts fail: task ", failing->index, " failed ", failing->failures,
                      " of ", job.spec.max_attempts, " times, last: ", failing->last_error.substr(0, 300),
                      " (minions status ", job.id, " --tasks)");
    }
  }
  out.set_wait_cause(std::string(WaitCauseName(why.cause)));
  out.set_wait_reason(why.message);
  return absl::OkStatus();
}

grpc::Status JobService::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                                  v1::ListJobsResponse* reply) {
  AUTHORIZE_OR_RETURN(context, Scope::kJobsRead);
  JobFilter filter;
  if (!request->state().empty()) {
    filter.state = ParseJobState(request->state());
    if (!filter.state) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat("unknown job state '", request->state(), "'"));
    }
  }
  filter.team = request->team();
  if (!caller.IsAdmin()) {
    if (!filter.team.empty() && filter.team != caller.team) {
      return ToGrpc(absl::PermissionDeniedError(
          absl::StrCat("your token sees team ", caller.team, "'s jobs only, not team ", filter.team, "'s")));
    }
    filter.team = caller.team;
  }
  if (request->limit() > 0) filter.limit = std::min(request->limit(), 10000);
  auto jobs = store_->ListJobs(filter);
  if (!jobs.ok()) return ToGrpc(jobs.status());
  for (const Job& job : *jobs) *reply->add_jobs() = ToProto(job);
  return grpc::Status::OK;
}

grpc::Status JobService::CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                                   v1::Job* reply) {
  AUTHORIZE_OR_RETURN(context, Scope::kJobsWrite);
  if (auto visible = VisibleJob(caller, request->job_id()); !visible.ok()) return ToGrpc(visible.status());
  auto job = store_->CancelJob(request->job_id(), clock_->Now());
  if (!job.ok()) return ToGrpc(job.status());
  MINIONS_LOG(Info) << "job=" << job->id << " cancelled by " << caller.Describe();
  *reply = ToProto(*job);
  return grpc::Status::OK;
}

grpc::Status JobService::WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                                  grpc::ServerWriter<v1::JobProgress>* writer) {
  AUTHORIZE_OR_RETURN(context, Scope::kJobsRead);
  if (auto visible = VisibleJob(caller, request->job_id()); !visible.ok()) return ToGrpc(visible.status());
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
        // A job none of whose tasks runs says why (read from the fleet: only while it waits).
        if (counts->running == 0) (void)ExplainWaitInto(*job, counts->pending, *progress.mutable_job());
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
  AUTHORIZE_OR_RETURN(context, Scope::kJobsRead);
  auto job = VisibleJob(caller, request->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  // A cancelled job keeps what it finished: its answers, and an error line for every record
  // that never ran (the same files the OpenAI API and the dashboard serve).
  auto results = finalizer_.ResultsOf(*job);
  if (!results.ok()) return ToGrpc(results.status());
  const std::string key = request->errors() ? results->errors : results->output;
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
  AUTHORIZE_OR_RETURN(context, Scope::kJobsRead);
  if (auto visible = VisibleJob(caller, request->job_id()); !visible.ok()) return ToGrpc(visible.status());
  int64_t first = 0;
  if (!request->page_token().empty() && (!absl::SimpleAtoi(request->page_token(), &first) || first < 0)) {
    return ToGrpc(absl::InvalidArgumentError("page_token must be a next_page_token this server gave"));
  }
  const int32_t page = request->page_size() > 0 ? std::min(request->page_size(), kMaxTaskPage) : kDefaultTaskPage;
  auto tasks = store_->ListTasks(request->job_id());
  if (!tasks.ok()) return ToGrpc(tasks.status());
  int32_t taken = 0;
  for (const Task& t : *tasks) {
    if (t.index < first) continue;
    if (taken == page) {
      reply->set_next_page_token(absl::StrCat(t.index));
      break;
    }
    *reply->add_tasks() = ToProto(t);
    ++taken;
  }
  return grpc::Status::OK;
}

grpc::Status JobService::ListExecutors(grpc::ServerContext* context, const v1::ListExecutorsRequest*,
                                       v1::ListExecutorsResponse* reply) {
  AUTHORIZE_OR_RETURN(context, Scope::kFleetRead);
  auto executors = store_->ListExecutors();
  if (!executors.ok()) return ToGrpc(executors.status());
  // Current tasks: every running task, asked of the store at once (not job by job). A caller who
  // is not an admin sees only its own team's.
  std::map<std::string, std::vector<std::string>> current;
  auto running = store_->ListRunningTasks();
  if (!running.ok()) return ToGrpc(running.status());
  std::map<std::string, bool> visible;  // job id -> the caller sees its team
  for (const Task& t : *running) {
    if (!caller.IsAdmin()) {
      auto seen = visible.find(t.job_id);
      if (seen == visible.end()) {
        auto job = store_->GetJob(t.job_id);
        seen = visible.emplace(t.job_id, job.ok() && caller.SeesTeam(job->spec.team)).first;
      }
      if (!seen->second) continue;
    }
    current[t.executor_id].push_back(absl::StrCat(t.job_id, "/", t.index, "#", t.attempt));
  }
  // Cached models by the names the caller's team gives them (admins: every team's).
  auto models = store_->ListModels(caller.IsAdmin() ? "" : caller.team);
  if (!models.ok()) return ToGrpc(models.status());
  const std::map<std::string, std::string> names = ModelNamesByDigest(*models);
  // Gangs whose attempt runs: which executors form them, and their leader.
  auto gangs = store_->ListGangs();
  if (!gangs.ok()) return ToGrpc(gangs.status());
  const std::map<std::string, GangLease> gang_of = LivingGangsByExecutor(*gangs, *running);
  for (const Executor& e : *executors) {
    v1::Executor* out = reply->add_executors();
    *out = ToProto(e);
    for (const auto& t : current[e.id]) out->add_current_tasks(t);
    if (auto g = gang_of.find(e.id); g != gang_of.end()) {
      auto seen = visible.find(g->second.job_id);
      if (caller.IsAdmin() || (seen != visible.end() && seen->second)) {
        out->set_gang(absl::StrCat(g->second.job_id, "/", g->second.task_index, "#", g->second.attempt));
        out->set_gang_leader(g->second.leader());
      }
    }
    // Another team's models and the second it beat are its own business (docs/security.md, 40.7f).
    const VisibleModels models_seen = ModelsVisibleTo(caller.IsAdmin(), !current[e.id].empty(), e.info, names);
    out->clear_models_cached();
    for (const std::string& digest : models_seen.cached) {
      out->add_models_cached(digest);
      out->add_models_shown(ShownModel(digest, names));
    }
    out->set_model_loaded(models_seen.loaded);
    out->set_model_loaded_shown(models_seen.loaded_hidden ? std::string(kAnotherTeamsModel)
                                                          : ShownModel(models_seen.loaded, names));
    out->set_last_heartbeat_at_ms(absl::ToUnixMillis(HeartbeatShown(caller.IsAdmin(), e.last_heartbeat_at)));
  }
  return grpc::Status::OK;
}

grpc::Status JobService::ListTeams(grpc::ServerContext* context, const v1::ListTeamsRequest*,
                                   v1::ListTeamsResponse* reply) {
  AUTHORIZE_OR_RETURN(context, Scope::kFleetRead);
  (void)caller;  // every team's standing is for anyone who may see the fleet (the rows hold no secret)
  absl::StatusOr<std::vector<v1::Team>> teams = TeamsWithStanding(*store_, clock_->Now());
  if (!teams.ok()) return ToGrpc(teams.status());
  for (v1::Team& team : *teams) *reply->add_teams() = std::move(team);
  return grpc::Status::OK;
}

grpc::Status JobService::DrainExecutor(grpc::ServerContext* context, const v1::DrainExecutorRequest* request,
                                       v1::Executor* reply) {
  AUTHORIZE_OR_RETURN(context, Scope::kAdmin);
  if (auto s = store_->RequestDrain(request->executor_id(), clock_->Now()); !s.ok()) return ToGrpc(s);
  auto executor = store_->GetExecutor(request->executor_id());
  if (!executor.ok()) return ToGrpc(executor.status());
  MINIONS_LOG(Info) << "executor=" << executor->id << " drain requested by " << caller.Describe();
  *reply = ToProto(*executor);
  return grpc::Status::OK;
}

}  // namespace minions
