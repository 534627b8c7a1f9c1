#pragma once
// IdleRenewals: when this server last renewed each executor's liveness for it — from its idle
// long polls (ServerOptions::idle_polls_renew: an idle poll stands for an idle heartbeat), and
// whenever its liveness was written anyway (it registered, or its own heartbeat was written) —
// so that an idle executor's polls renew it at most once an idle beat, as its own beats would.
// It counts the renewals made and those submitted and not answered yet (the service waits for
// them before it goes). It decides nothing else: the service holds the polls and sends the
// renewals (server/executor_service.h).
// Ownership: its map and counters, under its own lock.
// Threads: any. The `polling` callbacks run under its lock (they ask the LeaseWaitRoom, which
// never calls in here under its own); it takes no other lock.

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace minions {

class IdleRenewals {
 public:
  // `idle_heartbeat`: how often an idle executor must be renewed; `scan_period`: how often the
  // service looks for held polls due a renewal (a renewal is due this much early, so renewals
  // come at most an idle beat apart however the scans fall).
  IdleRenewals(absl::Duration idle_heartbeat, absl::Duration scan_period);

  // Its liveness was written at `now` (it registered, or its heartbeat was): no poll renews it
  // until an idle beat has passed. A fleet that is never idle holds no poll, so no scan forgets
  // silent executors: forgets them here whenever the map has doubled since the last sweep.
  void Written(const std::string& executor_id, absl::Time now,
               const std::function<bool(const std::string&)>& polling);
  // Its liveness was not written after all (a renewal or heartbeat failed): the next poll renews it.
  void NotWritten(const std::string& executor_id);
  // Whether `executor_id` is due a renewal at `now`; if so it counts as renewed from now.
  bool Due(const std::string& executor_id, absl::Time now);
  // Forgets the executors not renewed for two idle beats (gone, or heard by another server) for
  // which `polling` (whether an idle poll of it is held) says no.
  void ForgetSilent(absl::Time now, const std::function<bool(const std::string&)>& polling);

  // Renewals made: `n` counted (`in_flight`: submitted, their answers still to come).
  void Counted(int64_t n, bool in_flight);
  // A renewal submitted with `in_flight` was answered.
  void Answered();
  // Waits until every renewal submitted has been answered.
  void AwaitAnswered();
  int64_t count() const;
  // Executors it remembers (what ForgetSilent keeps small).
  size_t size() const;

 private:
  void ForgetSilentLocked(absl::Time now, const std::function<bool(const std::string&)>& polling)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration idle_heartbeat_;
  const absl::Duration scan_period_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, absl::Time> renewed_at_ ABSL_GUARDED_BY(mu_);
  size_t swept_size_ ABSL_GUARDED_BY(mu_) = 0;  // renewed_at_'s size after its last sweep
  int64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace minions
