#pragma once
// HeartbeatBatcher: group commit of executors' heartbeats. A heartbeat that arrives while no
// batch is committing commits at once (alone: no added wait); those that arrive while one commits
// wait for it and then commit together, as one transaction of the store (MetadataStore::
// Heartbeats), up to max_batch at a time. A fleet's heartbeats then cost about one transaction
// per store round trip instead of one each, however many executors there are.
//
// A waiting heartbeat holds no thread: Submit queues it with the callback that answers it, and the
// batcher's own committer thread writes the batches and calls each heartbeat's answer when its
// batch commits (the server's Heartbeat is a gRPC callback method: thousands of executors may wait
// for a batch at once, and a thread each would exhaust the server's). Heartbeat is the blocking
// form, for callers that have a thread to spare (in-process control planes, tests).
//
// Nothing is weakened: each heartbeat in a batch is applied exactly as it would be alone (a
// fenced attempt's lease is not renewed and comes back in its reply's cancel list; an unknown
// executor is told to register again), every caller gets its own reply as soon as its batch
// commits, and leases are renewed from the time the batch commits (`clock`'s now then, never
// earlier than the heartbeat arrived). A batch the store refuses as a whole (an error) is retried
// one heartbeat at a time, so one caller's failure is no other caller's.
// Threads: Submit, Heartbeat and the counters are thread-safe. Answers run on the committer
// thread, one after another: they must be quick and must not call back into the batcher (they
// finish a gRPC call, or wake a blocked caller). The destructor commits what is queued and answers
// it before it returns.

#include <cstdint>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
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
  // Called once with a heartbeat's reply (or why it failed), on the committer thread.
  using Answer = absl::AnyInvocable<void(absl::StatusOr<HeartbeatReply>) &&>;

  // `max_batch` <= 1: every heartbeat is its own transaction (no batching).
  HeartbeatBatcher(MetadataStore* store, Clock* clock, int max_batch)
      : HeartbeatBatcher(
            [store](const std::vector<HeartbeatCall>& calls, absl::Duration ttl, absl::Time now) {
              return store->Heartbeats(calls, ttl, now);
            },
            clock, max_batch) {}
  HeartbeatBatcher(CommitFn commit, Clock* clock, int max_batch);
  ~HeartbeatBatcher();
  HeartbeatBatcher(const HeartbeatBatcher&) = delete;
  HeartbeatBatcher& operator=(const HeartbeatBatcher&) = delete;

  // Queues `call`; `answer` gets its reply when its batch commits. Never blocks on the store.
  void Submit(HeartbeatCall call, absl::Duration ttl, Answer answer) ABSL_LOCKS_EXCLUDED(mu_);
  // Submit, then wait for the answer on this thread.
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
    Answer answer;
    absl::StatusOr<HeartbeatReply> reply = absl::UnknownError("not committed");
  };
  // The committer thread: takes what waits (up to max_batch), commits it, answers it; until the
  // destructor, and then until nothing waits.
  void CommitLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Commits `batch` (already taken from the queue), setting each heartbeat's reply.
  void Commit(std::vector<Pending>& batch);

  const CommitFn commit_;
  Clock* const clock_;
  const int max_batch_;
  mutable absl::Mutex mu_;
  std::vector<Pending> queue_ ABSL_GUARDED_BY(mu_);  // arrived, not yet taken into a batch
  bool exiting_ ABSL_GUARDED_BY(mu_) = false;
  int64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread committer_;  // last: starts once the rest is built
};

}  // namespace minions
