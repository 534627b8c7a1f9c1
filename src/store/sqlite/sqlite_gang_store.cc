// The GangStore half of SqliteMetadataStore: which executors form which gang (see gang_store.h).

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/fair_share.h"
#include "model/state_machines.h"
#include "store/common/store_rules.h"
#include "store/common/gang_rows.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "store/sqlite/sqlite_statement.h"

namespace minions {
namespace {

using sqlite_store::Statement;

constexpr char kInsertSeat[] =
    "INSERT INTO gang_seats (" MINIONS_STORE_GANG_SEAT_COLUMNS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
constexpr char kTaskExists[] = "SELECT COUNT(*) FROM tasks WHERE job_id = :job AND idx = :index";
constexpr char kAttemptSeats[] =
    "SELECT COUNT(*) FROM gang_seats WHERE job_id = :job AND task_index = :index AND attempt = :attempt";
constexpr char kSeatOf[] = "SELECT " MINIONS_STORE_GANG_SEAT_COLUMNS " FROM gang_seats WHERE executor_id = :executor";
constexpr char kSeatsOfAttempt[] = "SELECT " MINIONS_STORE_GANG_SEAT_COLUMNS
                                   " FROM gang_seats WHERE job_id = :job AND task_index = :index AND attempt = :attempt"
                                   " ORDER BY seat";
constexpr char kAllSeats[] = "SELECT " MINIONS_STORE_GANG_SEAT_COLUMNS
                             " FROM gang_seats ORDER BY formed_at, job_id, task_index, attempt, seat";
constexpr char kDeleteAttempt[] =
    "DELETE FROM gang_seats WHERE job_id = :job AND task_index = :index AND attempt = :attempt";

// Pending tasks of gang jobs, in the order gangs take them (GangStore::NextGangTask).
constexpr char kGangCandidates[] =
    "SELECT t.job_id, t.idx, j.team FROM tasks t JOIN jobs j ON j.id = t.job_id "
    "WHERE j.gang_size >= 2 AND j.state IN (:queued, :running) AND t.state = :pending "
    "AND (t.not_before IS NULL OR t.not_before <= :now) "
    "ORDER BY j.priority DESC, j.created_at, j.id, t.idx LIMIT :limit";

absl::StatusOr<std::vector<GangLease>> ReadGangs(Statement& query) {
  std::vector<GangLease> gangs;
  while (true) {
    ASSIGN_OR_RETURN(bool row, query.Step());
    if (!row) break;
    gang_rows::AddSeat(query, gangs);
  }
  return gangs;
}

absl::StatusOr<int64_t> Count(Statement& query) {
  ASSIGN_OR_RETURN(bool row, query.Step());
  return row ? query.Int(0) : 0;
}

}  // namespace

absl::Status SqliteMetadataStore::RecordGang(const GangLease& gang) {
  RETURN_IF_ERROR(gang_rows::CheckNewGang(gang));
  return InTransaction(true, [&]() -> absl::Status {
    mu_.AssertHeld();
    {
      ASSIGN_OR_RETURN(Statement task, Prepare(kTaskExists));
      task.BindText(":job", gang.job_id).BindInt(":index", gang.task_index);
      ASSIGN_OR_RETURN(int64_t tasks, Count(task));
      if (tasks == 0) return absl::NotFoundError(absl::StrCat("job ", gang.job_id, " has no task ", gang.task_index));
    }
    {
      ASSIGN_OR_RETURN(Statement seats, Prepare(kAttemptSeats));
      seats.BindText(":job", gang.job_id).BindInt(":index", gang.task_index).BindInt(":attempt", gang.attempt);
      ASSIGN_OR_RETURN(int64_t taken, Count(seats));
      if (taken > 0) {
        return absl::AlreadyExistsError(absl::StrCat("attempt ", gang.attempt, " of task ", gang.job_id, "/",
                                                     gang.task_index, " has a gang already"));
      }
    }
    for (const GangSeat& seat : gang.members) {
      ASSIGN_OR_RETURN(Statement of, Prepare(kSeatOf));
      of.BindText(":executor", seat.executor_id);
      ASSIGN_OR_RETURN(std::vector<GangLease> other, ReadGangs(of));
      if (!other.empty()) {
        return absl::FailedPreconditionError(absl::StrCat("executor ", seat.executor_id, " is in the gang of task ",
                                                          other[0].job_id, "/", other[0].task_index, " already"));
      }
    }
    for (const store_rows::Values& values : gang_rows::SeatValues(gang)) {
      ASSIGN_OR_RETURN(Statement insert, Prepare(kInsertSeat));
      RETURN_IF_ERROR(insert.BindValues(values).Run());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<GangLease> SqliteMetadataStore::GangOf(const std::string& executor_id) {
  return InTransaction(false, [&]() -> absl::StatusOr<GangLease> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Statement of, Prepare(kSeatOf));
    of.BindText(":executor", executor_id);
    ASSIGN_OR_RETURN(std::vector<GangLease> found, ReadGangs(of));
    if (found.empty()) return absl::NotFoundError(absl::StrCat("executor ", executor_id, " is in no gang"));
    ASSIGN_OR_RETURN(Statement seats, Prepare(kSeatsOfAttempt));
    seats.BindText(":job", found[0].job_id).BindInt(":index", found[0].task_index).BindInt(":attempt", found[0].attempt);
    ASSIGN_OR_RETURN(std::vector<GangLease> gang, ReadGangs(seats));
    if (gang.empty()) return absl::NotFoundError(absl::StrCat("executor ", executor_id, " is in no gang"));
    return gang.front();
  });
}

absl::StatusOr<std::vector<GangLease>> SqliteMetadataStore::ListGangs() {
  return InTransaction(false, [&]() -> absl::StatusOr<std::vector<GangLease>> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Statement all, Prepare(kAllSeats));
    return ReadGangs(all);
  });
}

absl::Status SqliteMetadataStore::EndGang(const std::string& job_id, int64_t task_index, int attempt) {
  return InTransaction(true, [&]() -> absl::Status {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Statement remove, Prepare(kDeleteAttempt));
    RETURN_IF_ERROR(remove.BindText(":job", job_id).BindInt(":index", task_index).BindInt(":attempt", attempt).Run());
    if (remove.Changes() == 0) {
      return absl::NotFoundError(absl::StrCat("attempt ", attempt, " of task ", job_id, "/", task_index, " has no gang"));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::optional<GangTaskRef>> SqliteMetadataStore::NextGangTask(absl::Time now) {
  return InTransaction(false, [&]() -> absl::StatusOr<std::optional<GangTaskRef>> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(std::vector<TeamUsage> teams, LoadTeamUsage(now));
    const std::map<std::string, int> ranks = FairShareRanks(teams);
    std::optional<std::pair<std::string, int64_t>> chosen;
    {
    ASSIGN_OR_RETURN(Statement query, Prepare(kGangCandidates));
    query.BindText(":queued", std::string(JobStateName(JobState::kQueued)))
        .BindText(":running", std::string(JobStateName(JobState::kRunning)))
        .BindText(":pending", std::string(TaskStateName(TaskState::kPending)))
        .BindTime(":now", now)
        .BindInt(":limit", gang_rows::kGangTaskCandidates);
    while (!chosen) {
      ASSIGN_OR_RETURN(bool row, query.Step());
      if (!row) break;
      auto rank = ranks.find(query.Text(2));
      if (rank != ranks.end() && rank->second < 0) continue;  // its team runs its quota
      chosen.emplace(query.Text(0), query.Int(1));
    }
    }
    if (!chosen) return std::optional<GangTaskRef>();
    ASSIGN_OR_RETURN(Job job, LoadJob(chosen->first));
    return std::optional<GangTaskRef>(GangTaskRef{std::move(job), chosen->second});
  });
}

absl::StatusOr<Lease> SqliteMetadataStore::LeaseToGang(const GangLease& requested, absl::Duration ttl,
                                                       absl::Time now) {
  GangLease gang = requested;
  gang.attempt = 1;  // checked for shape here; the real attempt is the grant's
  RETURN_IF_ERROR(gang_rows::CheckNewGang(gang));
  return InTransaction(true, [&]() -> absl::StatusOr<Lease> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Executor leader, LoadExecutor(gang.leader()));
    ASSIGN_OR_RETURN(Job job, LoadJob(gang.job_id));
    ASSIGN_OR_RETURN(Task task, LoadTask(gang.job_id, gang.task_index));
    RETURN_IF_ERROR(gang_rows::CheckGangGrant(gang, leader, job, task, now));
    for (const GangSeat& seat : gang.members) {
      ASSIGN_OR_RETURN(Statement of, Prepare(kSeatOf));
      of.BindText(":executor", seat.executor_id);
      ASSIGN_OR_RETURN(std::vector<GangLease> other, ReadGangs(of));
      if (other.empty()) continue;
      ASSIGN_OR_RETURN(Task seated, LoadTask(other[0].job_id, other[0].task_index));
      if (gang_rows::GangAlive(other[0], seated)) {
        return absl::FailedPreconditionError(absl::StrCat("executor ", seat.executor_id, " is in the gang of task ",
                                                          other[0].job_id, "/", other[0].task_index, " already"));
      }
      ASSIGN_OR_RETURN(Statement remove, Prepare(kDeleteAttempt));
      RETURN_IF_ERROR(remove.BindText(":job", other[0].job_id)
                          .BindInt(":index", other[0].task_index)
                          .BindInt(":attempt", other[0].attempt)
                          .Run());
    }
    RETURN_IF_ERROR(GrantTask(task, leader.id, ttl, now));
    RETURN_IF_ERROR(SaveTask(task));
    if (MarkJobStarted(job, now)) RETURN_IF_ERROR(SaveJob(job));
    if (store_rules::MarkBusy(leader)) RETURN_IF_ERROR(SaveExecutor(leader));
    gang.attempt = task.attempt;
    gang.formed_at = now;
    for (const store_rows::Values& values : gang_rows::SeatValues(gang)) {
      ASSIGN_OR_RETURN(Statement insert, Prepare(kInsertSeat));
      RETURN_IF_ERROR(insert.BindValues(values).Run());
    }
    Lease lease = MakeLease(std::move(task), job.spec);
    lease.gang = gang.members;
    return lease;
  });
}

}  // namespace minions
