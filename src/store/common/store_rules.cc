#include "store/common/store_rules.h"

#include <algorithm>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/json_codec.h"
#include "model/model_ref.h"

namespace minions::store_rules {
namespace {

std::string Name(std::string_view name) { return std::string(name); }

}  // namespace

Job NewJob(const JobSpec& spec, absl::Time now) {
  Job job;
  job.spec = spec;
  job.state = JobState::kValidating;
  job.created_at = now;
  job.updated_at = now;
  return job;
}

absl::StatusOr<std::vector<Task>> AddTasksToJob(Job& job, const std::vector<Task>& given, int64_t total_records,
                                                absl::Time now) {
  if (!IsAllowed(job.state, JobState::kQueued) || job.n_tasks != 0) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job.id, " is ", Name(JobStateName(job.state)),
                                                      "; tasks are added once, to a validating job"));
  }
  std::set<int64_t> indexes;
  int64_t records = 0;
  for (const Task& task : given) {
    if (task.index < 0 || !indexes.insert(task.index).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("job ", job.id, ": task index ", task.index, " is negative or given twice"));
    }
    records += task.n_records;
  }
  if (records != total_records) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", job.id, ": tasks hold ", records, " records but the job has ", total_records));
  }
  std::vector<Task> tasks;
  tasks.reserve(given.size());
  for (const Task& shard : given) {
    Task task;
    task.job_id = job.id;
    task.index = shard.index;
    task.first_record = shard.first_record;
    task.n_records = shard.n_records;
    task.byte_begin = shard.byte_begin;
    task.byte_end = shard.byte_end;
    tasks.push_back(std::move(task));
  }
  job.n_tasks = static_cast<int64_t>(tasks.size());
  job.counts.total = total_records;
  // An empty input has nothing to run: straight to finalizing (an empty output).
  job.state = tasks.empty() ? JobState::kFinalizing : JobState::kQueued;
  job.updated_at = now;
  return tasks;
}

absl::StatusOr<std::vector<Task>> EndJob(Job& job, JobState state, const std::string& error, std::vector<Task>& tasks,
                                         absl::Time now) {
  if (!IsAllowed(job.state, state)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job.id, " already ", Name(JobStateName(job.state)),
                                                      "; it cannot become ", Name(JobStateName(state))));
  }
  // The job ends first, so accounting its cancelled tasks below only counts them done.
  job.state = state;
  job.error = error;
  job.finished_at = now;
  job.updated_at = now;
  std::vector<Task> changed;
  for (Task& task : tasks) {
    if (IsTerminal(task.state)) continue;
    CancelTask(task, now);
    AccountTerminalTask(job, task, now);
    // A cancelled job keeps what its tasks finished (its results merge it); a failed one has none.
    if (state == JobState::kCancelled) CountStoppedTask(job, task, /*unrun_failed=*/false);
    changed.push_back(task);
  }
  return changed;
}

absl::Status FinishJob(Job& job, const std::string& output_key, const std::string& errors_key,
                       const std::string& manifest_key, absl::Time now, JobState outcome,
                       const TokenUsage& tokens) {
  if (job.state != JobState::kFinalizing || !IsAllowed(job.state, outcome)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job.id, " is ", Name(JobStateName(job.state)),
                                                      ", not finalizing; it cannot become ",
                                                      Name(JobStateName(outcome))));
  }
  job.state = outcome;
  job.output_key = output_key;
  job.errors_key = errors_key;
  job.manifest_key = manifest_key;
  job.tokens = tokens;
  job.finished_at = now;
  job.updated_at = now;
  return absl::OkStatus();
}

void RegisterExecutor(Executor& executor, bool exists, const ExecutorInfo& info, absl::Time now) {
  if (!exists) executor.registered_at = now;
  // A revoked executor stays revoked whatever it says (the caller refuses it); a quarantined one
  // stays quarantined across restarts (only an admin's release lifts it); a pending one stays
  // pending, though what it says it is is kept (an admin approves what it showed).
  if (executor.state == ExecutorState::kRevoked || executor.state == ExecutorState::kQuarantined) return;
  if (exists && executor.state == ExecutorState::kPending) {
    executor.info = info;
    executor.last_heartbeat_at = now;
    return;
  }
  // Leases of its previous life are left to expire.
  executor.info = info;
  executor.state = ExecutorState::kAvailable;
  executor.state_reason.clear();
  executor.last_heartbeat_at = now;
  executor.drain_requested = false;
}

bool HeardSince(const Executor& executor, const std::optional<absl::Time>& unless_heard_since) {
  return unless_heard_since && executor.last_heartbeat_at >= *unless_heard_since;
}

void RecordHeartbeat(Executor& executor, ExecutorState state, const std::string& reason, absl::Time now,
                     const std::optional<ModelHoldings>& holdings) {
  executor.last_heartbeat_at = now;
  if (holdings) {
    executor.info.models = holdings->cached;
    executor.info.model_loaded = holdings->loaded;
  }
  if (executor.state == ExecutorState::kRevoked || executor.state == ExecutorState::kQuarantined ||
      executor.state == ExecutorState::kPending) {
    return;
  }
  executor.state = state;
  executor.state_reason = reason;
  if (executor.drain_requested && (state == ExecutorState::kAvailable || state == ExecutorState::kBusy)) {
    executor.state = ExecutorState::kDraining;
    if (executor.state_reason.empty()) executor.state_reason = "drain requested";
  }
}

