#pragma once
// FakeClock: time moves only when a test says so. Sleepers and waiters wake when Advance() passes
// their deadline, so a test can run an hour of heartbeats in a microsecond.
//
// A test that drives code running on another thread does not sleep to let it reach its next wait:
// it waits for that (AwaitWaiters), then advances (Advance, or AdvanceToNextDeadline). For code
// on the test's own thread (a retry loop), AutoAdvance makes every sleep and every wait that is
// not over at once jump the clock to its deadline.
// Threads: thread-safe.

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace minions::testing {

class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}

  absl::Time Now() const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return now_;
  }

  bool SleepUntil(absl::Time deadline) override ABSL_LOCKS_EXCLUDED(mu_) {
    if (JumpedTo(deadline)) return false;
    absl::MutexLock lock(&mu_);
    const uint64_t generation = generation_;
    auto it = deadlines_.insert(deadline);
    auto done = [&] {
      mu_.AssertHeld();
      return now_ >= deadline || generation_ != generation;
    };
    mu_.Await(absl::Condition(&done));
    deadlines_.erase(it);
    return generation_ != generation && now_ < deadline;
  }

  void Wake() override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++generation_;
  }

  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& condition, absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) ABSL_LOCKS_EXCLUDED(mu_) {
    if (condition.Eval()) return true;
    if (JumpedTo(deadline)) return condition.Eval();
    auto timer = std::make_shared<Timer>();
    timer->mu = &mu;
    std::multiset<absl::Time>::iterator it;
    {
      absl::MutexLock lock(&mu_);
      if (now_ >= deadline) return false;
      timers_.insert(timer);
      it = deadlines_.insert(deadline);
      timer->deadline = deadline;
    }
    // `fired` is written under `mu` (by Advance), so Await sees it change.
    auto done = [&] { return timer->fired || condition.Eval(); };
    mu.Await(absl::Condition(&done));
    {
      absl::MutexLock lock(&mu_);
      timers_.erase(timer);
      deadlines_.erase(it);
    }
    return condition.Eval();
  }

  // On: every sleep, and every wait whose condition does not hold, moves the clock to its deadline
  // at once (for code under test that runs on the test's own thread).
  void AutoAdvance(bool on) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto_advance_ = on;
  }

  // Moves time forward by `d`, waking the sleepers and waiters whose deadline it passes.
  void Advance(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_) {
    std::set<std::shared_ptr<Timer>> due;
    {
      absl::MutexLock lock(&mu_);
      now_ += d;
      for (const auto& timer : timers_) {
        if (timer->deadline <= now_) due.insert(timer);
      }
    }
    // Each waiter's own mutex, never together with mu_ (a waiter holds its mutex, then takes mu_).
    for (const auto& timer : due) {
      absl::MutexLock lock(timer->mu);
      timer->fired = true;
    }
  }

  // Advances to the earliest deadline anyone still waits for; false (and no change) when nobody
  // does.
  bool AdvanceToNextDeadline() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::Duration step;
    {
      absl::MutexLock lock(&mu_);
      auto next = deadlines_.upper_bound(now_);
      if (next == deadlines_.end()) return false;
      step = *next - now_;
    }
    Advance(step);
    return true;
  }

  // How many threads sleep or wait on this clock now, for a deadline still ahead (one whose
  // deadline has passed is about to wake, and is not counted).
  int waiters() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return Waiting();
  }

  // Blocks until at least `n` threads sleep or wait on this clock for a deadline still ahead: the
  // code under test reached its next wait (after an Advance, a sleeper it woke counts again once
  // it sleeps again). False if that has not happened after `patience` of real time: a test that
  // gets false fails rather than hangs.
  bool AwaitWaiters(int n, absl::Duration patience = absl::Seconds(60)) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto enough = [&] {
      mu_.AssertHeld();
      return Waiting() >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), patience);
  }

 private:
  int Waiting() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(std::distance(deadlines_.upper_bound(now_), deadlines_.end()));
  }

  // With AutoAdvance on, advances to `deadline` (if it is ahead) and answers true.
  bool JumpedTo(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::Duration step;
    {
      absl::MutexLock lock(&mu_);
      if (!auto_advance_) return false;
      step = std::max(absl::ZeroDuration(), deadline - now_);
    }
    Advance(step);
    return true;
  }

  struct Timer {
    absl::Mutex* mu = nullptr;  // the waiter's mutex; `fired` is written under it
    absl::Time deadline;
    bool fired = false;
  };

  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool auto_advance_ ABSL_GUARDED_BY(mu_) = false;
  std::multiset<absl::Time> deadlines_ ABSL_GUARDED_BY(mu_);     // of every sleeper and waiter
  std::set<std::shared_ptr<Timer>> timers_ ABSL_GUARDED_BY(mu_);  // of the waiters (AwaitWithDeadline)
};

}  // namespace minions::testing
