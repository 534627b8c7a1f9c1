// ExecutorAgent, the heartbeat's source: what the heartbeat (executor/heartbeater.h, its own part)
// reads of the agent — the snapshots the main loop publishes — and what the agent does with the
// server's answer: register again, drain, cancel (for the main loop to take).

#include "common/logging.h"
#include "executor/agent.h"

namespace minions {

absl::Time ExecutorAgent::NextBeat() const {
  {
    absl::MutexLock lock(&mu_);
    if (id_.empty() || finished_) return absl::InfiniteFuture();
  }
  return heartbeater_.Due();
}

void ExecutorAgent::Beat() { heartbeater_.Beat(); }

BeatSource::Holdings ExecutorAgent::Collect(absl::Time now) {
  Holdings held;
  absl::MutexLock lock(&mu_);
  held.executor_id = id_;
  for (const auto& [key, snapshot] : snapshots_) held.leases.push_back(snapshot);
  held.gang_duties = duty_refs_;
  held.model_loaded = runner_.model_loaded();
  held.stuck_since = pass_since_;
  return held;
}

void ExecutorAgent::OnBeatAnswer(const AgentBeatAnswer& reply) {
  if (reply.reregister) return OnServerNotice(/*reregister=*/true, false);
  {
    absl::MutexLock lock(&mu_);
    cancelled_.insert(cancelled_.end(), reply.cancel.begin(), reply.cancel.end());
  }
  OnServerNotice(false, reply.drain);
  if (!reply.cancel.empty()) main_alarm_->Ring();
}

void ExecutorAgent::OnServerNotice(bool reregister, bool drain) {
  if (reregister) {
    (void)Register();
    return;
  }
  bool draining;
  {
    absl::MutexLock lock(&mu_);
    draining = drain_;
  }
  if (drain && !draining) {
    MINIONS_LOG(Info) << "the server asked this executor to drain";
    Drain();
  }
}

}  // namespace minions
