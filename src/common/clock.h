#pragma once
// Clock: the one source of "now" and of waiting, so tests can drive time instead of sleeping.
// Nothing in the domain reads the wall clock directly.
// Threads: implementations are thread-safe.

#include <condition_variable>
#include <mutex>

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

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;  // guarded by mu_
};

}  // namespace minions
