#include "executor/availability_controller.h"

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "availability/linux_probes.h"
#include "common/logging.h"

namespace minions {
namespace {

using availability::Action;
using availability::Phase;

WorkMode ModeFor(const availability::PolicyState& state) {
  switch (state.phase) {
    case Phase::kRunning: return state.throttled ? WorkMode::kThrottle : WorkMode::kRun;
    case Phase::kPaused: return WorkMode::kPause;
    case Phase::kStopping: return WorkMode::kStop;
    case Phase::kWaiting:  // nothing held; make sure no runner lingers either
    case Phase::kReleased: return WorkMode::kRelease;
  }
  return WorkMode::kRelease;
}

absl::Status Bad(const std::string& key, const std::string& value, const char* expected) {
  return absl::InvalidArgumentError(absl::StrCat("availability setting ", key, " = '", value, "': expected ", expected));
}

// The settings table: name -> how to apply a text value.
using Setter = std::function<absl::Status(const std::string& key, const std::string& value, AvailabilityOptions*)>;

Setter Duration(absl::Duration availability::PolicyConfig::*field) {
  return [field](const std::string& key, const std::string& value, AvailabilityOptions* o) {
    absl::Duration d;
    if (!absl::ParseDuration(value, &d) || d < absl::ZeroDuration()) {
      return Bad(key, value, "a duration like 90s, 10m or 1h");
    }
    o->policy.*field = d;
    return absl::OkStatus();
  };
}

Setter Number(double availability::PolicyConfig::*field, const char* expected) {
  return [field, expected](const std::string& key, const std::string& value, AvailabilityOptions* o) {
    double v;
    if (!absl::SimpleAtod(value, &v)) return Bad(key, value, expected);
    o->policy.*field = v;
    return absl::OkStatus();
  };
}

absl::StatusOr<bool> ParseBool(const std::string& key, const std::string& value) {
  std::string v = absl::AsciiStrToLower(value);
  if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  return Bad(key, value, "true or false");
}

// "20GB", "512MB", "1.5G", "1000000" (bytes).
Setter Bytes(int64_t AvailabilityOptions::*field) {
  return [field](const std::string& key, const std::string& value, AvailabilityOptions* o) -> absl::Status {
    std::string number = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(value));
    double scale = 1;
    for (const auto& [suffix, factor] : {std::pair{"GB", 1 << 30}, {"G", 1 << 30}, {"MB", 1 << 20}, {"M", 1 << 20},
                                         {"KB", 1 << 10}, {"K", 1 << 10}, {"B", 1}}) {
      if (absl::EndsWith(number, suffix)) {
        number = number.substr(0, number.size() - std::string(suffix).size());
        scale = factor;
        break;
      }
    }
    double v;
    if (!absl::SimpleAtod(number, &v) || v < 0) return Bad(key, value, "a size like 20GB, 512MB or 0");
    o->*field = static_cast<int64_t>(v * scale);
    return absl::OkStatus();
  };
}

Setter Bool(bool* (*field)(AvailabilityOptions*)) {
  return [field](const std::string& key, const std::string& value, AvailabilityOptions* o) {
    auto b = ParseBool(key, value);
    if (!b.ok()) return b.status();
    *field(o) = *b;
    return absl::OkStatus();
  };
}

std::vector<std::string> List(const std::string& value) {
  std::vector<std::string> out;
  for (absl::string_view item : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
    out.emplace_back(absl::StripAsciiWhitespace(item));
  }
  return out;
}

const std::vector<std::pair<std::string, Setter>>& Settings() {
  using P = availability::PolicyConfig;
  static const auto* table = new std::vector<std::pair<std::string, Setter>>{
      {"mode",
       [](const std::string& key, const std::string& value, AvailabilityOptions* o) {
         if (value == "owner") {
           o->mode = AvailabilityOptions::Mode::kOwner;
         } else if (value == "dedicated") {
           o->mode = AvailabilityOptions::Mode::kDedicated;
         } else if (value == "off") {
           o->mode = AvailabilityOptions::Mode::kOff;
         } else {
           return Bad(key, value, "owner, dedicated or off");
         }
         o->policy.dedicated = o->mode == AvailabilityOptions::Mode::kDedicated;
         return absl::OkStatus();
       }},
      {"start_idle", Duration(&P::start_idle)},
      {"start_idle_locked", Duration(&P::start_idle_locked)},
      {"resume_idle", Duration(&P::resume_idle)},
      {"min_paused", Duration(&P::min_paused)},
      {"release_after", Duration(&P::release_after)},
      {"stop_after", Duration(&P::stop_after)},
      {"stop_after_large", Duration(&P::stop_after_large)},
      {"kill_after", Duration(&P::kill_after)},
      {"backoff_initial", Duration(&P::backoff_initial)},
      {"backoff_max", Duration(&P::backoff_max)},
      {"backoff_reset", Duration(&P::backoff_reset)},
      {"pause_other_cpu_for", Duration(&P::pause_other_cpu_for)},
      {"pause_other_gpu_for", Duration(&P::pause_other_gpu_for)},
      {"start_max_other_cpu", Number(&P::start_max_other_cpu, "a share between 0 and 1")},
      {"pause_other_cpu", Number(&P::pause_other_cpu, "a share between 0 and 1")},
      {"start_max_other_gpu", Number(&P::start_max_other_gpu, "a share between 0 and 1")},
      {"pause_other_gpu", Number(&P::pause_other_gpu, "a share between 0 and 1")},
      {"large_memory_share", Number(&P::large_memory_share, "a share between 0 and 1")},
      {"max_memory_share", Number(&P::max_memory_share, "a share between 0 and 1")},
      {"battery_start_percent", Number(&P::battery_start_percent, "a percentage")},
      {"battery_stop_percent", Number(&P::battery_stop_percent, "a percentage")},
      {"allow_battery", Bool([](AvailabilityOptions* o) { return &o->policy.allow_battery; })},
      {"probe_logind", Bool([](AvailabilityOptions* o) { return &o->probes.logind; })},
      {"probe_input_devices",
       [](const std::string& key, const std::string& value, AvailabilityOptions* o) -> absl::Status {
         // auto: only where logind cannot tell (no `input` group needed where it can).
         if (absl::AsciiStrToLower(value) == "auto") {
           o->probes.input_devices = true;
           o->probes.input_devices_defer_to_logind = true;
           return absl::OkStatus();
         }
         auto b = ParseBool(key, value);
         if (!b.ok()) return Bad(key, value, "auto, true or false");
         o->probes.input_devices = *b;
         o->probes.input_devices_defer_to_logind = false;
         return absl::OkStatus();
       }},
      {"probe_nvml", Bool([](AvailabilityOptions* o) { return &o->probes.nvml; })},
      {"probe_root",  // where the file probes look for /proc, /sys and /dev (tests, benchmarks)
       [](const std::string&, const std::string& value, AvailabilityOptions* o) {
         o->probes.root = value;
         return absl::OkStatus();
       }},
      {"hours",
       [](const std::string& key, const std::string& value, AvailabilityOptions* o) {
         std::vector<std::pair<int, int>> hours;
         for (const std::string& range : List(value)) {
           std::vector<std::string> ends = absl::StrSplit(range, '-');
           int from, to;
           if (ends.size() != 2 || !absl::SimpleAtoi(ends[0], &from) || !absl::SimpleAtoi(ends[1], &to)) {
             return Bad(key, value, "hour ranges like 22-7 or 9-12,14-17 (local time)");
           }
           hours.emplace_back(from, to);
         }
         o->policy.hours = hours;
         return absl::OkStatus();
       }},
      {"protected_apps",
       [](const std::string&, const std::string& value, AvailabilityOptions* o) {
         o->policy.protected_apps = o->probes.protected_apps = List(value);
         return absl::OkStatus();
       }},
      {"model_cache_max", Bytes(&AvailabilityOptions::model_cache_bytes)},
      {"free_disk_floor", Bytes(&AvailabilityOptions::free_disk_floor_bytes)},
      {"model_download_per_second", Bytes(&AvailabilityOptions::model_download_bytes_per_second)},
      {"pause_grace",
       [](const std::string& key, const std::string& value, AvailabilityOptions* o) {
         absl::Duration d;
         if (!absl::ParseDuration(value, &d) || d < absl::ZeroDuration()) return Bad(key, value, "a duration like 500ms");
         o->pause_grace = d;
         return absl::OkStatus();
       }},
  };
  return *table;
}

}  // namespace

