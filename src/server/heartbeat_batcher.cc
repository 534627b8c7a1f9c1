#include "server/heartbeat_batcher.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/synchronization/notification.h"

namespace minions {

HeartbeatBatcher::HeartbeatBatcher(CommitFn commit, Clock* clock, int max_batch)
    : commit_(std::move(commit)),
      clock_(clock),
      max_batch_(max_batch < 1 ? 1 : max_batch),
      committer_([this] { CommitLoop(); }) {}

HeartbeatBatcher::~HeartbeatBatcher() {
  {
    absl::MutexLock lock(&mu_);
    exiting_ = true;
  }
  committer_.join();
}

void HeartbeatBatcher::Submit(HeartbeatCall call, absl::Duration ttl, Answer answer) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Pending{std::move(call), ttl, std::move(answer)});
}

absl::StatusOr<HeartbeatReply> HeartbeatBatcher::Heartbeat(HeartbeatCall call, absl::Duration ttl) {
  absl::StatusOr<HeartbeatReply> reply;
  absl::Notification answered;
  Submit(std::move(call), ttl, [&reply, &answered](absl::StatusOr<HeartbeatReply> r) {
    reply = std::move(r);
    answered.Notify();
  });
  answered.WaitForNotification();
  return reply;
}

void HeartbeatBatcher::CommitLoop() {
  while (true) {
    std::vector<Pending> batch;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return exiting_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // exiting, and nothing waits
      const size_t n = std::min(queue_.size(), static_cast<size_t>(max_batch_));
      batch.assign(std::make_move_iterator(queue_.begin()),
                   std::make_move_iterator(queue_.begin() + static_cast<std::ptrdiff_t>(n)));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
    }
    Commit(batch);
    {
      absl::MutexLock lock(&mu_);
      ++batches_;
      heartbeats_ += static_cast<int64_t>(batch.size());
    }
    // Answered after the counters move: a caller that saw its answer sees its batch counted.
    for (Pending& p : batch) std::move(p.answer)(std::move(p.reply));
  }
}

void HeartbeatBatcher::Commit(std::vector<Pending>& batch) {
  // One TTL per server; heartbeats of another TTL (none today) commit on their own.
  std::vector<HeartbeatCall> calls;
  std::vector<Pending*> same_ttl, alone;
  for (Pending& p : batch) (p.ttl == batch.front().ttl ? same_ttl : alone).push_back(&p);
  for (Pending* p : same_ttl) calls.push_back(p->call);
  absl::StatusOr<std::vector<HeartbeatReply>> replies = commit_(calls, batch.front().ttl, clock_->Now());
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

int64_t HeartbeatBatcher::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

}  // namespace minions
