#include "store/common/executor_operations.h"

#include <set>
#include <utility>

#include "common/status_macros.h"
#include "store/common/row_access.h"
#include "store/common/verification_operations.h"
#include "store/common/store_rules.h"

namespace minions {
namespace {

namespace rules = store_rules;

// A batch's rows: every task it holds and every executor it names.
RowKeys HeartbeatRows(const std::vector<HeartbeatCall>& calls) {
  RowKeys keys;
  for (const HeartbeatCall& call : calls) {
    keys.executors.push_back(call.executor_id);
    for (const LeaseProgress& progress : call.held) keys.tasks.emplace_back(progress.job_id, progress.task_index);
  }
  return keys;
}

}  // namespace

absl::StatusOr<Executor> ExecutorOperations::RegisterExecutor(const std::string& executor_id, const ExecutorInfo& info,
                                                              absl::Time now) {
  return RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::StatusOr<Executor> {
    Executor executor;
    bool exists = false;
    if (!executor_id.empty()) {
      ASSIGN_OR_RETURN(Rows rows, t.Read(RowKeys{.executors = {executor_id}}));
      if (auto it = rows.executors.find(executor_id); it != rows.executors.end()) {
        executor = std::move(it->second);
        exists = true;
      } else {
        executor.id = executor_id;  // known to the executor, not (or no longer) to this store
      }
    }
    rules::RegisterExecutor(executor, exists, info, now);
    if (exists) RETURN_IF_ERROR(t.Update(RowWrites{.executors = {executor}}, /*last=*/true));
    if (!exists && !executor.id.empty()) RETURN_IF_ERROR(t.Insert(RowWrites{.executors = {executor}}));
    if (executor.id.empty()) RETURN_IF_ERROR(row_access::InsertWithFreshId(t, ids_, executor));
    return executor;
  });
}

absl::StatusOr<Executor> ExecutorOperations::GetExecutor(const std::string& executor_id) {
  return RunTransaction(store_, TransactionKind::kRead,
                        [&](RowTransaction& t) { return row_access::LoadExecutor(t, executor_id); });
}

absl::StatusOr<std::vector<Executor>> ExecutorOperations::ListExecutors() {
  return RunTransaction(store_, TransactionKind::kRead, [&](RowTransaction& t) { return t.ListExecutors(); });
}

absl::StatusOr<std::vector<HeartbeatReply>> ExecutorOperations::Heartbeats(const std::vector<HeartbeatCall>& calls,
                                                                           absl::Duration ttl, absl::Time now) {
  if (calls.empty()) return std::vector<HeartbeatReply>{};
  using Replies = std::vector<HeartbeatReply>;
  return RunTransaction(store_, TransactionKind::kHeartbeats, [&](RowTransaction& t) -> absl::StatusOr<Replies> {
    // Both loads in one round trip (with the BEGIN, where the backend can), both writes in one
    // (with the COMMIT): a batch waits on two round trips, whatever its size.
    ASSIGN_OR_RETURN(Rows rows, t.Read(HeartbeatRows(calls)));
    Replies replies;
    std::set<TaskId> renewed_keys;
    std::set<std::string> heard;
    for (const HeartbeatCall& call : calls) {
      HeartbeatReply& reply = replies.emplace_back();
      auto executor = rows.executors.find(call.executor_id);
      if (executor == rows.executors.end()) {
        // Its leases are left alone: it registers again (same id) and heartbeats them then.
        reply.unknown_executor = true;
        continue;
      }
      if (rules::HeardSince(executor->second, call.unless_heard_since)) {
        reply.drain = executor->second.drain_requested;  // heard since: nothing to write
        continue;
      }
      heard.insert(call.executor_id);
      rules::RecordHeartbeat(executor->second, call.state, call.reason, now, call.holdings);
      // A quarantined executor's answers are not trusted: it must stop what it holds, which goes
      // to others when the leases expire.
      const bool quarantined = executor->second.state == ExecutorState::kQuarantined;
      for (const LeaseProgress& progress : call.held) {
        TaskId key{progress.job_id, progress.task_index};
        auto task = rows.tasks.find(key);
        if (quarantined || task == rows.tasks.end()) {
          reply.cancel.push_back(progress);
          continue;
        }
        const Task before = task->second;
        if (!rules::RenewLease(task->second, call.executor_id, progress, ttl, now)) {
          reply.cancel.push_back(progress);
          continue;
        }
        // The chunks it committed: stamped with their producer, and spot checks drawn.
        RETURN_IF_ERROR(VerificationOperations::DrawSpotChecks(t, options_, before, task->second, call.executor_id,
                                                               executor->second.records_done, now));
        renewed_keys.insert(std::move(key));
        reply.renewed.push_back(progress);
      }
      reply.drain = executor->second.drain_requested;
    }
    RowWrites writes;
    for (const TaskId& key : renewed_keys) writes.tasks.push_back(rows.tasks.at(key));
    for (const std::string& id : heard) writes.executors.push_back(rows.executors.at(id));
    if (!writes.empty()) RETURN_IF_ERROR(t.Update(writes, /*last=*/true));
    return replies;
  });
}

absl::Status ExecutorOperations::RequestDrain(const std::string& executor_id, absl::Time now) {
  return RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::Status {
    ASSIGN_OR_RETURN(Executor executor, row_access::LoadExecutor(t, executor_id));
    rules::RequestDrain(executor);
    return t.Update(RowWrites{.executors = {executor}}, /*last=*/true);
  });
}

absl::StatusOr<std::vector<Executor>> ExecutorOperations::MarkLostExecutors(absl::Time cutoff, absl::Time now) {
  return RunTransaction(store_, TransactionKind::kWrite,
                        [&](RowTransaction& t) -> absl::StatusOr<std::vector<Executor>> {
                          ASSIGN_OR_RETURN(std::vector<Executor> lost, t.SilentExecutors(cutoff));
                          for (Executor& executor : lost) rules::MarkLost(executor);
                          if (!lost.empty()) RETURN_IF_ERROR(t.Update(RowWrites{.executors = lost}, /*last=*/true));
                          return lost;
                        });
}

}  // namespace minions

