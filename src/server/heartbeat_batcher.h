#pragma once
// HeartbeatBatcher: group commit of executors' heartbeats. A heartbeat that arrives while no
// batch is committing commits at once (alone: no added wait); those that arrive while one commits
// wait for it and then commit together, as one transaction of the store (MetadataStore::
// Heartbeats), up to max_batch at a time. A fleet's heartbeats then cost about one transaction
// per store round trip instead of one each, however many executors there are.
//
// Nothing is weakened: each heartbeat in a batch is applied exactly as it would be alone (a
// fenced attempt's lease is not renewed and comes back in its reply's cancel list; an unknown
// executor is told to register again), every caller gets its own reply as soon as its batch
// commits, and leases are renewed from the time the batch commits (`clock`'s now then, never
// earlier than the heartbeat arrived). A batch the store refuses as a whole (an error) is retried
// one heartbeat at a time, so one caller's failure is no other caller's.
// Threads: Heartbeat is thread-safe and blocks its caller until its batch commits; whichever
// caller finds no batch committing commits the waiting ones on its own thread.

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "model/types.h"
#include "store/metadata_store.h"

namespace minions {

class HeartbeatBatcher {
 public:
  // Writes a batch in one transaction (MetadataStore::Heartbeats' contract).
  using CommitFn = std::function<absl::StatusOr<std::vector<HeartbeatReply>>(const std::vector<HeartbeatCall>&,
                                                                              absl::Duration ttl, absl::Time now)>;
  // `max_batch` <= 1: every heartbeat is its own transaction (no batching).
  HeartbeatBatcher(MetadataStore* store, Clock* clock, int max_batch)
      : HeartbeatBatcher(
            [store](const std::vector<HeartbeatCall>& calls, absl::Duration ttl, absl::Time now) {
              return store->Heartbeats(calls, ttl, now);
            },
            clock, max_batch) {}
  HeartbeatBatcher(CommitFn commit, Clock* clock, int max_batch)
      : commit_(std::move(commit)), clock_(clock), max_batch_(max_batch < 1 ? 1 : max_batch) {}

  absl::StatusOr<HeartbeatReply> Heartbeat(HeartbeatCall call, absl::Duration ttl) ABSL_LOCKS_EXCLUDED(mu_);

  // Transactions committed and heartbeats written so far, and heartbeats waiting for the batch
  // that commits now to end (metrics, tests).
  int64_t batches() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t heartbeats() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t waiting() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Pending {
    HeartbeatCall call;
    absl::Duration ttl;
    absl::StatusOr<HeartbeatReply> reply;
    bool done = false;
  };
  // Commits `batch` (already taken from the queue) and answers each of its heartbeats.
  void Commit(const std::vector<Pending*>& batch) ABSL_LOCKS_EXCLUDED(mu_);

  const CommitFn commit_;
  Clock* const clock_;
  const int max_batch_;
  mutable absl::Mutex mu_;
  std::vector<Pending*> queue_ ABSL_GUARDED_BY(mu_);  // arrived, not yet taken into a batch
  bool committing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace minions
