#include "server/heartbeat_batcher.h"

#include <algorithm>
#include <utility>

namespace minions {

absl::StatusOr<HeartbeatReply> HeartbeatBatcher::Heartbeat(HeartbeatCall call, absl::Duration ttl) {
  Pending mine{std::move(call), ttl, absl::UnknownError("not committed"), false};
  mu_.Lock();
  queue_.push_back(&mine);
  while (!mine.done) {
    if (committing_) {
      // A batch is committing: this heartbeat joins the next one (or is answered by this one).
      auto ready = [this, &mine]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return mine.done || !committing_; };
      mu_.Await(absl::Condition(&ready));
      continue;
    }
    // Nobody commits: this caller commits what is waiting (its own heartbeat first in line or not).
    committing_ = true;
    const size_t n = std::min(queue_.size(), static_cast<size_t>(max_batch_));
    std::vector<Pending*> batch(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
    queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
    mu_.Unlock();
    Commit(batch);
    mu_.Lock();
    committing_ = false;
    ++batches_;
    heartbeats_ += static_cast<int64_t>(batch.size());
    for (Pending* p : batch) p->done = true;
  }
  mu_.Unlock();
  return std::move(mine.reply);
}

void HeartbeatBatcher::Commit(const std::vector<Pending*>& batch) {
  // One TTL per server; heartbeats of another TTL (none today) commit on their own.
  std::vector<HeartbeatCall> calls;
  std::vector<Pending*> same_ttl, alone;
  for (Pending* p : batch) (p->ttl == batch.front()->ttl ? same_ttl : alone).push_back(p);
  for (Pending* p : same_ttl) calls.push_back(p->call);
  absl::StatusOr<std::vector<HeartbeatReply>> replies = commit_(calls, batch.front()->ttl, clock_->Now());
  if (replies.ok() && replies->size() == same_ttl.size()) {
    for (size_t i = 0; i < same_ttl.size(); ++i) same_ttl[i]->reply = std::move((*replies)[i]);
  } else if (same_ttl.size() == 1) {
    same_ttl.front()->reply = replies.ok() ? absl::InternalError("the store answered no heartbeat") : replies.status();
  } else {
    alone.insert(alone.end(), same_ttl.begin(), same_ttl.end());
  }
  // One at a time: one caller's error (or another TTL) is its own.
  for (Pending* p : alone) {
    auto reply = commit_({p->call}, p->ttl, clock_->Now());
    if (reply.ok() && reply->size() == 1) {
      p->reply = std::move(reply->front());
    } else {
      p->reply = reply.ok() ? absl::InternalError("the store answered no heartbeat") : reply.status();
    }
  }
}

int64_t HeartbeatBatcher::batches() const {
  absl::MutexLock lock(&mu_);
  return batches_;
}

int64_t HeartbeatBatcher::heartbeats() const {
  absl::MutexLock lock(&mu_);
  return heartbeats_;
}

}  // namespace minions

namespace minions {

int64_t HeartbeatBatcher::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

}  // namespace minions
