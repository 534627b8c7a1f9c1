#pragma once
// HeartbeatBatcher: group commit of executors' heartbeats (server/group_commit.h): those that
// arrive while a batch commits are written together, as one transaction of the store
// (MetadataStore::Heartbeats), up to max_batch at a time. A fleet's heartbeats then cost about one
// transaction per store round trip instead of one each, however many executors there are.
//
// Nothing is weakened: each heartbeat in a batch is applied exactly as it would be alone (a
// fenced attempt's lease is not renewed and comes back in its reply's cancel list; an unknown
// executor is told to register again), every caller gets its own reply as soon as its batch
// commits, and leases are renewed from the time the batch commits (`clock`'s now then, never
// earlier than the heartbeat arrived). A batch the store refuses as a whole (an error) is retried
// one heartbeat at a time, so one caller's failure is no other caller's; heartbeats of another
// TTL than the rest of their batch (none today: one TTL per server) commit one at a time too.
// Threads: as GroupCommitter's: Submit, Heartbeat and the counters are thread-safe; answers run on
// the committer thread, must be quick and must not call back into the batcher. The destructor
// commits what is queued and answers it before it returns.

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "model/types.h"
#include "server/group_commit.h"
#include "store/metadata_store.h"

namespace minions {

class HeartbeatBatcher {
 public:
  // Writes a batch in one transaction (MetadataStore::Heartbeats' contract).
  using CommitFn = std::function<absl::StatusOr<std::vector<HeartbeatReply>>(const std::vector<HeartbeatCall>&,
                                                                              absl::Duration ttl, absl::Time now)>;
  // Called once with a heartbeat's reply (or why it failed), on the committer thread.
  using Answer = absl::AnyInvocable<void(absl::StatusOr<HeartbeatReply>) &&>;

  // `max_batch` <= 1: every heartbeat is its own transaction (no batching). `linger`: how long a
  // batch under steady load waits for more (GroupCommitter's; ServerOptions::heartbeat_linger).
  HeartbeatBatcher(MetadataStore* store, Clock* clock, int max_batch, absl::Duration linger = absl::ZeroDuration())
      : HeartbeatBatcher(
            [store](const std::vector<HeartbeatCall>& calls, absl::Duration ttl, absl::Time now) {
              return store->Heartbeats(calls, ttl, now);
            },
            clock, max_batch, linger) {}
  HeartbeatBatcher(CommitFn commit, Clock* clock, int max_batch, absl::Duration linger = absl::ZeroDuration());
  HeartbeatBatcher(const HeartbeatBatcher&) = delete;
  HeartbeatBatcher& operator=(const HeartbeatBatcher&) = delete;

  // Queues `call`; `answer` gets its reply when its batch commits. Never blocks on the store.
  void Submit(HeartbeatCall call, absl::Duration ttl, Answer answer) {
    group_.Submit(Timed{std::move(call), ttl}, std::move(answer));
  }
  // Queues a heartbeat nobody waits on at once (an idle executor's renewal by the server): it
  // fills the room the waiting heartbeats leave in a batch (GroupCommitter::SubmitDeferred).
  void SubmitDeferred(HeartbeatCall call, absl::Duration ttl, Answer answer) {
    group_.SubmitDeferred(Timed{std::move(call), ttl}, std::move(answer));
  }
  // Submit, then wait for the answer on this thread.
  absl::StatusOr<HeartbeatReply> Heartbeat(HeartbeatCall call, absl::Duration ttl) {
    return group_.Wait(Timed{std::move(call), ttl});
  }

  // Transactions committed and heartbeats written so far, and heartbeats waiting for the batch
  // that commits now to end (metrics, tests).
  int64_t batches() const { return group_.batches(); }
  int64_t heartbeats() const { return group_.committed(); }
  int64_t waiting() const { return group_.waiting(); }

 private:
  struct Timed {
    HeartbeatCall call;
    absl::Duration ttl;
  };
  GroupCommitter<Timed, HeartbeatReply> group_;
};

}  // namespace minions