bool RenewLease(Task& task, const std::string& executor_id, const LeaseProgress& progress, absl::Duration ttl,
                absl::Time now) {
  // Cancelled, expired and requeued, or someone else's: not renewed.
  if (!CheckFence(task, executor_id, progress.attempt).ok()) return false;
  if (absl::Status chunks = ::minions::RenewLease(task, progress, ttl, now); !chunks.ok()) {
    // Renewed all the same; the completion will be refused with this message.
    task.last_error = std::string(chunks.message());
  }
  return true;
}

void RequestDrain(Executor& executor) {
  executor.drain_requested = true;
  if (executor.state != ExecutorState::kLost && executor.state != ExecutorState::kRevoked &&
      executor.state != ExecutorState::kQuarantined && executor.state != ExecutorState::kPending) {
    executor.state = ExecutorState::kDraining;
    executor.state_reason = "drain requested";
  }
}

bool MayLease(const Executor& executor, int max_tasks) {
  return max_tasks > 0 && executor.state != ExecutorState::kLost && executor.state != ExecutorState::kDraining &&
         executor.state != ExecutorState::kRevoked && executor.state != ExecutorState::kQuarantined &&
         executor.state != ExecutorState::kPending && !executor.drain_requested;
}

std::vector<std::string> RunnersOf(const Executor& executor) { return ::minions::RunnersOf(executor.info); }

bool MayPlace(const Executor& executor, const Job& job, absl::Time now, absl::Duration warm_wait) {
  return PlaceOn(executor.info, job, now, warm_wait) == Fit::kFits;
}

bool MarkBusy(Executor& executor) {
  // An executor that is already busy stays as it is: no write, no contention on its row.
  if (executor.state == ExecutorState::kBusy && executor.state_reason.empty()) return false;
  executor.state = ExecutorState::kBusy;
  executor.state_reason.clear();
  return true;
}

absl::Status CompleteReport(Task& task, const std::string& executor_id, const LeaseProgress& report, absl::Time now) {
  absl::Status fence = CheckFence(task, executor_id, report.attempt);
  if (!fence.ok()) return fence;
  return CompleteTask(task, report, now);
}

void MarkLost(Executor& executor) {
  executor.state = ExecutorState::kLost;
  executor.state_reason = absl::StrCat("no heartbeat since ", absl::FormatTime(executor.last_heartbeat_at));
}

std::string FairShareRanksJson(const std::vector<TeamUsage>& teams) {
  Json ranks = Json::object();
  for (const auto& [team, rank] : FairShareRanks(teams)) ranks[team] = rank;
  return DumpJson(ranks);
}

std::map<std::string, int64_t> RunningAllowances(const std::vector<TeamUsage>& teams) {
  std::map<std::string, int64_t> allowances;
  for (const TeamUsage& t : teams) {
    if (t.max_running_tasks > 0) allowances[t.team] = std::max<int64_t>(t.max_running_tasks - t.running, 0);
  }
  return allowances;
}

bool TakeAllowance(std::map<std::string, int64_t>& allowances, const std::string& team) {
  auto it = allowances.find(team);
  if (it == allowances.end()) return true;
  if (it->second <= 0) return false;
  --it->second;
  return true;
}

absl::Duration EndedAttemptTime(const Task& before, const Task& after, absl::Time now, ChargedUntil* charged) {
  auto ran = [now, charged](const std::optional<absl::Time>& since, const std::string& executor_id) {
    if (!since) return absl::ZeroDuration();
    absl::Time from = *since;
    if (charged != nullptr) {
      auto [last, added] = charged->try_emplace(executor_id, now);
      if (!added) {
        from = std::max(from, last->second);
        last->second = std::max(last->second, now);
      }
    }
    return std::max(now - from, absl::ZeroDuration());
  };
  absl::Duration time;
  const bool current_ended = before.state == TaskState::kRunning &&
                             (after.state != TaskState::kRunning || after.attempt != before.attempt);
  if (current_ended) time += ran(before.started_at, before.executor_id);
  const bool shadow_won =
      before.shadow && after.state == TaskState::kSucceeded && after.attempt == before.shadow->attempt;
  if (shadow_won) time += ran(before.shadow->since, before.shadow->executor_id);
  return time;
}

int64_t DevicesPerAttempt(const JobSpec& spec) { return std::max(spec.gang_size, 1); }

absl::Duration DeviceTime(absl::Duration wall, const JobSpec& spec) {
  return absl::Microseconds(absl::ToInt64Microseconds(wall) * DevicesPerAttempt(spec));
}

absl::Status CheckJobQuota(const std::optional<Team>& team, int64_t active) {
  if (!team || team->max_active_jobs <= 0 || active < team->max_active_jobs) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "team ", team->name, " has ", active, " jobs that have not ended, its limit (an admin sets it with "
      "`minions admin team set ", team->name, " --max-active-jobs N`); wait for one to end or cancel one"));
}

