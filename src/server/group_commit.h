#pragma once
// GroupCommitter<Call, Reply>: group commit of many callers' writes. A call that arrives while no
// batch is committing commits at once (alone: no added wait); those that arrive while one commits
// wait for it and then commit together, as one transaction of the store, up to max_batch at a
// time. Many callers' writes then cost about one transaction per store round trip instead of one
// each. What the server batches this way: heartbeats (server/heartbeat_batcher.h) and completions
// (ExecutorService).
//
// A waiting call holds no thread: Submit queues it with the callback that answers it, and the
// committer's own thread commits the batches and calls each call's answer when its batch commits
// (the server's callers are gRPC callback methods: thousands may wait for a batch at once, and a
// thread each would exhaust the server's). Wait is the blocking form, for callers that have a
// thread to spare (in-process control planes, tests).
//
// Nothing is weakened: the commit function applies each call of a batch exactly as it would
// apply it alone and answers each on its own (a call's own refusal is its answer, not the
// batch's). A batch the commit function refuses as a whole (an error) is committed again one
// call at a time, so one caller's failure is no other caller's.
// Threads: Submit, Wait and the counters are thread-safe. The commit function and the answers run
// on the committer thread, one after another: answers must be quick and must not call back into
// this committer (they finish a gRPC call, or wake a blocked caller). The destructor commits what
// is queued and answers it before it returns.
//
// Deferred calls (SubmitDeferred) are writes nobody waits on at once (the server's renewals of
// idle executors, thousands due together): they fill the room the waiting calls leave in a batch,
// so that a storm of them does not queue ahead of the callers (a caller waits at most for the one
// batch being written when it came). While calls wait, a batch takes at most max(max_batch/4, the
// room kept below) deferred ones (a quick batch). A batch that took none is followed by one that
// keeps max_batch/8 (at least one) for them, and half the batch once the oldest has waited
// through kDeferredPatience batches: a steady flood of calls delays them, never starves them
// (counted in batches, not time, so that what lands in which batch follows from the calls
// alone). Within a batch the deferred calls come after the waiting ones.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/thread_name.h"

namespace minions {

template <typename Call, typename Reply>
class GroupCommitter {
 public:
  // Commits a batch in one transaction: one answer per call, in order; an error refuses the whole
  // batch (nothing of it committed).
  using CommitFn = std::function<absl::StatusOr<std::vector<absl::StatusOr<Reply>>>(const std::vector<Call>&)>;
  // Called once with a call's reply (or why it failed), on the committer thread.
  using Answer = absl::AnyInvocable<void(absl::StatusOr<Reply>) &&>;

  // `max_batch` <= 1: every call is its own transaction (no batching). `linger` > 0: under
  // steady load (the last batch ended less than `linger` ago), a batch smaller than max_batch waits
  // for more calls until its oldest call has waited `linger`; a call that finds the committer idle
  // for longer than that is written at once (deferred calls never wait for company).
  // `thread_name` names the committer thread (top -H, perf).
  GroupCommitter(CommitFn commit, int max_batch, absl::Duration linger = absl::ZeroDuration(),
                 std::string thread_name = "group-commit")
      : commit_(std::move(commit)),
        max_batch_(max_batch < 1 ? 1 : max_batch),
        linger_(linger),
        committer_([this, thread_name = std::move(thread_name)] {
          NameThisThread(thread_name);
          CommitLoop();
        }) {}
  ~GroupCommitter() {
    {
      absl::MutexLock lock(&mu_);
      exiting_ = true;
    }
    committer_.join();
  }
  GroupCommitter(const GroupCommitter&) = delete;
  GroupCommitter& operator=(const GroupCommitter&) = delete;

