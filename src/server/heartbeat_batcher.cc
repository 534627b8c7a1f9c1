#include "server/heartbeat_batcher.h"

#include <utility>

namespace minions {

HeartbeatBatcher::HeartbeatBatcher(CommitFn commit, Clock* clock, int max_batch, absl::Duration linger)
    : group_(
          [commit = std::move(commit), clock](const std::vector<Timed>& batch)
              -> absl::StatusOr<std::vector<absl::StatusOr<HeartbeatReply>>> {
            std::vector<HeartbeatCall> calls;
            for (const Timed& t : batch) {
              // One TTL per transaction: a batch of several is written one heartbeat at a time.
              if (t.ttl != batch.front().ttl) return absl::FailedPreconditionError("heartbeats of several TTLs");
              calls.push_back(t.call);
            }
            absl::StatusOr<std::vector<HeartbeatReply>> replies = commit(calls, batch.front().ttl, clock->Now());
            if (!replies.ok()) return replies.status();
            if (replies->size() != calls.size()) return absl::InternalError("the store answered no heartbeat");
            std::vector<absl::StatusOr<HeartbeatReply>> answers;
            for (HeartbeatReply& reply : *replies) answers.push_back(std::move(reply));
            return answers;
          },
          max_batch, linger, "hb-commit") {}

}  // namespace minions
