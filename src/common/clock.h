#pragma once
// Clock: the one source of "now" and of waiting, so tests can drive time instead of sleeping.
// Nothing in the domain reads the wall clock directly, and nothing waits on real time behind the
// clock's back: a sleep, a retry's backoff and a wait for "this, or a deadline" all go through it.
// Threads: implementations are thread-safe.

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace minions {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Sleeps until `deadline` or until Wake() is called, whichever is first. Returns true if woken.
  virtual bool SleepUntil(absl::Time deadline) = 0;
  // Wakes every sleeper (shutdown, or new work to look at).
  virtual void Wake() = 0;
  // absl::Mutex::AwaitWithDeadline on this clock's time: with `mu` held, waits until `condition`
  // holds or the clock reaches `deadline`, whichever is first; returns whether `condition` holds.
  // `mu` is released while waiting. (A condition that changes under `mu` wakes the waiter at once,
  // whatever the clock.)
  virtual bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& condition, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
  bool SleepFor(absl::Duration d) { return SleepUntil(Now() + d); }
};

// Alarm: one sleeper's own wake-up call on a Clock. A loop sleeps until its next deadline or
// until another thread has something for it (an event arrived, a command, shutdown); ringing the
// alarm wakes that loop alone, where Clock::Wake() wakes every sleeper of the clock. A ring that
// comes while the loop is awake ends its next sleep at once.
// Threads: SleepUntil from the owning loop's thread only; Ring from any thread.
class Alarm {
 public:
  explicit Alarm(Clock* clock) : clock_(clock) {}
  Alarm(const Alarm&) = delete;
  Alarm& operator=(const Alarm&) = delete;

  // Sleeps until `deadline` (the clock's time) or until rung. True if rung; the ring is used up.
  bool SleepUntil(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    clock_->AwaitWithDeadline(mu_, absl::Condition(&rung_), deadline);
    const bool rung = rung_;
    rung_ = false;
    return rung;
  }
  void Ring() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    rung_ = true;
  }

 private:
  Clock* const clock_;
  absl::Mutex mu_;
  bool rung_ ABSL_GUARDED_BY(mu_) = false;
};

// The real thing.
class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  bool SleepUntil(absl::Time deadline) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    const uint64_t generation = generation_;
    auto woken = [this, generation] {
      mu_.AssertHeld();
      return generation_ != generation;
    };
    return mu_.AwaitWithDeadline(absl::Condition(&woken), deadline);
  }
  void Wake() override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++generation_;
  }
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& condition, absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return mu.AwaitWithDeadline(condition, deadline);
  }

 private:
  absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace minions
