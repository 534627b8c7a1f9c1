// ExecutorAgent, the heartbeat: every third of the lease TTL while it holds leases or gang duties
// (or at once when a chunk waits to be committed) it reports the progress of the leases whose
// tasks move, and acts on the answer: register again, drain, cancel. An executor that holds
// nothing renews nothing, and beats as often as the server said at registration (idle_beat_; by
// default 1.5 TTL, half the watchdog's wait: model/liveness.h), so a large idle fleet sends a
// fraction of the heartbeats. A lease or gang duty given to an idle executor brings its next beat
// forward to a third of the TTL (BeatWithinAThirdLocked). A server that renews idle executors
// from their long polls (RegisterResponse.idle_polls_renew) is not sent the idle beats that would
// say nothing new while such a poll stands: an idle fleet then makes one call per executor per
// long poll. It runs on its own thread and reads only the snapshots the main loop publishes.

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "executor/agent.h"
#include "absl/strings/str_join.h"

namespace minions {
namespace {

// What an idle beat says that the next may repeat: its state and what it holds of the models.
std::string WhatItSays(const AgentBeat& beat) {
  return absl::StrCat(beat.state, "\n", beat.model_loaded, "\n", absl::StrJoin(beat.models_cached, ","));
}

}  // namespace

bool ExecutorAgent::BeatWithinAThirdLocked(absl::Time now) {
  if (next_beat_at_ <= now + ttl_ / 3) return false;
  next_beat_at_ = now + ttl_ / 3;
  return true;
}

absl::Time ExecutorAgent::NextBeat() const {
  absl::MutexLock lock(&mu_);
  if (id_.empty() || finished_) return absl::InfiniteFuture();
  return beat_now_ ? absl::InfinitePast() : next_beat_at_;
}

void ExecutorAgent::Beat() {
  ThreadRoleScope role(&heartbeat_);
  const absl::Time now = clock_->Now();
  absl::Duration ttl;
  bool holds_leases;
  bool forced;
  {
    absl::MutexLock lock(&mu_);
    forced = beat_now_;  // registered, or told to: said whatever it says
  }
  AgentBeat request = BuildHeartbeat(now, &ttl, &holds_leases);
  if (!forced && IdleBeatSaysNothingNew(request, now)) {
    // Its idle poll keeps it alive. Looked at again within a third of the TTL, not an idle beat:
    // when its polls stop (its owner came back, the server went away) the next beat is not late.
    absl::MutexLock lock(&mu_);
    next_beat_at_ = std::min(next_beat_at_, now + ttl_ / 3);
    return;
  }
  auto reply = client_->Heartbeat(request);
  if (!reply.ok()) {
    MINIONS_LOG(Warning) << "heartbeat failed: " << reply.status().message();
    if (holds_leases && now - last_renewed_ >= ttl && !detached_) {
      // The server is away (restarting, or out of reach). Keep running: when it answers again,
      // the heartbeat re-attaches the leases that are still ours and cancels the others, and
      // every report stays fenced by its attempt, so nothing runs twice into the results.
      detached_ = true;
      MINIONS_LOG(Warning) << "no lease renewed for a whole TTL; carrying on until the server answers";
    }
    return;
  }
  if (detached_) {
    detached_ = false;
    MINIONS_LOG(Info) << "the server answers again; re-attached " << reply->renewed << " leases, "
                      << reply->cancel.size() << " were given to others";
  }
  last_renewed_ = now;
  last_beat_said_ = WhatItSays(request);
  OnHeartbeatReply(*reply);
}

bool ExecutorAgent::IdleBeatSaysNothingNew(const AgentBeat& request, absl::Time now) {
  if (!request.leases.empty() || !request.gang_duties.empty() || request.state != "available") return false;
  {
    absl::MutexLock lock(&mu_);
    if (!idle_polls_renew_ || !snapshots_.empty()) return false;
    // Between two polls, the one just answered still speaks for it.
    if (!idle_poll_in_flight_ && now - idle_poll_answered_at_ >= idle_beat_ / 2) return false;
  }
  return last_beat_said_ == WhatItSays(request);
}

AgentBeat ExecutorAgent::BuildHeartbeat(absl::Time now, absl::Duration* ttl, bool* holds_leases) {
  AgentBeat request;
  std::vector<std::shared_ptr<const LeaseProgress>> held;
  std::optional<absl::Time> stuck_since;
  {
    absl::MutexLock lock(&mu_);
    beat_now_ = false;
    *ttl = ttl_;
    next_beat_at_ = now + (snapshots_.empty() && duty_refs_.empty() ? idle_beat_ : ttl_ / 3);
    request.executor_id = id_;
    for (const auto& [key, snapshot] : snapshots_) held.push_back(snapshot);
    request.gang_duties = duty_refs_;
    request.model_loaded = model_loaded_;
    if (pass_since_ && now - *pass_since_ >= options_.stuck_after) stuck_since = pass_since_;
  }
  // What it holds of the models, in every beat: placement prefers executors that have a model.
  if (options_.model_cache) {
    request.models_cached = options_.model_cache->Cached();
  }
  if (last_renewed_ == absl::InfinitePast()) last_renewed_ = now;
  *holds_leases = !held.empty();
  std::string reason;
  request.state = FleetState(!held.empty() || !request.gang_duties.empty(), &reason);
  request.state_reason = reason;
  if (options_.metrics) {  // metrics hook
    options_.metrics->SetState(ParseExecutorState(request.state).value_or(ExecutorState::kAvailable),
                               request.state_reason);
  }
  if (stuck_since) {
    // A task moves only while the main loop does: renewing the leases of a loop stuck in one
    // call would keep the watchdog from giving them to someone else for ever.
    if (!warned_stuck_) {
      MINIONS_LOG(Warning) << "the main loop has been stuck since " << absl::FormatTime(*stuck_since)
                           << "; renewing none of its " << held.size() << " leases";
    }
    warned_stuck_ = true;
    return request;
  }
  warned_stuck_ = false;
  for (const auto& snapshot : held) request.leases.push_back(*snapshot);
  return request;
}

void ExecutorAgent::OnHeartbeatReply(const AgentBeatAnswer& reply) {
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