const char* WorkModeName(WorkMode mode) {
  switch (mode) {
    case WorkMode::kRun: return "run";
    case WorkMode::kThrottle: return "throttle";
    case WorkMode::kPause: return "pause";
    case WorkMode::kRelease: return "release";
    case WorkMode::kStop: return "stop";
  }
  return "?";
}

absl::Status ApplyAvailabilitySetting(const std::string& key, const std::string& value, AvailabilityOptions* options) {
  for (const auto& [name, set] : Settings()) {
    if (name == key) {
      if (auto s = set(key, value, options); !s.ok()) return s;
      return options->policy.Validate();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown availability setting '", key, "'; known: ",
                                                 absl::StrJoin(AvailabilitySettingNames(), ", ")));
}

std::vector<std::string> AvailabilitySettingNames() {
  std::vector<std::string> names;
  for (const auto& [name, set] : Settings()) names.push_back(name);
  return names;
}

AvailabilityController::AvailabilityController(AvailabilityOptions options,
                                               std::vector<std::unique_ptr<availability::Probe>> probes, Clock* clock)
    : options_(std::move(options)), clock_(clock), alarm_(std::make_unique<Alarm>(clock)), sampler_(std::move(probes)) {
  options_.policy.dedicated = options_.mode == AvailabilityOptions::Mode::kDedicated;
  options_.policy.time_zone = absl::LocalTimeZone();
  absl::MutexLock lock(&mu_);
  mode_since_ = clock_->Now();
  state_.phase_since = clock_->Now();
}