  // Queues `call`; `answer` gets its reply when its batch commits. Never blocks on the store.
  void Submit(Call call, Answer answer) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(Pending{std::move(call), std::move(answer), absl::InfiniteFuture()});
    if (linger_ > absl::ZeroDuration()) queue_.back().arrived = absl::Now();
  }
  // Queues `call` behind those of Submit (see the top of this file); answered as they are.
  void SubmitDeferred(Call call, Answer answer) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    deferred_.push_back(Pending{std::move(call), std::move(answer), absl::InfiniteFuture(), batches_});
  }
  // Submit, then wait for the answer on this thread.
  absl::StatusOr<Reply> Wait(Call call) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::StatusOr<Reply> reply = absl::UnknownError("not committed");
    absl::Notification answered;
    Submit(std::move(call), [&reply, &answered](absl::StatusOr<Reply> r) {
      reply = std::move(r);
      answered.Notify();
    });
    answered.WaitForNotification();
    return reply;
  }

  // Batches committed and calls answered so far, and calls (deferred ones too) not yet taken into
  // a batch (metrics, tests).
  int64_t batches() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  int64_t committed() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return committed_;
  }
  int64_t waiting() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(queue_.size() + deferred_.size());
  }

 private:
  struct Pending {
    Call call;
    Answer answer;
    absl::Time arrived;  // when Submit queued it (only read with a linger)
    int64_t batches_before = 0;  // batches committed when it was queued (read for deferred calls)
    absl::StatusOr<Reply> reply = absl::UnknownError("not committed");
  };

  // The committer thread: takes what waits (up to max_batch), commits it, answers it; until the
  // destructor, and then until nothing waits.
  void CommitLoop() ABSL_LOCKS_EXCLUDED(mu_) {
    while (true) {
      std::vector<Pending> batch;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return exiting_ || !queue_.empty() || !deferred_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty() && deferred_.empty()) return;  // exiting, and nothing waits
        if (!queue_.empty() && linger_ > absl::ZeroDuration() && absl::Now() - last_end_ < linger_) {
          auto full = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return exiting_ || queue_.size() >= static_cast<size_t>(max_batch_);
          };
          mu_.AwaitWithDeadline(absl::Condition(&full), queue_.front().arrived + linger_);
        }
        TakeBatchLocked(batch);
      }
      Commit(batch);
      {
        absl::MutexLock lock(&mu_);
        last_end_ = absl::Now();
        ++batches_;
        committed_ += static_cast<int64_t>(batch.size());
      }
      // Answered after the counters move: a caller that saw its answer sees its batch counted.
      for (Pending& p : batch) std::move(p.answer)(std::move(p.reply));
    }
  }

  // Moves the next batch out of the queues: the waiting calls first, then deferred ones in the
  // room left (see the top of this file).
  void TakeBatchLocked(std::vector<Pending>& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t max = static_cast<size_t>(max_batch_);
    size_t kept = 0;  // room kept for deferred calls in this batch
    if (!deferred_.empty()) {
      if (batches_ - deferred_.front().batches_before >= kDeferredPatience) {
        kept = std::max<size_t>(1, max / 2);
      } else if (!last_took_deferred_) {
        kept = std::max<size_t>(1, max / 8);
      }
      kept = std::min(kept, deferred_.size());
    }
    const size_t calls = std::min(queue_.size(), max - kept);
    size_t deferred = std::min(deferred_.size(), max - calls);
    if (calls > 0) deferred = std::min(deferred, std::max(kept, max / 4));
    batch.reserve(calls + deferred);
    batch.insert(batch.end(), std::make_move_iterator(queue_.begin()),
                 std::make_move_iterator(queue_.begin() + static_cast<std::ptrdiff_t>(calls)));
    queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(calls));
    batch.insert(batch.end(), std::make_move_iterator(deferred_.begin()),
                 std::make_move_iterator(deferred_.begin() + static_cast<std::ptrdiff_t>(deferred)));
    deferred_.erase(deferred_.begin(), deferred_.begin() + static_cast<std::ptrdiff_t>(deferred));
    last_took_deferred_ = deferred > 0;
  }

  // Commits `batch` (already taken from the queues), setting each call's reply.
  void Commit(std::vector<Pending>& batch) {
    std::vector<Call> calls;
    calls.reserve(batch.size());
    for (const Pending& p : batch) calls.push_back(p.call);
    absl::StatusOr<std::vector<absl::StatusOr<Reply>>> replies = commit_(calls);
    if (replies.ok() && replies->size() == batch.size()) {
      for (size_t i = 0; i < batch.size(); ++i) batch[i].reply = std::move((*replies)[i]);
      return;
    }
    if (batch.size() == 1) {
      batch.front().reply = replies.ok() ? absl::InternalError("the store answered no call") : replies.status();
      return;
    }
    // One at a time: one caller's error is its own.
    for (Pending& p : batch) {
      absl::StatusOr<std::vector<absl::StatusOr<Reply>>> reply = commit_({p.call});
      if (reply.ok() && reply->size() == 1) {
        p.reply = std::move(reply->front());
      } else {
        p.reply = reply.ok() ? absl::InternalError("the store answered no call") : reply.status();
      }
    }
  }

  // Batches a deferred call waits through before it gets half of each batch (the top of this file).
  static constexpr int64_t kDeferredPatience = 16;

  const CommitFn commit_;
  const int max_batch_;
  const absl::Duration linger_;
  mutable absl::Mutex mu_;
  absl::Time last_end_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // when the last batch committed
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);     // arrived (Submit), not yet taken into a batch
  std::deque<Pending> deferred_ ABSL_GUARDED_BY(mu_);  // arrived (SubmitDeferred), not yet taken
  bool last_took_deferred_ ABSL_GUARDED_BY(mu_) = false;  // the last batch had deferred calls
  bool exiting_ ABSL_GUARDED_BY(mu_) = false;
  int64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t committed_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread committer_;  // last: starts once the rest is built
};

}  // namespace minions
