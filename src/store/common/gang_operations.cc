#include "store/common/gang_operations.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/fair_share.h"
#include "model/state_machines.h"
#include "store/common/gang_rows.h"
#include "store/common/row_access.h"
#include "store/common/store_rules.h"

namespace minions {
namespace {

absl::Status InGangAlready(const std::string& executor_id, const GangLease& other) {
  return absl::FailedPreconditionError(
      absl::StrCat("executor ", executor_id, " is in the gang of task ", other.job_id, "/", other.task_index, " already"));
}

absl::Status LostASeat(const GangLease& gang) {
  // Another gang took a seat's executor (or this attempt) since the checks.
  return absl::FailedPreconditionError(absl::StrCat("the gang of task ", gang.job_id, "/", gang.task_index,
                                                    " lost an executor to another gang while forming"));
}

absl::Status NoGangTask(const GangLease& gang) {
  return absl::NotFoundError(absl::StrCat("job ", gang.job_id, " has no task ", gang.task_index));
}

absl::Status NoGang(const std::string& job_id, int64_t task_index, int attempt) {
  return absl::NotFoundError(absl::StrCat("attempt ", attempt, " of task ", job_id, "/", task_index, " has no gang"));
}

}  // namespace

absl::Status GangOperations::RecordGang(const GangLease& gang) {
  RETURN_IF_ERROR(gang_rows::CheckNewGang(gang));
  return RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::Status {
    ASSIGN_OR_RETURN(std::vector<Task> tasks, row_access::LoadTasks(t, {{gang.job_id, gang.task_index}}, Locking::kNone));
    if (tasks.empty()) return NoGangTask(gang);
    ASSIGN_OR_RETURN(std::optional<GangLease> seated, t.GangOfAttempt(gang.job_id, gang.task_index, gang.attempt));
    if (seated) {
      return absl::AlreadyExistsError(absl::StrCat("attempt ", gang.attempt, " of task ", gang.job_id, "/",
                                                   gang.task_index, " has a gang already"));
    }
    for (const GangSeat& seat : gang.members) {
      ASSIGN_OR_RETURN(std::optional<GangLease> other, t.SeatOf(seat.executor_id));
      if (other) return InGangAlready(seat.executor_id, *other);
    }
    ASSIGN_OR_RETURN(bool inserted, t.InsertGang(gang));
    return inserted ? absl::OkStatus() : LostASeat(gang);
  });
}

absl::StatusOr<GangLease> GangOperations::GangOf(const std::string& executor_id) {
  return RunTransaction(store_, TransactionKind::kRead, [&](RowTransaction& t) -> absl::StatusOr<GangLease> {
    const absl::Status none = absl::NotFoundError(absl::StrCat("executor ", executor_id, " is in no gang"));
    ASSIGN_OR_RETURN(std::optional<GangLease> seat, t.SeatOf(executor_id));
    if (!seat) return none;
    ASSIGN_OR_RETURN(std::optional<GangLease> gang, t.GangOfAttempt(seat->job_id, seat->task_index, seat->attempt));
    if (!gang) return none;
    return *std::move(gang);
  });
}

absl::StatusOr<std::vector<GangLease>> GangOperations::ListGangs() {
  return RunTransaction(store_, TransactionKind::kRead, [&](RowTransaction& t) { return t.ListGangs(); });
}

absl::Status GangOperations::EndGang(const std::string& job_id, int64_t task_index, int attempt) {
  return RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::Status {
    ASSIGN_OR_RETURN(int64_t removed, t.DeleteGang(job_id, task_index, attempt));
    return removed > 0 ? absl::OkStatus() : NoGang(job_id, task_index, attempt);
  });
}

absl::StatusOr<std::optional<GangTaskRef>> GangOperations::NextGangTask(absl::Time now) {
  using Next = std::optional<GangTaskRef>;
  return RunTransaction(store_, TransactionKind::kRead, [&](RowTransaction& t) -> absl::StatusOr<Next> {
    ASSIGN_OR_RETURN(std::vector<TeamUsage> teams, t.TeamStandings(now));
    const std::map<std::string, int> ranks = FairShareRanks(teams);
    ASSIGN_OR_RETURN(std::vector<PendingGangTask> candidates, t.PendingGangTasks(now, gang_rows::kGangTaskCandidates));
    for (const PendingGangTask& candidate : candidates) {
      auto rank = ranks.find(candidate.team);
      if (rank != ranks.end() && rank->second < 0) continue;  // its team runs its quota
      ASSIGN_OR_RETURN(Job job, row_access::LoadJob(t, candidate.task.first));
      return Next(GangTaskRef{std::move(job), candidate.task.second});
    }
    return Next();
  });
}

absl::StatusOr<Lease> GangOperations::LeaseToGang(const GangLease& requested, absl::Duration ttl, absl::Time now) {
  GangLease gang = requested;
  gang.attempt = 1;  // checked for shape here; the real attempt is the grant's
  RETURN_IF_ERROR(gang_rows::CheckNewGang(gang));
  return RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::StatusOr<Lease> {
    // The store's lock order: tasks, then jobs, then executors.
    ASSIGN_OR_RETURN(std::vector<Task> tasks, row_access::LoadTasks(t, {{gang.job_id, gang.task_index}}));
    if (tasks.empty()) return NoGangTask(gang);
    Task task = std::move(tasks.front());
    ASSIGN_OR_RETURN(Job job, row_access::LoadJob(t, gang.job_id));
    ASSIGN_OR_RETURN(Executor leader, row_access::LoadExecutor(t, gang.leader()));
    RETURN_IF_ERROR(gang_rows::CheckGangGrant(gang, leader, job, task, now));
    // Seats its executors held in gangs whose attempt has ended are freed first.
    for (const GangSeat& seat : gang.members) {
      ASSIGN_OR_RETURN(std::optional<GangLease> other, t.SeatOf(seat.executor_id));
      if (!other) continue;
      ASSIGN_OR_RETURN(std::vector<Task> seated, row_access::LoadTasks(t, {{other->job_id, other->task_index}}));
      if (!seated.empty() && gang_rows::GangAlive(*other, seated.front())) return InGangAlready(seat.executor_id, *other);
      RETURN_IF_ERROR(t.DeleteGang(other->job_id, other->task_index, other->attempt).status());
    }
    RETURN_IF_ERROR(GrantTask(task, leader.id, ttl, now));
    RowWrites granted{.tasks = {task}};
    if (MarkJobStarted(job, now)) granted.jobs.push_back(job);
    if (store_rules::MarkBusy(leader)) granted.executors.push_back(leader);
    RETURN_IF_ERROR(t.Update(granted));
    gang.attempt = task.attempt;
    gang.formed_at = now;
    ASSIGN_OR_RETURN(bool inserted, t.InsertGang(gang));
    if (!inserted) return LostASeat(gang);
    Lease lease = MakeLease(std::move(task), job.spec);
    lease.gang = gang.members;
    return lease;
  });
}

}  // namespace minions