AvailabilityController::~AvailabilityController() { Shutdown(); }

void AvailabilityController::Attach(WorkTarget* target) { target_ = target; }
void AvailabilityController::OnChange(std::function<void()> callback) { on_change_ = std::move(callback); }

void AvailabilityController::Start() {
  Tick();  // decide before the agent asks for the first time
  thread_ = std::thread([this] { Loop(); });
}

void AvailabilityController::Shutdown() {
  stop_ = true;
  alarm_->Ring();
  if (thread_.joinable()) thread_.join();
}

void AvailabilityController::Loop() {
  while (!stop_) {
    absl::Time due;
    {
      absl::MutexLock lock(&tick_mu_);
      due = std::min(sampler_.NextDue(), clock_->Now() + options_.tick);
    }
    alarm_->SleepUntil(due);
    if (stop_) break;
    Tick();
  }
}

void AvailabilityController::Tick() {
  absl::MutexLock tick_lock(&tick_mu_);
  TickLocked();
}

void AvailabilityController::TickLocked() {
  absl::Time now = clock_->Now();
  availability::Snapshot snapshot = sampler_.Sample(now);
  availability::PolicyState state;
  {
    absl::MutexLock lock(&mu_);
    state = state_;
  }
  if (target_) {
    state.holds_work = target_->HoldsWork();
    int pid = target_->RunnerPid();
    int64_t total = availability::MemTotalBytes("/");
    state.memory_share =
        pid > 0 && total > 0 ? static_cast<double>(availability::ProcessRssBytes("/", pid)) / total : 0.0;
  }
  availability::Decision d = availability::Decide(options_.policy, snapshot, state, now);
  // A step towards the owner (pause, release) may be followed at once by the next one on the
  // same signals: with release_after=0 a pause is a release. Without deciding again here, that
  // next step waited for the following tick (up to `tick`, 1 s): the runner's end after owner
  // activity took 386 ms at p50 and 964 ms at p99 instead of tens of milliseconds. Only steps
  // away from running chain (a stop ends it), so a pause never turns into a resume in one tick.
  for (int step = 0; step < 2 && (d.action == Action::kPause || d.action == Action::kRelease); ++step) {
    availability::Decision next = availability::Decide(options_.policy, snapshot, d.next, now);
    if (next.action != Action::kRelease && next.action != Action::kStop) break;
    Record(d, now);
    d = std::move(next);
  }
  if (d.action == Action::kKill && target_) target_->KillRunner(d.reason.c_str());
  WorkMode mode = ModeFor(d.next);
  bool changed;
  {
    absl::MutexLock lock(&mu_);
    state_ = d.next;
    snapshot_ = snapshot;
    reason_ = d.reason;
    changed = mode != mode_;
    if (changed) {
      mode_ = mode;
      mode_since_ = now;
    }
  }
  Record(d, now);
  sleep_guard_.Set(d.next.phase == Phase::kRunning, snapshot.on_ac.known() && *snapshot.on_ac.value);
  if (changed && on_change_) on_change_();
}

