#pragma once
// LeaseWaitRoom: the long-polling Lease calls held on this server, and the announcements of work
// that wake them. A held call is ready (to be served by a lease thread), being served, parked
// (until work is announced, its wait ends or its executor's recheck is due: whichever is first),
// or finished. It keeps which executors' idle polls are held (an idle poll stands for its
// executor's idle heartbeat: server/idle_renewals.h), when the next scan for renewals is due, and
// what a renewal answered that a held idle poll must tell its executor (drain, register again).
// It counts the held calls that spread (ExecutorService::SpreadShare) while ready or served.
//
// It decides nothing about work: what a look finds, and when an executor that found nothing looks
// again, are the service's (server/executor_service.h) and IdleLooks' (server/idle_looks.h).
// Ownership: its queues, maps and counters, under its own lock. The calls are the service's (a
// gRPC reactor each): the room holds pointers to those not finished; whoever moves a call to
// finished (a method that answers true, or Next's caller when it serves it) answers it.
// Threads: any. Next and AwaitAnnouncement wait on the Clock (the lease threads, and a typed
// Lease on its caller's thread). It calls nothing outside itself while holding its lock, so a
// caller may call in while holding another part's lock (IdleRenewals' polling callback does).

#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace minions {

class LeaseWaitRoom {
 public:
  // A held call as the room sees it (the service's held Lease derives from it). Its state is the
  // room's, written under the room's lock only.
  class Call {
   public:
    Call(std::string executor_id, absl::Time deadline, bool idle, bool spreads)
        : executor_id(std::move(executor_id)), deadline(deadline), idle(idle), spreads(spreads) {}
    virtual ~Call() = default;

    const std::string executor_id;
    const absl::Time deadline;  // when its wait ends
    const bool idle;            // stands for its executor's idle heartbeat while held
    // Its executor holds nothing and runs long tasks (or has not measured yet): counted while
    // ready or being served (spread before stacking).
    const bool spreads;

   private:
    friend class LeaseWaitRoom;
    enum class State { kReady, kServing, kParked, kFinished };
    State state = State::kReady;
    bool cancelled = false;
    absl::Time wake_at;  // while parked
  };

  // What a renewal answered that the executor has not heard yet, told to its held idle poll.
  struct Notice {
    bool drain = false;
    bool reregister = false;
  };

  // `scan_period`: how often the held idle polls are looked over for renewals due.
  LeaseWaitRoom(Clock* clock, absl::Duration scan_period) : clock_(clock), scan_period_(scan_period) {}
  LeaseWaitRoom(const LeaseWaitRoom&) = delete;
  LeaseWaitRoom& operator=(const LeaseWaitRoom&) = delete;

  // Announcements of work so far (a look for work is as of one of them).
  uint64_t generation() const ABSL_LOCKS_EXCLUDED(mu_);
  // New work may be leasable: every parked call is ready again.
  void Announce() ABSL_LOCKS_EXCLUDED(mu_);
  // The server is stopping: parked calls are ready (to be answered at once), and none parks again.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  bool stopping() const ABSL_LOCKS_EXCLUDED(mu_);
  // The service goes: as Stop, and Next answers an empty turn once nothing is ready.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

