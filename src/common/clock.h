#pragma once
// Clock: the one source of "now" and of waiting, so tests can drive time instead of sleeping.
// Nothing in the domain reads the wall clock directly.
// Threads: implementations are thread-safe.

#include <condition_variable>
#include <memory>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace minions {

class Clock {
 public:
  // One sleeper's own wake-up call: a loop that sleeps until its next deadline or until another
  // thread has something for it (an event arrived, a command, shutdown). Ringing it wakes that
  // loop alone, where Clock::Wake() wakes every sleeper of the clock.
  // Threads: SleepUntil from the owning loop's thread only; Ring from any thread.
  class Alarm {
   public:
    virtual ~Alarm() = default;
    // Sleeps until `deadline` (of this clock) or until rung. True if rung; the ring is used up.
    // A ring that came while the owner was awake ends its next sleep at once.
    virtual bool SleepUntil(absl::Time deadline) = 0;
    virtual void Ring() = 0;
  };

  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Sleeps until `deadline` or until Wake() is called, whichever is first. Returns true if woken.
  virtual bool SleepUntil(absl::Time deadline) = 0;
  // Wakes every sleeper (shutdown, or new work to look at). Alarms are not rung.
  virtual void Wake() = 0;
  // A new alarm on this clock (it must not outlive the clock).
  virtual std::unique_ptr<Alarm> NewAlarm() = 0;
  bool SleepFor(absl::Duration d) { return SleepUntil(Now() + d); }
};

// The real thing.
class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  bool SleepUntil(absl::Time deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    uint64_t generation = generation_;
    while (generation_ == generation) {
      absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return false;
      cv_.wait_for(lock, absl::ToChronoMicroseconds(left));
    }
    return true;
  }
  void Wake() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++generation_;
    cv_.notify_all();
  }
  std::unique_ptr<Alarm> NewAlarm() override { return std::make_unique<RealAlarm>(); }

 private:
  class RealAlarm : public Alarm {
   public:
    bool SleepUntil(absl::Time deadline) override {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(&rung_), deadline);
      bool rung = rung_;
      rung_ = false;
      return rung;
    }
    void Ring() override {
      absl::MutexLock lock(&mu_);
      rung_ = true;
    }

   private:
    absl::Mutex mu_;
    bool rung_ ABSL_GUARDED_BY(mu_) = false;
  };

  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;  // guarded by mu_
};

}  // namespace minions
