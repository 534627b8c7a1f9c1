#pragma once
// SleepGuard: keeps the machine from idle system sleep while an executor runs on AC power
// (macOS: a PreventUserIdleSystemSleep assertion). Never a display assertion, never on battery,
// never resets the owner's idle timer. A no-op elsewhere.
//
// Threads: Set() from one thread (the availability controller's).

#include <memory>

namespace minions::availability {

class SleepGuard {
 public:
  SleepGuard();
  ~SleepGuard();
  // Holds the assertion exactly while `running && on_ac`.
  void Set(bool running, bool on_ac);
  bool held() const { return held_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool held_ = false;
};

}  // namespace minions::availability