  // A held call enters, ready to be served. An idle one becomes its executor's idle poll (an older
  // one still held no longer stands for it), and renewal scans begin.
  void Enter(Call* call, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // A lease thread's next turn: a call to serve (now being served), or a renewal scan (the
  // executors whose idle polls are held), or neither (the room closed). Waits on the clock until
  // one comes: a parked call's wake, the next scan, an announcement.
  struct Turn {
    Call* call = nullptr;
    bool scan = false;
    std::vector<std::string> idle_polls;
  };
  Turn Next() ABSL_LOCKS_EXCLUDED(mu_);
  // A served call's serving ended (it was answered, parked or queued again): `spreads` is its.
  void ServingEnded(bool spreads) ABSL_LOCKS_EXCLUDED(mu_);

  // A turn begins for `call`: whether it was cancelled, how many other spreading calls are ready
  // or being served, and the notice kept for its executor, if any (then the call is finished, its
  // caller answers it with the notice).
  struct Look {
    bool cancelled = false;
    int64_t others_spreading = 0;
    std::optional<Notice> notice;
  };
  Look BeginLook(Call* call) ABSL_LOCKS_EXCLUDED(mu_);
  // Its look (as of announcement `generation`) is over. `wait_until`: the look found nothing and
  // the call may wait until then. Parked (kWaiting) unless work was announced since, or a notice
  // came for it (then ready again, kWaiting too), or the room stops; else finished: kCancelled
  // when it was cancelled, else kAnswer (its caller answers it).
  enum class AfterLook { kWaiting, kCancelled, kAnswer };
  AfterLook EndLook(Call* call, uint64_t generation, std::optional<absl::Time> wait_until) ABSL_LOCKS_EXCLUDED(mu_);
  // The call was cancelled: true when it was parked (now finished: the caller answers it);
  // otherwise whoever serves it answers it.
  bool Cancel(Call* call) ABSL_LOCKS_EXCLUDED(mu_);

  // A renewal's answer for `executor_id`: kept for its held idle poll (none held: dropped), and a
  // parked one is ready at once.
  void Tell(const std::string& executor_id, Notice notice) ABSL_LOCKS_EXCLUDED(mu_);
  // It registered again: what it was told before is moot.
  void ForgetNotice(const std::string& executor_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether an idle poll of `executor_id` is held here.
  bool Polling(const std::string& executor_id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether an idle poll of an executor other than `producer` is parked here (spot checks: one
  // may be woken to verify what `producer` committed, ExecutorService::WakeAVerifier).
  bool AnyParkedIdlePollBut(const std::string& producer) const ABSL_LOCKS_EXCLUDED(mu_);
  // Readies one parked idle poll of an executor other than `producer` with an empty notice: it is
  // answered at once, with no work, and its executor asks for spot checks now rather than when its
  // poll would have ended. Returns whether one was woken.
  bool WakeOneIdlePollBut(const std::string& producer) ABSL_LOCKS_EXCLUDED(mu_);

  // A caller that holds no call (a typed Lease): waits until work is announced after `generation`,
  // or the room stops, or the clock reaches `wake`. Returns whether the room stops.
  bool AwaitAnnouncement(uint64_t generation, absl::Time wake) ABSL_LOCKS_EXCLUDED(mu_);

  // Calls parked now.
  int64_t waiting() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Queues `call` to be served (counted in spreading_ if it spreads).
  void MakeReadyLocked(Call* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WakeParkedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Parks `call` until `wake_at` / takes a parked call out of the parked sets (its state is the
  // caller's to set).
  void ParkLocked(Call* call, absl::Time wake_at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnparkLocked(Call* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A call ends: it no longer stands for its executor's idle heartbeat.
  void FinishLocked(Call* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  const absl::Duration scan_period_;
  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Call*> ready_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, Call*>> parked_ ABSL_GUARDED_BY(mu_);  // by wake time
  int64_t spreading_ ABSL_GUARDED_BY(mu_) = 0;  // spreading calls ready or being served
  absl::flat_hash_map<std::string, Call*> idle_polls_ ABSL_GUARDED_BY(mu_);  // the latest, by executor
  // The parked calls of idle_polls_ (each its executor's latest): what a producer's commit may wake
  // to verify (WakeOneIdlePollBut), answered in O(1) on every commit.
  absl::flat_hash_set<Call*> parked_idle_ ABSL_GUARDED_BY(mu_);
  absl::Time next_scan_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::flat_hash_map<std::string, Notice> notices_ ABSL_GUARDED_BY(mu_);
};

}  // namespace minions
