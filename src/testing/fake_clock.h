#pragma once
// FakeClock: time moves only when a test says so. Sleepers wake when Advance() passes their
// deadline, so a test can run an hour of heartbeats in a microsecond.

#include <condition_variable>
#include <memory>
#include <mutex>

#include "common/clock.h"

namespace minions::testing {

class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}
  absl::Time Now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  bool SleepUntil(absl::Time deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    uint64_t generation = generation_;
    cv_.wait(lock, [&] { return now_ >= deadline || generation_ != generation; });
    return generation_ != generation && now_ < deadline;
  }
  void Wake() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++generation_;
    cv_.notify_all();
  }
  std::unique_ptr<Alarm> NewAlarm() override { return std::make_unique<FakeAlarm>(this); }
  void Advance(absl::Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += d;
    cv_.notify_all();
  }
  // Moves time to `t` (never backwards).
  void AdvanceTo(absl::Time t) {
    std::lock_guard<std::mutex> lock(mu_);
    if (t > now_) now_ = t;
    cv_.notify_all();
  }

 private:
  class FakeAlarm : public Alarm {
   public:
    explicit FakeAlarm(FakeClock* clock) : clock_(clock) {}
    bool SleepUntil(absl::Time deadline) override {
      std::unique_lock<std::mutex> lock(clock_->mu_);
      clock_->cv_.wait(lock, [&] { return rung_ || clock_->now_ >= deadline; });
      bool rung = rung_;
      rung_ = false;
      return rung;
    }
    void Ring() override {
      std::lock_guard<std::mutex> lock(clock_->mu_);
      rung_ = true;
      clock_->cv_.notify_all();
    }

   private:
    FakeClock* clock_;
    bool rung_ = false;  // guarded by clock_->mu_
  };

  mutable std::mutex mu_;
  std::condition_variable cv_;
  absl::Time now_;           // guarded by mu_
  uint64_t generation_ = 0;  // guarded by mu_
};

}  // namespace minions::testing
