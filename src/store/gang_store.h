#pragma once
// GangStore: the durable record of which executors form which gang (docs/architecture.md,
// "Gangs"). A gang runs one attempt of one task: its leader (seat 0) holds the task's lease and
// runs the runner; its members lend their memory through rpc-servers. While the gang lives, each
// of its executors is in no other gang (an executor sits in one gang at a time); ending the
// attempt ends the gang and frees its seats. `minions status`, `minions executors` and the
// dashboard read the gangs from here; the lease path writes them when GangReserver
// (server/gang_reservation.h) forms a gang.
//
// Contract (every implementation passes tests/store/gang_store_contract.cc), as for the
// MetadataStore: each method is one transaction. Errors: InvalidArgument for a malformed gang;
// NotFound for an unknown task or gang; AlreadyExists when the attempt has a gang already;
// FailedPrecondition, naming the executor and its gang, when an executor already sits in one;
// Unavailable when the backend cannot be reached.
// Threads: implementations are thread-safe.

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/types.h"

namespace minions {


// The gang of one task attempt. members[0] leads.
struct GangLease {
  std::string job_id;
  int64_t task_index = 0;
  int attempt = 0;
  std::vector<GangSeat> members;
  absl::Time formed_at;
  const std::string& leader() const { return members.front().executor_id; }
  bool operator==(const GangLease&) const = default;
};

// The gangs of `gangs` whose attempt is still running (`running`: the running tasks), by executor
// id: what `minions executors`, `minions status` and the dashboard show. Seats left by an ended
// attempt (freed lazily) are not shown.
inline std::map<std::string, GangLease> LivingGangsByExecutor(const std::vector<GangLease>& gangs,
                                                              const std::vector<Task>& running) {
  std::map<std::string, GangLease> by_executor;
  for (const GangLease& gang : gangs) {
    const bool alive = std::any_of(running.begin(), running.end(), [&](const Task& t) {
      return t.job_id == gang.job_id && t.index == gang.task_index && t.attempt == gang.attempt;
    });
    if (!alive) continue;
    for (const GangSeat& seat : gang.members) by_executor[seat.executor_id] = gang;
  }
  return by_executor;
}

// Gangs have 2 to this many executors (a leader and llama.cpp's 16 rpc servers at most).
inline constexpr size_t kMaxGangSize = 17;

// A pending task of a gang job, as the lease path finds it (GangStore::NextGangTask).
struct GangTaskRef {
  Job job;
  int64_t task_index = 0;
};

class GangStore {
 public:
  virtual ~GangStore() = default;

  // The next pending task of a gang job (jobs.gang_size >= 2) a gang should run: not backing off,
  // its job queued or running, its team not at its running-task quota; highest priority first,
  // then the oldest job, then task index. nullopt when none.
  virtual absl::StatusOr<std::optional<GangTaskRef>> NextGangTask(absl::Time now) = 0;
  // One transaction: grants the pending task (gang.job_id, gang.task_index) to gang.leader() (a new
  // attempt, leased for `ttl`, as LeaseTasks grants one) and records `gang` as that attempt's
  // gang (gang.attempt and formed_at are set here). Seats its executors held in gangs whose attempt
  // has ended (the task moved on) are freed first. FailedPrecondition when the task is not
  // pending, its job is not a gang job that may run, the leader may not lease, or an executor sits
  // in a living gang.
  virtual absl::StatusOr<Lease> LeaseToGang(const GangLease& gang, absl::Duration ttl, absl::Time now) = 0;

  // Records the gang that runs attempt `gang.attempt` of task (job_id, task_index).
  virtual absl::Status RecordGang(const GangLease& gang) = 0;
  // The gang `executor_id` sits in (as leader or member); NotFound when none.
  virtual absl::StatusOr<GangLease> GangOf(const std::string& executor_id) = 0;
  // Every living gang, oldest first (then by job and task).
  virtual absl::StatusOr<std::vector<GangLease>> ListGangs() = 0;
  // Ends the gang of that attempt: its executors are free. NotFound when it has none (ended
  // already, or never formed), so a second end changes nothing.
  virtual absl::Status EndGang(const std::string& job_id, int64_t task_index, int attempt) = 0;
};

}  // namespace minions
