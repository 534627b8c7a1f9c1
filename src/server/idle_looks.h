#pragma once
// IdleLooks: which executors' last look for work found nothing, as of which announcement of work
// (LeaseWaitRoom::generation), and when each looks in the store anyway; whether no task of any job
// was pending as of an announcement (then every look finds nothing without asking the store until
// the next one, or its recheck). Without it, an announcement woke every waiting executor into a
// store lookup each: a job of a few hundred tasks cost a fleet of 10,000 executors 10,000
// lookups, and every requeue as many again.
//
// An executor that found nothing looks again at its idle recheck, or when a warm-executor wait of
// work announced ends, if one comes first (delay scheduling, model/placement.h: a cold executor
// waits no longer than the warm wait). It counts the store lookups made and spared.
// It decides nothing else: the service looks in the store and answers the calls
// (server/executor_service.h); the room holds them (server/lease_wait_room.h).
// Ownership: its maps and counters, under its own lock. Times are values: no clock, no thread.
// Threads: any. It takes no other lock.

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "model/types.h"

namespace minions {

class IdleLooks {
 public:
  // `idle_recheck`: how long an executor that found nothing goes without a store lookup when no
  // work is announced (ServerOptions::idle_recheck).
  explicit IdleLooks(absl::Duration idle_recheck) : idle_recheck_(idle_recheck) {}

  // Work was announced at `now`; cold executors may be refused it until `now + warm_wait` (zero:
  // no such wait). Call before the announcement counts (LeaseWaitRoom::Announce).
  void Announced(absl::Time now, absl::Duration warm_wait) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a look by `executor_id` at `now`, with `generation` the latest announcement, finds
  // nothing without the store: its own last look found nothing as of it and its recheck is not
  // due, or no task was pending as of it (then it counts as found nothing, spared). Otherwise the
  // look goes to the store (counted).
  bool Spared(const std::string& executor_id, uint64_t generation, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // A look as of `generation` found nothing; `current` is the latest announcement. Whether it
  // should ask the store whether any task is pending: one look asks at a time, once an
  // announcement (or again once that answer's recheck has passed). If true, FoundNothing must
  // follow with asked = true.
  bool StartPendingCheck(uint64_t generation, uint64_t current, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // The look found nothing as of `generation`: it looks in the store again at its recheck or on a
  // later announcement. `none_pending`: it asked, and no task of any job was pending.
  void FoundNothing(const std::string& executor_id, uint64_t generation, absl::Time now, bool asked,
                    bool none_pending) ABSL_LOCKS_EXCLUDED(mu_);
  // Its circumstances changed (it found work, registered, finished or gave up a task): its next
  // look goes to the store.
  void Forget(const std::string& executor_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Its heartbeat reports `state`: an executor whose state changed (its owner left) may be offered
  // what it was not before, so its next look goes to the store.
  void Reported(const std::string& executor_id, ExecutorState state) ABSL_LOCKS_EXCLUDED(mu_);
  // When an executor that found nothing looks in the store anyway (none: it found something, or
  // has not looked).
  std::optional<absl::Time> RecheckAt(const std::string& executor_id) const ABSL_LOCKS_EXCLUDED(mu_);

  int64_t lookups() const ABSL_LOCKS_EXCLUDED(mu_);         // looks that went to the store
  int64_t spared() const ABSL_LOCKS_EXCLUDED(mu_);          // answered by "none pending"
  int64_t pending_checks() const ABSL_LOCKS_EXCLUDED(mu_);  // times a look asked AnyTaskPending

 private:
  struct Mark {
    uint64_t generation = 0;
    absl::Time recheck_at;
    std::optional<ExecutorState> reported;  // the state its heartbeats report
  };
  // The next recheck of an executor that found nothing at `now`: the idle recheck, or the end of a
  // warm-executor wait if one comes first (and forgets the waits that have ended).
  absl::Time NextRecheckLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool NonePendingLocked(uint64_t generation, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return none_pending_ && none_pending_->generation == generation && now < none_pending_->recheck_at;
  }

  const absl::Duration idle_recheck_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Mark> marks_ ABSL_GUARDED_BY(mu_);
  std::optional<Mark> none_pending_ ABSL_GUARDED_BY(mu_);
  bool pending_check_running_ ABSL_GUARDED_BY(mu_) = false;
  // When the warm-executor waits of work announced so far end.
  std::set<absl::Time> warm_wait_ends_ ABSL_GUARDED_BY(mu_);
  int64_t lookups_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t spared_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pending_checks_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace minions
