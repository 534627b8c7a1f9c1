#pragma once
// LeaseWindow: how much work the executor's agent asks for, and when. It holds up to a window of
// tasks sized to cover `prefetch_target` of work beyond the running one (from a moving average of
// how long tasks take, at least two, at most `max_prefetch`), tops the window up when half of it
// is free, long-polls when it holds nothing, asks at most every 50 ms while the queue is dry, and
// backs off `idle_poll` after a failed call or a long poll answered early. A call that failed
// without a refusal may have been granted and never answered: the next ask reclaims (LeaseRequest
// .reclaim).
// It decides only; the agent makes the call (AgentControlPlane::Lease) and tells it the outcome.
// Ownership: its own state, nothing else.
// Threads: the agent's main loop only (one thread at a time).

#include <algorithm>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "executor/agent_control_plane.h"

namespace minions {

class LeaseWindow {
 public:
  struct Options {
    int max_prefetch = 32;
    absl::Duration prefetch_target = absl::Milliseconds(500);
    absl::Duration lease_wait = absl::Seconds(30);
    absl::Duration idle_poll = absl::Milliseconds(200);
  };
  explicit LeaseWindow(Options options);

  // Tasks it aims to hold now.
  int Size() const;
  // A task took `took` from its start to its end (the moving average behind Size()).
  void TaskTook(absl::Duration took);

  // Whether to ask now, holding `held` tasks.
  bool Due(int held, absl::Time now) const;
  // When it would next ask, holding `held` tasks (InfiniteFuture: not until one ends).
  absl::Time NextAsk(int held) const;
  // The ask for `held` tasks held: how many, whether to long-poll, whether to reclaim (the agent
  // adds the executor id, `idle` and the refs it holds).
  AgentLeaseAsk Ask(int held) const;

  // The call asked at `asked_at` failed (`now`: when it returned).
  void Failed(const absl::Status& why, absl::Time asked_at, absl::Time now);
  // The call asked at `asked_at` was answered with `granted` tasks.
  void Answered(const AgentLeaseAsk& ask, size_t granted, absl::Time asked_at, absl::Time now);

  // The last call may have been granted unheard: the next one reclaims.
  bool unheard() const { return unheard_; }

 private:
  // While the queue is dry, a busy executor asks at most this often.
  static constexpr absl::Duration kDryQueueAsk = absl::Milliseconds(50);

  const Options options_;
  double avg_task_seconds_ = 1.0;
  absl::Time last_empty_ = absl::InfinitePast();
  absl::Time next_try_ = absl::InfinitePast();
  bool unheard_ = false;
};

}  // namespace minions
