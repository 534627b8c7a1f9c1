#pragma once
// Presence: which executors hold an Attach stream (proto: Attach) open on this server, and what
// follows when one goes without a word. When an executor's last stream here closes while the
// server is not stopping, each task it still runs gets a backup attempt at once (the store's
// straggler backups): the task runs elsewhere while the executor's own attempt keeps its lease and
// may still finish first (a reconnect costs no lease). An executor back before its turn came (a
// reconnect) is left alone.
// Owns: the open streams per executor, the executors whose last stream closed, and the thread
// ("presence", started at the first Attach) that backs up their tasks (store work, never on
// gRPC's threads).
// Threads: thread-safe.

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "store/metadata_store.h"

namespace minions {

class Presence {
 public:
  // `lost` hears of an executor whose tasks were backed up (gang leasing counts it out until heard
  // from, server/gang_leasing.h); `work_arrived` that backups were requested (work for the idle).
  struct Hooks {
    std::function<void(const std::string& executor_id, absl::Time now)> lost;
    std::function<void()> work_arrived;
  };
  Presence(MetadataStore* store, Clock* clock, Hooks hooks) : store_(store), clock_(clock), hooks_(std::move(hooks)) {}
  ~Presence() ABSL_LOCKS_EXCLUDED(mu_);
  Presence(const Presence&) = delete;
  Presence& operator=(const Presence&) = delete;

  // A stream of `executor_id` opened; one closed.
  void Attached(const std::string& executor_id) ABSL_LOCKS_EXCLUDED(mu_);
  void Detached(const std::string& executor_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The server is stopping: the streams its shutdown ends are not executors going.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Streams open here now; executors whose tasks got backups because their stream closed.
  int64_t attached() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t detached_abruptly() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Backup attempts for every task `executor_id` runs, unless it is attached again.
  void BackUpTasksOf(const std::string& executor_id) ABSL_LOCKS_EXCLUDED(mu_);

  MetadataStore* const store_;
  Clock* const clock_;
  const Hooks hooks_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> attached_ ABSL_GUARDED_BY(mu_);  // open streams per executor
  std::deque<std::string> detached_ ABSL_GUARDED_BY(mu_);  // whose last stream closed, to back up
  int64_t detached_abruptly_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool exiting_ ABSL_GUARDED_BY(mu_) = false;  // the destructor: the thread ends
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace minions
