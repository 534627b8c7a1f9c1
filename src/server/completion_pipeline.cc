#include "server/completion_pipeline.h"

#include <map>
#include <set>

#include "common/logging.h"
#include "common/status_macros.h"

namespace minions {

CompletionPipeline::CompletionPipeline(MetadataStore* store, Clock* clock, ChunkChecker* chunks,
                                       ServerMetrics* metrics, int batch, Hooks hooks)
    : store_(store),
      clock_(clock),
      chunks_(chunks),
      metrics_(metrics),
      hooks_(std::move(hooks)),
      completions_([this](const std::vector<CompletionCall>& calls) { return Commit(calls); }, batch,
                   absl::ZeroDuration(), "done-commit") {}

void CompletionPipeline::Submit(const std::string& executor_id, std::vector<LeaseProgress> reports,
                                absl::AnyInvocable<void(absl::StatusOr<Outcomes>) &&> done) {
  completions_.Submit(CompletionCall{executor_id, std::move(reports)}, std::move(done));
}

absl::StatusOr<CompletionPipeline::Outcomes> CompletionPipeline::Complete(const std::string& executor_id,
                                                                         const std::vector<LeaseProgress>& reports) {
  return completions_.Wait(CompletionCall{executor_id, reports});
}

absl::StatusOr<std::vector<absl::StatusOr<CompletionPipeline::Outcomes>>> CompletionPipeline::Commit(
    const std::vector<CompletionCall>& calls) {
  const absl::Time now = clock_->Now();
  ASSIGN_OR_RETURN(CompletionReply reply, chunks_->CompleteMany(calls, now));
  // What follows a completion, from what the store answered: no read of the jobs.
  std::map<std::string, std::vector<const LeaseProgress*>> jobs;  // the completed attempts by job
  for (size_t c = 0; c < calls.size(); ++c) {
    const CompletionCall& call = calls[c];
    if (!reply.outcomes[c].ok()) {
      MINIONS_LOG(Info) << "executor=" << call.executor_id << " completions refused: " << reply.outcomes[c].status();
      continue;
    }
    const Outcomes& outcomes = *reply.outcomes[c];
    for (size_t i = 0; i < outcomes.size() && i < call.reports.size(); ++i) {
      const LeaseProgress& report = call.reports[i];
      if (outcomes[i].ok()) {
        jobs[report.job_id].push_back(&report);
        if (metrics_) metrics_->AttemptCompleted(call.executor_id, report, now);
      } else {
        MINIONS_LOG(Info) << "job=" << report.job_id << " task=" << report.task_index << " attempt=" << report.attempt
                          << " executor=" << call.executor_id << " completion refused: " << outcomes[i].message();
      }
    }
  }
  std::set<std::string> teams;  // of the jobs whose tasks ended here
  for (const auto& [job_id, completed] : jobs) {
    absl::StatusOr<std::shared_ptr<const JobSpec>> spec = chunks_->job_specs().Get(job_id);
    if (!spec.ok()) continue;
    for (const LeaseProgress* report : completed) {
      if (sampler_.Take(ThroughputKeyOf(**spec), now)) {
        Job job;
        job.id = job_id;
        job.spec = **spec;
        MeasureCompletion(*store_, job, report->task_index, report->attempt, now);
      }
    }
    teams.insert((*spec)->team);
  }
  for (const std::string& team : teams) QuotaFreed(team);
  if (hooks_.job_ready) {
    for (const std::string& job_id : reply.finalizing) hooks_.job_ready(job_id);
  }
  return std::move(reply.outcomes);
}

absl::StatusOr<Task> CompletionPipeline::Fail(const std::string& executor_id, const LeaseProgress& ref,
                                              FailureClass failure, const std::string& message) {
  const absl::Time now = clock_->Now();
  auto task =
      chunks_->FailTask(executor_id, ref.job_id, ref.task_index, ref.attempt, failure, message, now, ref.chunks);
  if (!task.ok()) return task.status();
  if (metrics_) metrics_->AttemptFailed(executor_id, *task, failure, now);
  if (task->state == TaskState::kPending && hooks_.work_arrived) hooks_.work_arrived();
  auto job = store_->GetJob(ref.job_id);
  if (job.ok() && task->state != TaskState::kPending) QuotaFreed(job->spec.team);
  if (job.ok() && job->state == JobState::kFinalizing && hooks_.job_ready) hooks_.job_ready(job->id);
  return task;
}

void CompletionPipeline::QuotaFreed(const std::string& team_name) {
  const absl::Time now = clock_->Now();
  std::optional<bool> limited;
  {
    absl::MutexLock lock(&mu_);
    auto it = team_quotas_.find(team_name);
    if (it != team_quotas_.end() && now < it->second.checked_at + kTeamQuotaRecheck) limited = it->second.limited;
  }
  if (!limited) {
    absl::StatusOr<Team> team = store_->GetTeam(team_name);
    limited = team.ok() && team->max_running_tasks > 0;
    absl::MutexLock lock(&mu_);
    ++quota_lookups_;
    team_quotas_[team_name] = TeamQuota{*limited, now};
  }
  if (*limited && hooks_.work_arrived) hooks_.work_arrived();
}

int64_t CompletionPipeline::quota_lookups() const {
  absl::MutexLock lock(&mu_);
  return quota_lookups_;
}

}  // namespace minions