void AvailabilityController::Record(const availability::Decision& d, absl::Time now) {
  if (d.action == Action::kNone) return;
  {
    absl::MutexLock lock(&mu_);
    history_.push_back(absl::StrCat(absl::FormatTime("%H:%M:%E3S", now, absl::LocalTimeZone()), " ",
                                    availability::ActionName(d.action), ": ", d.reason));
    if (history_.size() > 10) history_.pop_front();
  }
  MINIONS_LOG(Info) << "availability: " << availability::ActionName(d.action) << " (" << d.reason << ")";
}

void AvailabilityController::ManualPause() {
  absl::MutexLock tick_lock(&tick_mu_);
  {
    absl::MutexLock lock(&mu_);
    state_.manual_pause = true;
  }
  TickLocked();
}

void AvailabilityController::ManualResume() {
  absl::MutexLock tick_lock(&tick_mu_);
  {
    absl::MutexLock lock(&mu_);
    state_.manual_pause = false;
  }
  TickLocked();
}

void AvailabilityController::ReportActivity() {
  absl::MutexLock tick_lock(&tick_mu_);
  sampler_.ReportActivity(clock_->Now());
  TickLocked();  // at once: this is the yield latency the owner feels
}

WorkMode AvailabilityController::mode() const {
  absl::MutexLock lock(&mu_);
  return mode_;
}

absl::Time AvailabilityController::mode_since() const {
  absl::MutexLock lock(&mu_);
  return mode_since_;
}

availability::Phase AvailabilityController::phase() const {
  absl::MutexLock lock(&mu_);
  return state_.phase;
}

std::string AvailabilityController::FleetState(bool holds_work) const {
  absl::MutexLock lock(&mu_);
  return availability::FleetState(state_.phase, holds_work);
}

std::string AvailabilityController::Reason() const {
  absl::MutexLock lock(&mu_);
  return state_.manual_pause ? absl::StrCat("paused by the owner; ", reason_) : reason_;
}

std::string AvailabilityController::Status() const {
  absl::MutexLock lock(&mu_);
  absl::Time now = clock_->Now();
  std::string out = absl::StrCat(
      "phase     ", availability::PhaseName(state_.phase), " (mode ", WorkModeName(mode_), ", since ",
      absl::FormatDuration(absl::Trunc(now - state_.phase_since, absl::Seconds(1))), ")\n", "reason    ", reason_,
      "\n", "manual    ", state_.manual_pause ? "paused by the owner" : "no", "\n", "policy    ",
      options_.mode == AvailabilityOptions::Mode::kDedicated ? "dedicated machine" : "owner's machine", "\n");
  if (now < state_.backoff_until) {
    absl::StrAppend(&out, "backoff   ", absl::FormatDuration(absl::Trunc(state_.backoff_until - now, absl::Seconds(1))),
                    " left\n");
  }
  absl::StrAppend(&out, "signals\n", availability::DescribeSnapshot(snapshot_, now));
  if (!history_.empty()) absl::StrAppend(&out, "recent actions\n");
  for (const auto& h : history_) absl::StrAppend(&out, "  ", h, "\n");
  return out;
}

std::string AvailabilityController::HandleCommand(const std::string& raw) {
  std::string command(absl::StripAsciiWhitespace(raw));
  if (command == "pause") {
    ManualPause();
    return "paused: the executor yields the machine until `minions executor resume`\n";
  }
  if (command == "resume") {
    ManualResume();
    return absl::StrCat("resumed: work restarts when the policy allows (", Reason(), ")\n");
  }
  if (command == "activity") {
    ReportActivity();
    return absl::StrCat("owner activity noted: ", WorkModeName(mode()), " (", Reason(), ")\n");
  }
  if (command == "status") return Status();
  return absl::StrCat("error: unknown command '", command, "' (pause, resume, activity, status)\n");
}

}  // namespace minions
