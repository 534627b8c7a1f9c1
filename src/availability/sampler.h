#pragma once
// Sampler: runs each probe on its own cadence into one running Snapshot, and merges in owner
// activity reported by hand (`minions executor activity`), which wakes the caller at once.
//
// Threads: Sample() from one thread (the controller's); ReportActivity() from any thread.

#include <memory>
#include <mutex>
#include <vector>

#include "availability/probe.h"

namespace minions::availability {

class Sampler {
 public:
  explicit Sampler(std::vector<std::unique_ptr<Probe>> probes);

  // Runs the probes that are due (all of them on the first call, or with `all`) and returns the
  // snapshot.
  Snapshot Sample(absl::Time now, bool all = false);
  // When the next probe is due.
  absl::Time NextDue() const { return next_due_; }
  void ReportActivity(absl::Time when);

 private:
  struct Entry {
    std::unique_ptr<Probe> probe;
    absl::Time due = absl::InfinitePast();
  };
  std::vector<Entry> probes_;
  Snapshot snapshot_;
  absl::Time next_due_ = absl::InfinitePast();
  std::mutex mu_;
  absl::Time activity_ = absl::InfinitePast();  // guarded by mu_
};

}  // namespace minions::availability
