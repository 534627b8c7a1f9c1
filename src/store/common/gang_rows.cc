#include "store/common/gang_rows.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "store/common/store_rules.h"

namespace minions::gang_rows {

absl::Status CheckNewGang(const GangLease& gang) {
  if (gang.job_id.empty() || gang.task_index < 0 || gang.attempt < 1) {
    return absl::InvalidArgumentError("a gang names its task (job id, index) and attempt (1 or more)");
  }
  if (gang.members.size() < 2 || gang.members.size() > kMaxGangSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("a gang has 2 to ", kMaxGangSize, " executors, not ", gang.members.size()));
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < gang.members.size(); ++i) {
    const GangSeat& seat = gang.members[i];
    if (seat.executor_id.empty() || !seen.insert(seat.executor_id).second) {
      return absl::InvalidArgumentError(absl::StrCat("gang seat ", i, " names executor '", seat.executor_id,
                                                     "': each seat is a different executor"));
    }
    if (seat.bytes < 0) return absl::InvalidArgumentError(absl::StrCat("gang seat ", i, " lends negative bytes"));
    if (i == 0) continue;  // the leader connects; it serves nothing
    std::string host;
    int port = 0;
    // Not ":port" (SplitHostPort's every interface): a member is reached at one address.
    if (seat.endpoint.empty() || seat.endpoint.front() == ':' || seat.endpoint.size() > 255 ||
        !SplitHostPort(seat.endpoint, &host, &port).ok() || host.empty() || port < 1) {
      return absl::InvalidArgumentError(absl::StrCat("gang member ", seat.executor_id,
                                                     " needs its rpc endpoint as host:port, not '",
                                                     seat.endpoint.substr(0, 80), "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckGangGrant(const GangLease& gang, const Executor& leader, const Job& job, const Task& task,
                            absl::Time now) {
  if (!store_rules::MayLease(leader, 1)) {
    return absl::FailedPreconditionError(absl::StrCat("executor ", leader.id, " may not lease now (",
                                                      std::string(ExecutorStateName(leader.state)), ")"));
  }
  if (job.spec.gang_size < 2 || static_cast<size_t>(job.spec.gang_size) != gang.members.size()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job.id, " runs on gangs of ", job.spec.gang_size,
                                                      ", not ", gang.members.size()));
  }
  if (job.state != JobState::kQueued && job.state != JobState::kRunning) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job.id, " is ", std::string(JobStateName(job.state))));
  }
  if (task.state != TaskState::kPending || (task.not_before && *task.not_before > now)) {
    return absl::FailedPreconditionError(absl::StrCat("task ", job.id, "/", task.index, " is not waiting for a gang"));
  }
  return absl::OkStatus();
}

bool GangAlive(const GangLease& seated, const Task& task) {
  return task.state == TaskState::kRunning && task.attempt == seated.attempt;
}

std::vector<store_rows::Values> SeatValues(const GangLease& gang) {
  std::vector<store_rows::Values> rows;
  for (size_t i = 0; i < gang.members.size(); ++i) {
    const GangSeat& seat = gang.members[i];
    rows.push_back({gang.job_id, gang.task_index, int64_t{gang.attempt}, static_cast<int64_t>(i), seat.executor_id,
                    seat.endpoint, seat.bytes, absl::ToUnixMicros(gang.formed_at)});
  }
  return rows;
}

}  // namespace minions::gang_rows
