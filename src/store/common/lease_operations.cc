#include "store/common/lease_operations.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/placement.h"
#include "model/state_machines.h"
#include "store/common/row_access.h"
#include "store/common/store_rules.h"

namespace minions {
namespace {

namespace rules = store_rules;

}  // namespace

// One batch of Lease calls in one transaction: what its asks have granted so far, so that each
// later ask sees it as it would see it committed. Lives in the transaction's body.
class LeaseOperations::Batch {
 public:
  Batch(RowTransaction& t, const StoreOptions& options, absl::Duration ttl, absl::Time now)
      : t_(t), options_(options), ttl_(ttl), now_(now) {}

  // The executors and the teams' standing, locked as the store's lock order says.
  absl::Status Load(const std::vector<LeaseAsk>& asks);
  // One ask, granted on top of the asks before it.
  absl::StatusOr<absl::StatusOr<std::vector<Lease>>> Grant(const LeaseAsk& ask);
  // The jobs that start, the executors that became busy, then the grants (the last write).
  absl::Status Write();

 private:
  // What `executor` (`ask`) may take of `candidates`, in order.
  absl::StatusOr<std::vector<Lease>> Take(const LeaseAsk& ask, Executor& executor,
                                          std::vector<LeaseCandidate>& candidates);
  LeaseQuery QueryFor(const Executor& executor, int64_t limit) const;

