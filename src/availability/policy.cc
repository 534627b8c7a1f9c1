#include "availability/policy.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/enum_names.h"

namespace minions::availability {
namespace {

// "3s", "10m", "1h5m"; "0s" rather than absl's bare "0".
std::string Ago(absl::Duration d) {
  d = absl::Trunc(d, absl::Seconds(1));
  return d == absl::ZeroDuration() ? "0s" : absl::FormatDuration(d);
}

std::string Percent(double share) { return absl::StrFormat("%.0f %%", share * 100); }

// Why other processes' `share` of the CPU or GPU (`what`) stops work, "" if it does not: at the
// start, a share over `start_max`; while running, a share over `pause_share` since `high_since`
// for `pause_for` or more.
std::string OthersUse(const char* what, double share, bool starting, double start_max, double pause_share,
                      absl::Time high_since, absl::Duration pause_for, absl::Time now) {
  if (starting && share > start_max) {
    return absl::StrCat("other processes use ", Percent(share), " of the ", what, " (start needs < ",
                        Percent(start_max), ")");
  }
  if (!starting && high_since != absl::InfinitePast() && now - high_since >= pause_for) {
    return absl::StrCat("other processes used over ", Percent(pause_share), " of the ", what, " for ",
                        Ago(now - high_since));
  }
  return "";
}

// The owner's side of a snapshot, reduced to what the rules read.
struct Owner {
  bool at_console = true;       // false only when known: no one is logged in at the screen
  bool short_threshold = false; // locked, display asleep, or no console user
  bool idle_known = false;
  absl::Time last_activity = absl::InfinitePast();
};

Owner ReadOwner(const PolicyConfig& config, const Snapshot& s) {
  Owner o;
  o.at_console = !(s.console_user.known() && !*s.console_user.value);
  o.short_threshold = !o.at_console || (s.screen_locked.known() && *s.screen_locked.value) ||
                      (s.display_asleep.known() && *s.display_asleep.value);
  // Without a console user there is no input to wait for; a dedicated machine has none to read.
  o.idle_known = s.last_input.known() || !o.at_console || config.dedicated;
  if (s.last_input.known()) o.last_activity = std::max(o.last_activity, *s.last_input.value);
  if (s.owner_activity.known()) o.last_activity = std::max(o.last_activity, *s.owner_activity.value);
  return o;
}

bool InHours(const PolicyConfig& config, absl::Time now) {
  if (config.hours.empty()) return true;
  int hour = absl::ToCivilHour(now, config.time_zone).hour();
  for (auto [from, to] : config.hours) {
    if (from <= to ? (hour >= from && hour < to) : (hour >= from || hour < to)) return true;
  }
  return false;
}

// A signal the rules need but the probes could not read. Dedicated machines skip those.
template <typename T>
bool Unknown(const PolicyConfig& config, const Signal<T>& s) {
  return !config.dedicated && !s.known();
}

// Conditions that end the work at once: the machine itself is in trouble.
std::string StopProblem(const PolicyConfig& config, const Snapshot& s, const PolicyState& state) {
  if (s.thermal.known() && *s.thermal.value == Thermal::kCritical) return "thermal state critical";
  if (s.memory.known() && *s.memory.value == MemoryPressure::kCritical) return "memory pressure critical";
  if (config.allow_battery && s.on_ac.known() && !*s.on_ac.value && s.battery_percent.known() &&
      *s.battery_percent.value < config.battery_stop_percent) {
    return absl::StrFormat("battery at %.0f %% (stops below %.0f %%)", *s.battery_percent.value,
                           config.battery_stop_percent);
  }
  if (state.memory_share > config.max_memory_share) {
    return absl::StrCat("the runner holds ", Percent(state.memory_share), " of memory (limit ",
                        Percent(config.max_memory_share), ")");
  }
  return "";
}

// Everything but input idleness. `starting`: the stricter start/resume limits; otherwise the
// pause rules with their hysteresis.
std::string EnvironmentProblem(const PolicyConfig& config, const Snapshot& s, const PolicyState& state,
                               const Owner& owner, absl::Time now, bool starting) {
  if (!InHours(config, now)) return "outside the allowed hours";
  if (Unknown(config, s.on_ac)) return "power source unknown";
  if (s.on_ac.known() && !*s.on_ac.value) {
    if (!config.allow_battery) return "on battery";
    if (!s.battery_percent.known()) return "on battery, charge unknown";
    if (starting && *s.battery_percent.value < config.battery_start_percent) {
      return absl::StrFormat("battery at %.0f %% (starts at %.0f %%)", *s.battery_percent.value,
                             config.battery_start_percent);
    }
  }
  if (s.low_power_mode.known() && *s.low_power_mode.value) return "Low Power Mode is on";
  if (Unknown(config, s.thermal)) return "thermal state unknown";
  if (s.thermal.known()) {
    Thermal t = *s.thermal.value;
    if (t >= Thermal::kSerious || (starting && t != Thermal::kNominal)) {
      return absl::StrCat("thermal state ", ThermalName(t));
    }
  }
  if (Unknown(config, s.memory)) return "memory pressure unknown";
  if (starting && s.memory.known() && *s.memory.value != MemoryPressure::kNormal) {
    return absl::StrCat("memory pressure ", MemoryPressureName(*s.memory.value));
  }
  if (!config.protected_apps.empty() && Unknown(config, s.protected_app)) return "running apps unknown";
  if (s.protected_app.known() && !s.protected_app.value->empty()) {
    return absl::StrCat(*s.protected_app.value, " is running");
  }
  if (owner.at_console) {
    if (Unknown(config, s.media_playing)) return "video and call activity unknown";
    if (s.media_playing.known() && *s.media_playing.value) return "another app keeps the display awake (video or call)";
  }
  if (Unknown(config, s.other_cpu)) return "CPU use of other processes unknown";
  if (s.other_cpu.known()) {
    std::string why = OthersUse("CPU", *s.other_cpu.value, starting, config.start_max_other_cpu, config.pause_other_cpu,
                                state.other_cpu_high_since, config.pause_other_cpu_for, now);
    if (!why.empty()) return why;
  }
  if (Unknown(config, s.gpu_count)) return "GPUs unknown";
  if (s.gpu_count.known() && *s.gpu_count.value > 0) {
    if (Unknown(config, s.other_gpu)) return "GPU use of other processes unknown";
    if (s.other_gpu.known()) {
      return OthersUse("GPU", *s.other_gpu.value, starting, config.start_max_other_gpu, config.pause_other_gpu,
                       state.other_gpu_high_since, config.pause_other_gpu_for, now);
    }
  }
  return "";
}

// Input idleness for starting (threshold `needed`, or the short one when it applies).
std::string IdleProblem(const PolicyConfig& config, const Owner& owner, absl::Time now, absl::Duration needed) {
  if (!owner.idle_known) return "input idle time unknown";
  if (owner.short_threshold) needed = std::min(needed, config.start_idle_locked);
  absl::Duration idle = now - owner.last_activity;
  if (idle < needed) {
    return absl::StrCat("owner active ", Ago(std::max(idle, absl::ZeroDuration())), " ago (needs ", Ago(needed),
                        " idle)");
  }
  return "";
}

Decision Act(Decision d, Action action, Phase phase, absl::Time now, std::string reason) {
  d.action = action;
  d.reason = std::move(reason);
  if (d.next.phase != phase) {
    d.next.phase = phase;
    d.next.phase_since = now;
  }
  return d;
}

Decision Stop(Decision d, absl::Time now, std::string reason, const PolicyConfig& config) {
  // Each stop lengthens the wait before the next start (flapping costs the owner twice).
  d.next.backoff = d.next.backoff <= absl::ZeroDuration() ? config.backoff_initial
                                                          : std::min(d.next.backoff * 2, config.backoff_max);
  d.next.backoff_until = now + d.next.backoff;
  d.next.throttled = false;
  return Act(std::move(d), Action::kStop, Phase::kStopping, now, std::move(reason));
}

}  // namespace

namespace {

constexpr const char* kThermalNames[] = {"nominal", "fair", "serious", "critical"};
constexpr const char* kMemoryPressureNames[] = {"normal", "warn", "critical"};
constexpr const char* kPhaseNames[] = {"waiting", "running", "paused", "released", "stopping"};
constexpr const char* kActionNames[] = {"none", "start", "pause", "resume", "release",
                                        "stop", "kill", "throttle", "unthrottle"};
// A name for every value, in order.
static_assert(std::size(kThermalNames) == static_cast<size_t>(Thermal::kCritical) + 1);
static_assert(std::size(kMemoryPressureNames) == static_cast<size_t>(MemoryPressure::kCritical) + 1);
static_assert(std::size(kPhaseNames) == static_cast<size_t>(Phase::kStopping) + 1);
static_assert(std::size(kActionNames) == static_cast<size_t>(Action::kUnthrottle) + 1);

}  // namespace

const char* ThermalName(Thermal t) { return NameIn(kThermalNames, t); }
const char* MemoryPressureName(MemoryPressure m) { return NameIn(kMemoryPressureNames, m); }
const char* PhaseName(Phase p) { return NameIn(kPhaseNames, p); }
const char* ActionName(Action a) { return NameIn(kActionNames, a); }

const char* FleetState(Phase phase, bool holds_work) {
  switch (phase) {
    case Phase::kRunning: return holds_work ? "busy" : "available";
    case Phase::kWaiting:
    case Phase::kPaused:
    case Phase::kReleased:
    case Phase::kStopping: return "owner_active";
  }
  return "owner_active";
}

absl::Status PolicyConfig::Validate() const {
  auto share = [](double v, const char* name) -> absl::Status {
    if (v < 0 || v > 1) return absl::InvalidArgumentError(absl::StrCat(name, " must be between 0 and 1, not ", v));
    return absl::OkStatus();
  };
  for (auto [v, name] : {std::pair{start_max_other_cpu, "start_max_other_cpu"}, {pause_other_cpu, "pause_other_cpu"},
                         {start_max_other_gpu, "start_max_other_gpu"}, {pause_other_gpu, "pause_other_gpu"},
                         {large_memory_share, "large_memory_share"}, {max_memory_share, "max_memory_share"}}) {
    if (auto s = share(v, name); !s.ok()) return s;
  }
  for (auto [d, name] : {std::pair{start_idle, "start_idle"}, {start_idle_locked, "start_idle_locked"},
                         {resume_idle, "resume_idle"}, {min_paused, "min_paused"}, {release_after, "release_after"},
                         {stop_after, "stop_after"}, {stop_after_large, "stop_after_large"}, {kill_after, "kill_after"},
                         {backoff_initial, "backoff_initial"}, {backoff_max, "backoff_max"},
                         {pause_other_cpu_for, "pause_other_cpu_for"}, {pause_other_gpu_for, "pause_other_gpu_for"}}) {
    if (d < absl::ZeroDuration()) return absl::InvalidArgumentError(absl::StrCat(name, " must not be negative"));
  }
  if (battery_stop_percent > battery_start_percent || battery_stop_percent < 0 || battery_start_percent > 100) {
    return absl::InvalidArgumentError("battery_stop_percent must be at most battery_start_percent, within 0..100");
  }
  for (auto [from, to] : hours) {
    if (from < 0 || from > 23 || to < 0 || to > 24 || from == to) {
      return absl::InvalidArgumentError(absl::StrCat("hours ", from, "-", to, ": use hours 0-24, like 22-7"));
    }
  }
  return absl::OkStatus();
}

Decision Decide(const PolicyConfig& config, const Snapshot& s, const PolicyState& state, absl::Time now) {
  Decision d;
  d.next = state;
  PolicyState& n = d.next;

  // Hysteresis: how long other processes have been over the pause limits.
  auto track = [&](const Signal<double>& signal, double limit, absl::Time* since) {
    if (signal.known() && *signal.value > limit) {
      if (*since == absl::InfinitePast()) *since = now;
    } else {
      *since = absl::InfinitePast();
    }
  };
  track(s.other_cpu, config.pause_other_cpu, &n.other_cpu_high_since);
  track(s.other_gpu, config.pause_other_gpu, &n.other_gpu_high_since);
  // An hour of clean running forgets earlier stops.
  if (n.phase == Phase::kRunning && n.backoff > absl::ZeroDuration() && now - n.running_since >= config.backoff_reset) {
    n.backoff = absl::ZeroDuration();
    n.backoff_until = absl::InfinitePast();
  }

  Owner owner = ReadOwner(config, s);
  switch (state.phase) {
    case Phase::kWaiting: {
      if (n.manual_pause) return Act(std::move(d), Action::kNone, Phase::kWaiting, now, "paused by the owner");
      if (now < n.backoff_until) {
        return Act(std::move(d), Action::kNone, Phase::kWaiting, now,
                   absl::StrCat("restart backoff: ", Ago(n.backoff_until - now), " left"));
      }
      std::string why = StopProblem(config, s, n);
      if (why.empty()) why = EnvironmentProblem(config, s, n, owner, now, /*starting=*/true);
      if (why.empty()) why = IdleProblem(config, owner, now, config.start_idle);
      if (!why.empty()) return Act(std::move(d), Action::kNone, Phase::kWaiting, now, why);
      n.started_short = owner.short_threshold;
      n.running_since = now;
      return Act(std::move(d), Action::kStart, Phase::kRunning, now,
                 owner.short_threshold ? "owner away (locked, display asleep or no console user)" : "owner away");
    }

    case Phase::kRunning: {
      if (std::string why = StopProblem(config, s, n); !why.empty()) return Stop(std::move(d), now, why, config);
      if (n.manual_pause) {
        n.paused_since = now;
        return Act(std::move(d), Action::kPause, Phase::kPaused, now, "paused by the owner");
      }
      std::string why;
      if (owner.last_activity >= n.phase_since) {  // the start itself needed idle time before it
        why = absl::StrCat("owner active ", Ago(std::max(now - owner.last_activity, absl::ZeroDuration())), " ago");
      } else if (!owner.idle_known) {
        why = "input idle time unknown";
      } else if (n.started_short && !owner.short_threshold && now - owner.last_activity < config.start_idle) {
        why = "screen unlocked or display awake";
      }
      if (why.empty()) why = EnvironmentProblem(config, s, n, owner, now, /*starting=*/false);
      if (!why.empty()) {
        n.paused_since = now;
        return Act(std::move(d), Action::kPause, Phase::kPaused, now, why);
      }
      if (s.memory.known() && *s.memory.value == MemoryPressure::kWarn) {
        n.paused_since = now;
        return Act(std::move(d), Action::kRelease, Phase::kReleased, now, "memory pressure warn");
      }
      bool fair = s.thermal.known() && *s.thermal.value == Thermal::kFair;
      if (fair && !n.throttled) {
        n.throttled = true;
        return Act(std::move(d), Action::kThrottle, Phase::kRunning, now, "thermal state fair");
      }
      if (!fair && n.throttled) {
        n.throttled = false;
        return Act(std::move(d), Action::kUnthrottle, Phase::kRunning, now, "thermal state back to nominal");
      }
      return Act(std::move(d), Action::kNone, Phase::kRunning, now, "owner away");
    }

    case Phase::kPaused:
    case Phase::kReleased: {
      if (std::string why = StopProblem(config, s, n); !why.empty()) return Stop(std::move(d), now, why, config);
      absl::Duration paused = now - n.paused_since;
      bool large = n.memory_share > config.large_memory_share;
      absl::Duration stop_after = large ? config.stop_after_large : config.stop_after;
      if (n.holds_work && paused >= stop_after) {
        return Stop(std::move(d), now, absl::StrCat("paused for ", Ago(paused), large ? " holding a large share of memory" : ""),
                    config);
      }
      std::string why = n.manual_pause ? "paused by the owner" : "";
      if (why.empty()) why = EnvironmentProblem(config, s, n, owner, now, /*starting=*/true);
      if (why.empty()) why = IdleProblem(config, owner, now, config.resume_idle);
      if (why.empty() && now - n.paused_since < config.min_paused) {
        why = absl::StrCat("paused ", Ago(now - n.paused_since), " ago");
      }
      if (why.empty()) {
        n.started_short = owner.short_threshold;
        return Act(std::move(d), Action::kResume, Phase::kRunning, now, "owner away again");
      }
      bool pressure = s.memory.known() && *s.memory.value != MemoryPressure::kNormal;
      if (state.phase == Phase::kPaused && (paused >= config.release_after || pressure)) {
        return Act(std::move(d), Action::kRelease, Phase::kReleased, now,
                   pressure ? "memory pressure warn" : absl::StrCat("paused for ", Ago(paused), ": ", why));
      }
      return Act(std::move(d), Action::kNone, state.phase, now, why);
    }

    case Phase::kStopping: {
      if (!n.holds_work) {
        return Act(std::move(d), Action::kNone, Phase::kWaiting, now,
                   absl::StrCat("work handed back; restart backoff ", Ago(n.backoff)));
      }
      if (now - n.phase_since >= config.kill_after) {
        n.phase_since = now;  // kill again after another grace if it still holds on
        return Act(std::move(d), Action::kKill, Phase::kStopping, now,
                   absl::StrCat("stop not acknowledged in ", Ago(config.kill_after)));
      }
      return Act(std::move(d), Action::kNone, Phase::kStopping, now, "handing the work back");
    }
  }
  return d;
}

}  // namespace minions::availability