absl::Status ChargeTeamBytes(Team& team, TeamBytes kind, int64_t delta, bool enforce) {
  const bool files = kind == TeamBytes::kFiles;
  int64_t& count = files ? team.file_bytes : team.result_bytes;
  const int64_t limit = files ? team.max_file_bytes : team.max_result_bytes;
  if (delta > 0 && enforce && limit > 0 && (count > limit || delta > limit - count)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "team ", team.name, " keeps ", count, " bytes of ", files ? "files and job inputs" : "results",
        "; another ", delta, " would pass its limit of ", limit, " (an admin raises it with `minions admin team set ",
        team.name, files ? " --max-file-bytes N`" : " --max-result-bytes N`", ")",
        files ? "; delete files it no longer needs" : ""));
  }
  count = delta < 0 ? std::max<int64_t>(count + delta, 0)
                    : (count > std::numeric_limits<int64_t>::max() - delta ? std::numeric_limits<int64_t>::max()
                                                                           : count + delta);
  return absl::OkStatus();
}

absl::Status CheckNewToken(const TokenRecord& token) {
  if (token.id.empty() || token.secret_hash.size() != 64) {
    return absl::InvalidArgumentError("a credential needs an id and the SHA-256 of its text");
  }
  if (IsTeamRole(token.role) != !token.team.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("a ", Name(RoleName(token.role)), " token ",
                                                   IsTeamRole(token.role) ? "belongs to a team" : "has no team"));
  }
  if ((token.role == Role::kJoin) != (token.uses_left >= 0)) {
    return absl::InvalidArgumentError("only join tokens have a number of uses");
  }
  return absl::OkStatus();
}

void RevokeToken(TokenRecord& token, absl::Time now) {
  if (!token.revoked_at) token.revoked_at = now;
}

absl::Status TakeJoinUse(TokenRecord& join, absl::Time now) {
  if (join.role != Role::kJoin) {
    return absl::UnauthenticatedError("enrolment needs a join token (mnj_...): ask an admin for one");
  }
  if (absl::Status usable = CheckUsable(join, now); !usable.ok()) return usable;
  --join.uses_left;
  join.last_used_at = now;
  return absl::OkStatus();
}

void AwaitApproval(Executor& executor) {
  executor.state = ExecutorState::kPending;
  executor.state_reason = "awaits an admin's approval";
}

absl::Status ApproveExecutor(Executor& executor) {
  if (executor.state != ExecutorState::kPending) {
    return absl::FailedPreconditionError(absl::StrCat("executor ", executor.id, " is ",
                                                      std::string(ExecutorStateName(executor.state)),
                                                      ", not pending: there is nothing to approve"));
  }
  executor.state = ExecutorState::kAvailable;
  executor.state_reason.clear();
  return absl::OkStatus();
}

void RevokeExecutor(Executor& executor) {
  executor.state = ExecutorState::kRevoked;
  executor.state_reason = "revoked by an admin";
  executor.drain_requested = false;
}

bool HandBack(Task& task, const std::string& executor_id, int max_attempts, const RetryPolicy& policy,
              absl::Time now) {
  if (task.shadow && task.shadow->executor_id == executor_id) {
    DropShadow(task, task.shadow->attempt);
    return true;
  }
  if (task.state != TaskState::kRunning || task.executor_id != executor_id) return false;
  // Cannot fail: the task is running (preempted attempts are not counted against max_attempts).
  (void)::minions::FailTask(task, FailureClass::kPreempted, "its executor was revoked", max_attempts, policy, now);
  return true;
}

// --- models ---

absl::Status CheckNewModel(const ModelRecord& model) {
  if (model.team.empty()) return absl::InvalidArgumentError("a model belongs to a team");
  RETURN_IF_ERROR(ValidateModelName(model.name));
  RETURN_IF_ERROR(ValidateModelDigest(model.digest));
  if (model.size_bytes <= 0) return absl::InvalidArgumentError("a model has a size");
  if (model.blob_key.empty()) return absl::InvalidArgumentError("a model has a blob key");
  return absl::OkStatus();
}

absl::Status CheckModelQuery(const std::string& name, const std::string& digest) {
  if (name.empty() && digest.empty()) return absl::InvalidArgumentError("name a model, a digest or both");
  if (!name.empty()) RETURN_IF_ERROR(ValidateModelName(name));
  if (!digest.empty()) RETURN_IF_ERROR(ValidateModelDigest(digest));
  return absl::OkStatus();
}

absl::Status CheckModelUnused(const std::string& name, const std::string& digest, const std::vector<Job>& jobs) {
  for (const Job& job : jobs) {
    if (job.spec.model != name || job.spec.model_digest != digest || IsTerminal(job.state)) continue;
    return absl::FailedPreconditionError(absl::StrCat("model ", name, "@", digest, " is needed by job ", job.id,
                                                      " (", Name(JobStateName(job.state)),
                                                      "); cancel it or wait until it ends"));
  }
  return absl::OkStatus();
}

}  // namespace minions::store_rules
