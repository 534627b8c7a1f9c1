#pragma once
// The gang_seats table (store/gang_store.h) as both stores read and write it: one row per seat,
// seat 0 the leader. Columns, in this order, for every SELECT and INSERT of a seat:
#define MINIONS_STORE_GANG_SEAT_COLUMNS "job_id, task_index, attempt, seat, executor_id, endpoint, bytes, formed_at"

#include <vector>

#include "absl/status/statusor.h"
#include "store/common/store_rows.h"
#include "store/gang_store.h"
#include "store/row_transaction.h"

namespace minions::gang_rows {

// InvalidArgument unless `gang` names a task and an attempt and 2..kMaxGangSize distinct
// executors, every member but the leader with a host:port endpoint, none with negative bytes.
absl::Status CheckNewGang(const GangLease& gang);

// LeaseToGang's checks of what it read: the leader may lease, the job is a gang job that may
// run (queued or running) with gang.members.size() executors, the task is pending and not
// backing off at `now`. FailedPrecondition saying which.
absl::Status CheckGangGrant(const GangLease& gang, const Executor& leader, const Job& job, const Task& task,
                            absl::Time now);
// Whether a seat of `seated` (a gang read from the store) still belongs to a living attempt:
// its task (`task`, as read) runs that very attempt.
bool GangAlive(const GangLease& seated, const Task& task);
// The candidates NextGangTask considers at most in one look (teams at their quota are skipped).
inline constexpr int kGangTaskCandidates = 32;

// A pending task of a gang job, from a row of: job id, task index, the job's team (the
// backends' gang-candidate queries).
template <typename Row>
PendingGangTask ReadPendingGangTask(const Row& row) {
  return PendingGangTask{{row.Text(0), row.Int(1)}, row.Text(2)};
}

// The rows of `gang`'s seats, in the column order above.
std::vector<store_rows::Values> SeatValues(const GangLease& gang);

// Folds seat rows (ordered by gang, then seat) into gangs. `Row` has Text(i), Int(i), Time(i).
template <typename Row>
void AddSeat(const Row& row, std::vector<GangLease>& gangs) {
  GangSeat seat{row.Text(4), row.Text(5), row.Int(6)};
  const int64_t index = row.Int(1);
  const int attempt = static_cast<int>(row.Int(2));
  if (gangs.empty() || gangs.back().job_id != row.Text(0) || gangs.back().task_index != index ||
      gangs.back().attempt != attempt) {
    gangs.push_back(GangLease{row.Text(0), index, attempt, {}, row.Time(7)});
  }
  gangs.back().members.push_back(std::move(seat));
}

}  // namespace minions::gang_rows