  RowTransaction& t_;
  const StoreOptions& options_;
  const absl::Duration ttl_;
  const absl::Time now_;
  std::map<std::string, Executor> executors_;
  std::vector<TeamUsage> teams_;
  std::set<std::string> teams_locked_;          // the teams with a quota, locked by Load
  std::map<std::string, int64_t> granted_by_team_;
  std::set<TaskId> granted_keys_;
  std::map<std::string, Job> jobs_;             // what placement reads of each job, parsed once
  std::set<std::string> to_start_;              // jobs this batch starts
  std::set<std::string> busy_;                  // executors this batch marks busy
  std::vector<Task> granted_;
};

absl::Status LeaseOperations::Batch::Load(const std::vector<LeaseAsk>& asks) {
  RowKeys keys;
  for (const LeaseAsk& ask : asks) keys.executors.push_back(ask.executor_id);
  ASSIGN_OR_RETURN(Rows rows, t_.Read(keys));
  executors_ = std::move(rows.executors);
  ASSIGN_OR_RETURN(teams_, t_.TeamStandings(now_));
  // Teams with a running-task quota: their counts again, under lock (in name order, before any
  // other team's row: concurrent leases cannot overshoot a quota, nor lock teams crosswise).
  for (const auto& [team, allowance] : rules::RunningAllowances(teams_)) teams_locked_.insert(team);
  if (teams_locked_.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto running, t_.LockTeamUsage(teams_locked_));
  for (TeamUsage& team : teams_) {
    if (auto it = running.find(team.team); it != running.end()) team.running = it->second;
  }
  return absl::OkStatus();
}

LeaseQuery LeaseOperations::Batch::QueryFor(const Executor& executor, int64_t limit) const {
  LeaseQuery query;
  query.now = now_;
  query.memory_bytes = UsableMemory(executor.info);
  query.runners = rules::RunnersOf(executor);
  query.fair_share_ranks = rules::FairShareRanksJson(teams_);
  query.loaded_model = executor.info.model_loaded;
  query.cached_models = executor.info.models;
  query.cold_before = now_ - options_.EffectiveWarmWait();
  query.model_affinity = options_.model_affinity;
  query.confined = MeetsConfinement(executor.info, Requirements{.confined = true});
  query.limit = limit;
  return query;
}

absl::StatusOr<absl::StatusOr<std::vector<Lease>>> LeaseOperations::Batch::Grant(const LeaseAsk& ask) {
  auto found = executors_.find(ask.executor_id);
  if (found == executors_.end()) return absl::StatusOr<std::vector<Lease>>(row_access::NoExecutor(ask.executor_id));
  Executor& executor = found->second;
  if (executor.state == ExecutorState::kPending) {
    // Refused, not answered empty: its owner is told what to ask an admin for.
    return absl::StatusOr<std::vector<Lease>>(absl::PermissionDeniedError(
        absl::StrCat("executor ", executor.id, " (", executor.info.name,
                     ") awaits an admin's approval: `minions executors approve ", executor.id, "`")));
  }
  if (!rules::MayLease(executor, ask.max_tasks)) return std::vector<Lease>{};
  // Tasks this batch granted are still pending in the table (written at the end) and locked by
  // this transaction, so they come back: ask for that many more, and pass them over.
  const int64_t limit = ask.max_tasks + static_cast<int64_t>(granted_.size());
  ASSIGN_OR_RETURN(std::vector<LeaseCandidate> candidates, t_.LeaseCandidates(QueryFor(executor, limit), jobs_));
  return Take(ask, executor, candidates);
}

absl::StatusOr<std::vector<Lease>> LeaseOperations::Batch::Take(const LeaseAsk& ask, Executor& executor,
                                                    std::vector<LeaseCandidate>& candidates) {
  std::vector<Lease> leases;
  std::map<std::string, int64_t> allowances = rules::RunningAllowances(teams_);
  const absl::Duration warm_wait = options_.EffectiveWarmWait();
  // The rows the same lease alone would have read: its first max_tasks, the earlier asks' grants
  // left out (a row the rules refuse still counts, as it would alone).
  int considered = 0;
  for (LeaseCandidate& candidate : candidates) {
    if (considered >= ask.max_tasks) break;
    Task& task = candidate.task;
    if (granted_keys_.contains({task.job_id, task.index})) continue;  // an earlier ask's
    ++considered;
    auto job = jobs_.find(task.job_id);
    if (job == jobs_.end()) return absl::InternalError(absl::StrCat("the lease query left out job ", task.job_id));
    if (!rules::MayPlace(executor, job->second, now_, warm_wait)) continue;  // the rules decide
    if (task.shadow && task.shadow->executor_id == ask.executor_id) continue;  // its backup goes elsewhere
    if (!rules::TakeAllowance(allowances, candidate.team)) continue;            // team at its quota
    RETURN_IF_ERROR(GrantTask(task, ask.executor_id, ttl_, now_));
    if (job->second.state == JobState::kQueued || !job->second.started_at) to_start_.insert(task.job_id);
    granted_keys_.insert({task.job_id, task.index});
    ++granted_by_team_[candidate.team];
    auto standing = std::find_if(teams_.begin(), teams_.end(), [&](const TeamUsage& t) { return t.team == candidate.team; });
    if (standing == teams_.end()) standing = teams_.insert(teams_.end(), TeamUsage{.team = candidate.team});
    ++standing->running;  // as the tasks' trigger will count it
    granted_.push_back(task);
    leases.push_back(MakeLease(std::move(task), job->second.spec));
  }
  if (!leases.empty() && rules::MarkBusy(executor)) busy_.insert(ask.executor_id);
  return leases;
}

absl::Status LeaseOperations::Batch::Write() {
  RowWrites first;
  // Only a job that starts with this batch is locked and written (after its tasks, the store's
  // lock order); every lease of a running job would queue on its row otherwise.
  for (const std::string& job_id : to_start_) {
    ASSIGN_OR_RETURN(Job job, row_access::LoadJob(t_, job_id));
    if (MarkJobStarted(job, now_)) first.jobs.push_back(std::move(job));
  }
  for (const std::string& id : busy_) first.executors.push_back(executors_.at(id));
  if (!first.empty()) RETURN_IF_ERROR(t_.Update(first));
  // The grants' teams' usage rows, which the tasks' trigger updates, locked first in name order:
  // the trigger takes them in the order the update meets the tasks.
  std::set<std::string> unlocked;
  for (const auto& [team, n] : granted_by_team_) {
    if (!teams_locked_.contains(team)) unlocked.insert(team);
  }
  if (unlocked.size() > 1) RETURN_IF_ERROR(t_.LockTeamUsage(unlocked).status());
  // The grants last, sent with the COMMIT where the backend can.
  if (granted_.empty()) return absl::OkStatus();
  return t_.Update(RowWrites{.tasks = std::move(granted_)}, /*last=*/true);
}

absl::StatusOr<LeaseOperations::Answers> LeaseOperations::LeaseMany(const std::vector<LeaseAsk>& asks,
                                                                    absl::Duration ttl, absl::Time now) {
  if (asks.empty()) return Answers{};
  return RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::StatusOr<Answers> {
    Batch batch(t, options_, ttl, now);
    RETURN_IF_ERROR(batch.Load(asks));
    Answers answers;
    for (const LeaseAsk& ask : asks) {
      ASSIGN_OR_RETURN(absl::StatusOr<std::vector<Lease>> answer, batch.Grant(ask));
      answers.push_back(std::move(answer));
    }
    RETURN_IF_ERROR(batch.Write());
    return answers;
  });
}

absl::StatusOr<std::vector<TeamUsage>> LeaseOperations::ListTeamUsage(absl::Time now) {
  return RunTransaction(store_, TransactionKind::kRead, [&](RowTransaction& t) { return t.TeamStandings(now); });
}

}  // namespace minions
