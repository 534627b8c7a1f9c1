// The GangStore half of PostgresMetadataStore: which executors form which gang (see gang_store.h).
// Two gangs recorded at once that share an executor: the seat's UNIQUE executor_id lets one in,
// the other inserts nothing and answers FailedPrecondition.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/fair_share.h"
#include "model/state_machines.h"
#include "store/common/store_rules.h"
#include "common/status_macros.h"
#include "store/common/gang_rows.h"
#include "store/postgres/pg_connection.h"
#include "store/postgres/postgres_metadata_store.h"

namespace minions {
namespace {

using postgres_store::Params;
using postgres_store::PgResult;
using postgres_store::Row;

constexpr char kInsertSeat[] = "INSERT INTO gang_seats (" MINIONS_STORE_GANG_SEAT_COLUMNS
                               ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING";
constexpr char kTaskExists[] = "SELECT COUNT(*) FROM tasks WHERE job_id = $1 AND idx = $2";
constexpr char kAttemptSeats[] =
    "SELECT COUNT(*) FROM gang_seats WHERE job_id = $1 AND task_index = $2 AND attempt = $3";
constexpr char kSeatOf[] = "SELECT " MINIONS_STORE_GANG_SEAT_COLUMNS " FROM gang_seats WHERE executor_id = $1";
constexpr char kSeatsOfAttempt[] = "SELECT " MINIONS_STORE_GANG_SEAT_COLUMNS
                                   " FROM gang_seats WHERE job_id = $1 AND task_index = $2 AND attempt = $3"
                                   " ORDER BY seat";
constexpr char kAllSeats[] = "SELECT " MINIONS_STORE_GANG_SEAT_COLUMNS
                             " FROM gang_seats ORDER BY formed_at, job_id, task_index, attempt, seat";
constexpr char kDeleteAttempt[] = "DELETE FROM gang_seats WHERE job_id = $1 AND task_index = $2 AND attempt = $3";

// Pending tasks of gang jobs, in the order gangs take them (GangStore::NextGangTask).
constexpr char kGangCandidates[] =
    "SELECT t.job_id, t.idx, j.team FROM tasks t JOIN jobs j ON j.id = t.job_id "
    "WHERE j.gang_size >= 2 AND j.state IN ($1, $2) AND t.state = 'pending' "
    "AND (t.not_before IS NULL OR t.not_before <= $3) "
    "ORDER BY j.priority DESC, j.created_at, j.id, t.idx LIMIT $4";

std::vector<GangLease> ReadGangs(const PgResult& result) {
  std::vector<GangLease> gangs;
  for (int i = 0; i < result.Rows(); ++i) gang_rows::AddSeat(Row{result, i}, gangs);
  return gangs;
}

absl::Status InGangAlready(const std::string& executor_id, const GangLease& other) {
  return absl::FailedPreconditionError(
      absl::StrCat("executor ", executor_id, " is in the gang of task ", other.job_id, "/", other.task_index, " already"));
}

}  // namespace

absl::Status PostgresMetadataStore::RecordGang(const GangLease& gang) {
  RETURN_IF_ERROR(gang_rows::CheckNewGang(gang));
  return InTransaction(true, [&](Connection& c) -> absl::Status {
    ASSIGN_OR_RETURN(PgResult task, c.Exec(kTaskExists, Params().Text(gang.job_id).Int(gang.task_index)));
    if (task.Rows() != 1 || Row{task, 0}.Int(0) == 0) {
      return absl::NotFoundError(absl::StrCat("job ", gang.job_id, " has no task ", gang.task_index));
    }
    ASSIGN_OR_RETURN(PgResult seats,
                     c.Exec(kAttemptSeats, Params().Text(gang.job_id).Int(gang.task_index).Int(gang.attempt)));
    if (seats.Rows() == 1 && Row{seats, 0}.Int(0) > 0) {
      return absl::AlreadyExistsError(absl::StrCat("attempt ", gang.attempt, " of task ", gang.job_id, "/",
                                                   gang.task_index, " has a gang already"));
    }
    for (const GangSeat& seat : gang.members) {
      ASSIGN_OR_RETURN(PgResult of, c.Exec(kSeatOf, Params().Text(seat.executor_id)));
      std::vector<GangLease> other = ReadGangs(of);
      if (!other.empty()) return InGangAlready(seat.executor_id, other[0]);
    }
    for (const store_rows::Values& values : gang_rows::SeatValues(gang)) {
      ASSIGN_OR_RETURN(PgResult inserted, c.Exec(kInsertSeat, Params().Values(values)));
      if (inserted.Affected() != 1) {
        // Another gang took a seat's executor (or this attempt) since the checks above.
        return absl::FailedPreconditionError(absl::StrCat("the gang of task ", gang.job_id, "/", gang.task_index,
                                                          " lost an executor to another gang while forming"));
      }
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<GangLease> PostgresMetadataStore::GangOf(const std::string& executor_id) {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<GangLease> {
    ASSIGN_OR_RETURN(PgResult of, c.Exec(kSeatOf, Params().Text(executor_id)));
    std::vector<GangLease> found = ReadGangs(of);
    if (found.empty()) return absl::NotFoundError(absl::StrCat("executor ", executor_id, " is in no gang"));
    ASSIGN_OR_RETURN(PgResult seats, c.Exec(kSeatsOfAttempt, Params()
                                                                 .Text(found[0].job_id)
                                                                 .Int(found[0].task_index)
                                                                 .Int(found[0].attempt)));
    std::vector<GangLease> gang = ReadGangs(seats);
    if (gang.empty()) return absl::NotFoundError(absl::StrCat("executor ", executor_id, " is in no gang"));
    return gang.front();
  });
}

absl::StatusOr<std::vector<GangLease>> PostgresMetadataStore::ListGangs() {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::vector<GangLease>> {
    ASSIGN_OR_RETURN(PgResult all, c.Exec(kAllSeats));
    return ReadGangs(all);
  });
}

absl::Status PostgresMetadataStore::EndGang(const std::string& job_id, int64_t task_index, int attempt) {
  return InTransaction(true, [&](Connection& c) -> absl::Status {
    ASSIGN_OR_RETURN(PgResult removed, c.Exec(kDeleteAttempt, Params().Text(job_id).Int(task_index).Int(attempt)));
    if (removed.Affected() == 0) {
      return absl::NotFoundError(absl::StrCat("attempt ", attempt, " of task ", job_id, "/", task_index, " has no gang"));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::optional<GangTaskRef>> PostgresMetadataStore::NextGangTask(absl::Time now) {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::optional<GangTaskRef>> {
    ASSIGN_OR_RETURN(std::vector<TeamUsage> teams, LoadTeamUsage(c, now));
    const std::map<std::string, int> ranks = FairShareRanks(teams);
    ASSIGN_OR_RETURN(PgResult result, c.Exec(kGangCandidates, Params()
                                                                  .Text(std::string(JobStateName(JobState::kQueued)))
                                                                  .Text(std::string(JobStateName(JobState::kRunning)))
                                                                  .Time(now)
                                                                  .Int(gang_rows::kGangTaskCandidates)));
    for (int i = 0; i < result.Rows(); ++i) {
      const Row row{result, i};
      auto rank = ranks.find(row.Text(2));
      if (rank != ranks.end() && rank->second < 0) continue;  // its team runs its quota
      ASSIGN_OR_RETURN(Job job, LoadJob(c, row.Text(0)));
      return std::optional<GangTaskRef>(GangTaskRef{std::move(job), row.Int(1)});
    }
    return std::optional<GangTaskRef>();
  });
}

absl::StatusOr<Lease> PostgresMetadataStore::LeaseToGang(const GangLease& requested, absl::Duration ttl,
                                                         absl::Time now) {
  GangLease gang = requested;
  gang.attempt = 1;  // checked for shape here; the real attempt is the grant's
  RETURN_IF_ERROR(gang_rows::CheckNewGang(gang));
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<Lease> {
    // The store's lock order: tasks, then jobs, then executors.
    ASSIGN_OR_RETURN(std::vector<Task> tasks, LoadTasks(c, {{gang.job_id, gang.task_index}}));
    if (tasks.empty()) return absl::NotFoundError(absl::StrCat("job ", gang.job_id, " has no task ", gang.task_index));
    Task task = std::move(tasks.front());
    ASSIGN_OR_RETURN(Job job, LoadJob(c, gang.job_id));
    ASSIGN_OR_RETURN(Executor leader, LoadExecutor(c, gang.leader()));
    RETURN_IF_ERROR(gang_rows::CheckGangGrant(gang, leader, job, task, now));
    for (const GangSeat& seat : gang.members) {
      ASSIGN_OR_RETURN(PgResult of, c.Exec(kSeatOf, Params().Text(seat.executor_id)));
      std::vector<GangLease> other = ReadGangs(of);
      if (other.empty()) continue;
      ASSIGN_OR_RETURN(std::vector<Task> seated, LoadTasks(c, {{other[0].job_id, other[0].task_index}}));
      if (!seated.empty() && gang_rows::GangAlive(other[0], seated.front())) {
        return InGangAlready(seat.executor_id, other[0]);
      }
      RETURN_IF_ERROR(
          c.Exec(kDeleteAttempt, Params().Text(other[0].job_id).Int(other[0].task_index).Int(other[0].attempt))
              .status());
    }
    RETURN_IF_ERROR(GrantTask(task, leader.id, ttl, now));
    RETURN_IF_ERROR(SaveTasks(c, {task}));
    if (MarkJobStarted(job, now)) RETURN_IF_ERROR(SaveJob(c, job));
    if (store_rules::MarkBusy(leader)) RETURN_IF_ERROR(SaveExecutor(c, leader));
    gang.attempt = task.attempt;
    gang.formed_at = now;
    for (const store_rows::Values& values : gang_rows::SeatValues(gang)) {
      ASSIGN_OR_RETURN(PgResult inserted, c.Exec(kInsertSeat, Params().Values(values)));
      if (inserted.Affected() != 1) {
        return absl::FailedPreconditionError(absl::StrCat("the gang of task ", gang.job_id, "/", gang.task_index,
                                                          " lost an executor to another gang while forming"));
      }
    }
    Lease lease = MakeLease(std::move(task), job.spec);
    lease.gang = gang.members;
    return lease;
  });
}

}  // namespace minions
