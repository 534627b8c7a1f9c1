#pragma once
// Heartbeater: the executor agent's heartbeat. Every third of the lease TTL while it holds leases
// or gang duties (or at once when a chunk waits to be committed) it reports the progress of the
// leases it holds, and hands the answer to the agent (register again, drain, cancel). An executor
// that holds nothing renews nothing, and beats as often as the server said at registration (the
// idle beat; by default 1.5 TTL, half the watchdog's wait: model/liveness.h), so a large idle fleet
// sends a fraction of the heartbeats. A lease or gang duty given to an idle executor brings its
// next beat forward to a third of the TTL (Soon). A server that renews idle executors from their
// long polls (AgentRegistration::idle_polls_renew) is not sent the idle beats that would say
// nothing new while such a poll stands: an idle fleet then makes one call per executor per poll.
// A main loop stuck inside one pass for `stuck_after` renews no lease, so the watchdog can step
// in. When no beat gets through for a whole TTL it carries on (the server may be restarting); the
// first beat that gets through re-attaches what is still its own.
//
// Ownership: its schedule (under its own lock), the heartbeat thread's state, its alarm. It reads
// what the agent holds only through BeatSource (the agent's published snapshots).
// Threads: Beat() on the heartbeat thread (or the test's); every other method from any thread.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/thread_role.h"
#include "executor/agent_control_plane.h"
#include "executor/executor_metrics.h"
#include "executor/model_cache.h"

namespace minions {

// The agent's side of a beat.
class BeatSource {
 public:
  // What it holds now, as the main loop last published it.
  struct Holdings {
    std::string executor_id;
    std::vector<std::shared_ptr<const LeaseProgress>> leases;
    std::vector<AttemptRef> gang_duties;
    std::string model_loaded;
    std::optional<absl::Time> stuck_since;  // the main loop has been inside one pass since then
  };
  virtual ~BeatSource() = default;
  virtual Holdings Collect(absl::Time now) = 0;
  // The fleet state to report (available busy owner_active draining) and why.
  virtual std::string FleetState(bool holds_work, std::string* reason) const = 0;
  // The server answered a beat.
  virtual void OnBeatAnswer(const AgentBeatAnswer& answer) = 0;
};

class Heartbeater {
 public:
  struct Options {
    absl::Duration stuck_after = absl::Minutes(2);
    ExecutorMetrics* metrics = nullptr;      // not owned; null: none
    std::shared_ptr<ModelCache> model_cache;  // what it reports it holds; null: none
  };
  // `plane` and `source` outlive it.
  Heartbeater(Options options, AgentControlPlane* plane, BeatSource* source, Clock* clock);

  // One beat now (the heartbeat thread).
  void Beat();
  // When the next beat is due (InfinitePast: at once).
  absl::Time Due() const;
  // The heartbeat thread's wait until `due`, or a ring.
  void SleepUntil(absl::Time due) { alarm_->SleepUntil(due); }
  void Ring() { alarm_->Ring(); }

  // The server's terms at registration; the first beat goes at once.
  void Registered(const AgentRegistration& registration);
  // Beat at once (a chunk waits to be committed).
  void BeatNow();
  // Beat within a third of the TTL from `now` if the next beat is later (a lease or gang duty just
  // came to an executor beating at the idle pace).
  void Soon(absl::Time now);

  // Idle polls: whether an idle Lease may stand for the idle beat, and what came of one.
  bool idle_polls_renew() const;
  void IdlePollStarted();
  // The idle poll returned (`answered`: with an answer, which said `renewed`). A server that does
  // not renew from idle polls is beaten to at the idle pace from then on.
  void IdlePollEnded(bool answered, bool renewed);

 private:
  // What the beat says; `holds` whether it holds leases (for the detachment warning).
  AgentBeat Build(const BeatSource::Holdings& held, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(thread_);
  // Whether `beat`, due now and not forced, is an idle beat that may stay unsent.
  bool SaysNothingNew(const AgentBeat& beat, const BeatSource::Holdings& held, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(thread_);

  const Options options_;
  AgentControlPlane* const plane_;
  BeatSource* const source_;
  Clock* const clock_;
  const std::unique_ptr<Alarm> alarm_;

  mutable absl::Mutex mu_;
  absl::Duration ttl_ ABSL_GUARDED_BY(mu_) = absl::Seconds(9);
  absl::Duration idle_beat_ ABSL_GUARDED_BY(mu_) = absl::Seconds(6);  // as told at registration
  absl::Time next_beat_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool beat_now_ ABSL_GUARDED_BY(mu_) = false;
  bool idle_polls_renew_ ABSL_GUARDED_BY(mu_) = false;
  bool idle_poll_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time idle_poll_answered_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  // The heartbeat thread's own.
  ThreadRole thread_{"executor heartbeat"};
  bool detached_ ABSL_GUARDED_BY(thread_) = false;        // the server has been away a TTL
  bool warned_stuck_ ABSL_GUARDED_BY(thread_) = false;    // said once per stuck spell
  absl::Time last_renewed_ ABSL_GUARDED_BY(thread_) = absl::InfinitePast();
  std::string last_beat_said_ ABSL_GUARDED_BY(thread_);   // state and holdings of the last beat sent
};

}  // namespace minions
