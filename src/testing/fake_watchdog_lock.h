#pragma once
// FakeWatchdogLock: a WatchdogLock a test can take away (as a database restart would end the
// real one's session) while the watchdog owns it.
// Threads: thread-safe.

#include <atomic>
#include <memory>

#include "store/watchdog_lock.h"

namespace minions::testing {

class FakeWatchdogLock : public WatchdogLock {
 public:
  // The test keeps `held` and sets it to false to take the lock away.
  explicit FakeWatchdogLock(std::shared_ptr<std::atomic<bool>> held = std::make_shared<std::atomic<bool>>(true))
      : held_(std::move(held)) {}
  absl::Status Check() override {
    if (!*held_) return absl::UnavailableError("the fake watchdog lock was taken away");
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<std::atomic<bool>> held_;
};

}  // namespace minions::testing
