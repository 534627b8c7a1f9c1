// The GangStore half of SqliteMetadataStore: which executors form which gang (see gang_store.h).

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

}  // namespace minions
