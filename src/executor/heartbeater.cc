#include "executor/heartbeater.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace minions {
namespace {

// What an idle beat says that the next may repeat: its state and what it holds of the models.
std::string WhatItSays(const AgentBeat& beat) {
  return absl::StrCat(beat.state, "\n", beat.model_loaded, "\n", absl::StrJoin(beat.models_cached, ","));
}

}  // namespace

Heartbeater::Heartbeater(Options options, AgentControlPlane* plane, BeatSource* source, Clock* clock)
    : options_(std::move(options)),
      plane_(plane),
      source_(source),
      clock_(clock),
      alarm_(std::make_unique<Alarm>(clock)) {}

void Heartbeater::Registered(const AgentRegistration& registration) {
  {
    absl::MutexLock lock(&mu_);
    ttl_ = std::max(registration.lease_ttl, absl::Milliseconds(300));
    // Never more often than a holder's beat; an older server says nothing: two thirds of a TTL.
    idle_beat_ = registration.idle_heartbeat > absl::ZeroDuration()
                     ? std::max(registration.idle_heartbeat, ttl_ / 3)
                     : ttl_ * 2 / 3;
    idle_polls_renew_ = registration.idle_polls_renew;
    beat_now_ = true;  // say at once what this executor is doing
  }
  alarm_->Ring();
}

void Heartbeater::BeatNow() {
  {
    absl::MutexLock lock(&mu_);
    beat_now_ = true;
  }
  alarm_->Ring();
}

void Heartbeater::Soon(absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    if (next_beat_at_ <= now + ttl_ / 3) return;
    next_beat_at_ = now + ttl_ / 3;
  }
  alarm_->Ring();
}

absl::Time Heartbeater::Due() const {
  absl::MutexLock lock(&mu_);
  return beat_now_ ? absl::InfinitePast() : next_beat_at_;
}

bool Heartbeater::idle_polls_renew() const {
  absl::MutexLock lock(&mu_);
  return idle_polls_renew_;
}

void Heartbeater::IdlePollStarted() {
  absl::MutexLock lock(&mu_);
  idle_poll_in_flight_ = true;
}

void Heartbeater::IdlePollEnded(bool answered, bool renewed) {
  {
    absl::MutexLock lock(&mu_);
    idle_poll_in_flight_ = false;
    if (answered) idle_poll_answered_at_ = clock_->Now();
    // A server that does not renew from idle polls (an older one behind the same address, or one
    // told not to) answered: that poll was no heartbeat. Beat now, and at the idle pace.
    if (!answered || renewed || !idle_polls_renew_) return;
    idle_polls_renew_ = false;
    beat_now_ = true;
  }
  MINIONS_LOG(Warning) << "the server does not keep idle executors alive from their polls; heartbeating at "
                          "the idle pace";
  alarm_->Ring();
}

void Heartbeater::Beat() {
  ThreadRoleScope role(&thread_);
  const absl::Time now = clock_->Now();
  const BeatSource::Holdings held = source_->Collect(now);
  bool forced;
  absl::Duration ttl;
  {
    absl::MutexLock lock(&mu_);
    forced = beat_now_;  // registered, or told to: said whatever it says
    beat_now_ = false;
    ttl = ttl_;
    next_beat_at_ = now + (held.leases.empty() && held.gang_duties.empty() ? idle_beat_ : ttl_ / 3);
  }
  AgentBeat beat = Build(held, now);
  if (!forced && SaysNothingNew(beat, held, now)) {
    // Its idle poll keeps it alive. Looked at again within a third of the TTL, not an idle beat:
    // when its polls stop (its owner came back, the server went away) the next beat is not late.
    absl::MutexLock lock(&mu_);
    next_beat_at_ = std::min(next_beat_at_, now + ttl_ / 3);
    return;
  }
  auto reply = plane_->Heartbeat(beat);
  if (!reply.ok()) {
    MINIONS_LOG(Warning) << "heartbeat failed: " << reply.status().message();
    if (!held.leases.empty() && now - last_renewed_ >= ttl && !detached_) {
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
  last_beat_said_ = WhatItSays(beat);
  source_->OnBeatAnswer(*reply);
}

bool Heartbeater::SaysNothingNew(const AgentBeat& beat, const BeatSource::Holdings& held, absl::Time now) {
  if (!beat.leases.empty() || !beat.gang_duties.empty() || beat.state != "available") return false;
  if (!held.leases.empty()) return false;
  {
    absl::MutexLock lock(&mu_);
    if (!idle_polls_renew_) return false;
    // Between two polls, the one just answered still speaks for it.
    if (!idle_poll_in_flight_ && now - idle_poll_answered_at_ >= idle_beat_ / 2) return false;
  }
  return last_beat_said_ == WhatItSays(beat);
}

AgentBeat Heartbeater::Build(const BeatSource::Holdings& held, absl::Time now) {
  AgentBeat beat;
  beat.executor_id = held.executor_id;
  beat.gang_duties = held.gang_duties;
  beat.model_loaded = held.model_loaded;
  // What it holds of the models, in every beat: placement prefers executors that have a model.
  if (options_.model_cache) beat.models_cached = options_.model_cache->Cached();
  if (last_renewed_ == absl::InfinitePast()) last_renewed_ = now;
  beat.state = source_->FleetState(!held.leases.empty() || !held.gang_duties.empty(), &beat.state_reason);
  if (options_.metrics) {  // metrics hook
    options_.metrics->SetState(ParseExecutorState(beat.state).value_or(ExecutorState::kAvailable), beat.state_reason);
  }
  if (held.stuck_since && now - *held.stuck_since >= options_.stuck_after) {
    // A task moves only while the main loop does: renewing the leases of a loop stuck in one
    // call would keep the watchdog from giving them to someone else for ever.
    if (!warned_stuck_) {
      MINIONS_LOG(Warning) << "the main loop has been stuck since " << absl::FormatTime(*held.stuck_since)
                           << "; renewing none of its " << held.leases.size() << " leases";
    }
    warned_stuck_ = true;
    return beat;
  }
  warned_stuck_ = false;
  for (const auto& snapshot : held.leases) beat.leases.push_back(*snapshot);
  return beat;
}

}  // namespace minions
