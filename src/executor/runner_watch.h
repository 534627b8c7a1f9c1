#pragma once
// RunnerWatch: tells a runner that works from one that hangs. A runner holding work must say
// something about it (a result, a batch's end) now and then; one silent for far longer than its
// records take is hung. "Far longer" is `factor` times the longest silence seen from this runner
// while it worked, and never less than `min_silence` (its first records may be slow) nor more
// than `max_silence`. Silence while the runner holds no work, or while it is stopped for the
// machine's owner, does not count. Pure: times come in as arguments.
// Threads: one at a time (the agent's main thread).

#include <algorithm>

#include "absl/time/time.h"

namespace minions {

class RunnerWatch {
 public:
  struct Options {
    absl::Duration min_silence = absl::Minutes(5);
    absl::Duration max_silence = absl::Hours(1);
    double factor = 10;
  };

  RunnerWatch() = default;
  explicit RunnerWatch(const Options& options) : options_(options) {}

  // Work went to the runner. From idle, the silence starts now.
  void Sent(absl::Time now) {
    if (!busy_) last_heard_ = now;
    busy_ = true;
  }
  // The runner said something about its work; `still_busy`: it holds more.
  void Heard(absl::Time now, bool still_busy) {
    if (busy_ && !paused_) longest_ = std::max(longest_, now - last_heard_);
    last_heard_ = now;
    busy_ = still_busy;
  }
  // It holds no work any more (its batches were cancelled or ended).
  void Idle() { busy_ = false; }
  // Stopped (SIGSTOP) for the owner, and continued: the time between is no silence.
  void Pause() { paused_ = true; }
  void Resume(absl::Time now) {
    if (paused_) last_heard_ = now;
    paused_ = false;
  }

  // How long a silence must last to be a hang, given what this runner has shown.
  absl::Duration limit() const {
    return std::clamp(longest_ * options_.factor, options_.min_silence, std::max(options_.min_silence, options_.max_silence));
  }
  // When the silence becomes a hang; InfiniteFuture while the runner holds no work or is paused.
  absl::Time HungAt() const {
    return busy_ && !paused_ ? last_heard_ + limit() : absl::InfiniteFuture();
  }
  bool Hung(absl::Time now) const { return now >= HungAt(); }
  // How long it has been silent (zero when it holds no work).
  absl::Duration Silence(absl::Time now) const { return busy_ ? now - last_heard_ : absl::ZeroDuration(); }

 private:
  Options options_;
  bool busy_ = false;
  bool paused_ = false;
  absl::Time last_heard_;
  absl::Duration longest_ = absl::ZeroDuration();
};

}  // namespace minions
