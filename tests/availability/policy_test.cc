// Every rule of the availability policy (docs/availability.md) as a table row: a snapshot, the
// executor's phase, and the action and reason the policy must give. Time comes from a FakeClock.

#include "availability/policy.h"

#include <functional>

#include <gtest/gtest.h>

#include "testing/fake_clock.h"

namespace minions::availability {
namespace {

using absl::Minutes;
using absl::Seconds;
using absl::Hours;

// A machine whose owner left `idle` ago and where everything else allows work.
Snapshot Away(absl::Time now, absl::Duration idle) {
  Snapshot s;
  s.last_input.Set(now - idle, now, "test");
  s.console_user.Set(true, now, "test");
  s.screen_locked.Set(false, now, "test");
  s.display_asleep.Set(false, now, "test");
  s.media_playing.Set(false, now, "test");
  s.protected_app.Set("", now, "test");
  s.on_ac.Set(true, now, "test");
  s.low_power_mode.Set(false, now, "test");
  s.thermal.Set(Thermal::kNominal, now, "test");
  s.memory.Set(MemoryPressure::kNormal, now, "test");
  s.other_cpu.Set(0.05, now, "test");
  s.gpu_count.Set(1, now, "test");
  s.other_gpu.Set(0.0, now, "test");
  return s;
}

PolicyState InPhase(Phase phase, absl::Time since, bool holds_work = true) {
  PolicyState st;
  st.phase = phase;
  st.phase_since = since;
  st.holds_work = holds_work;
  if (phase == Phase::kRunning) st.running_since = since;
  if (phase == Phase::kPaused || phase == Phase::kReleased) st.paused_since = since;
  return st;
}

// The inputs a row changes from its starting point, at `now` (the fake clock's time).
struct Inputs {
  absl::Time now;
  PolicyConfig& config;
  Snapshot& s;
  PolicyState& st;
};

// A rule as a row: an executor in phase `from` for `in_phase` on a machine whose owner left
// `idle` ago (Away), changed by `tweak`; the action, next phase and reason the policy must give.
struct Row {
  const char* name;
  Phase from;  // kWaiting: a fresh PolicyState
  absl::Duration in_phase;
  absl::Duration idle;
  Action action;
  Phase phase;
  const char* reason;  // a substring of the reason
  std::function<void(Inputs&)> tweak = nullptr;
};

class PolicyTable : public ::testing::TestWithParam<Row> {};

TEST_P(PolicyTable, Decides) {
  const Row& row = GetParam();
  testing::FakeClock clock;
  absl::Time now = clock.Now();
  PolicyConfig config;
  config.time_zone = absl::UTCTimeZone();
  Snapshot s = Away(now, row.idle);
  PolicyState st;
  if (row.from != Phase::kWaiting) st = InPhase(row.from, now - row.in_phase);
  Inputs inputs{now, config, s, st};
  if (row.tweak) row.tweak(inputs);
  ASSERT_TRUE(config.Validate().ok()) << config.Validate();
  Decision d = Decide(config, s, st, now);
  EXPECT_EQ(ActionName(d.action), std::string(ActionName(row.action))) << d.reason;
  EXPECT_EQ(PhaseName(d.next.phase), std::string(PhaseName(row.phase))) << d.reason;
  EXPECT_NE(d.reason.find(row.reason), std::string::npos) << "reason: " << d.reason;
}

using enum Action;
using enum Phase;

const Row kRows[] = {
    // --- start ---
    {"StartsAfterTenMinutesIdle", kWaiting, {}, Minutes(10), kStart, kRunning, "owner away"},
    {"WaitsBeforeTenMinutes", kWaiting, {}, Minutes(9), kNone, kWaiting, "needs 10m idle"},
    {"StartsAfterTwoMinutesWhenLocked", kWaiting, {}, Minutes(2), kStart, kRunning, "locked",
     [](Inputs& in) { in.s.screen_locked.Set(true, in.now, "t"); }},
    {"StartsAfterTwoMinutesWhenDisplayAsleep", kWaiting, {}, Minutes(2), kStart, kRunning, "owner away",
     [](Inputs& in) { in.s.display_asleep.Set(true, in.now, "t"); }},
    {"NoConsoleUserNeedsNoInputSignal", kWaiting, {}, Minutes(1), kStart, kRunning, "no console user",
     [](Inputs& in) { in.s.last_input = {}; in.s.media_playing = {}; in.s.console_user.Set(false, in.now, "t"); }},
    {"NoConsoleUserStillHonoursReportedActivity", kWaiting, {}, Minutes(30), kNone, kWaiting, "needs 2m idle",
     [](Inputs& in) { in.s.last_input = {}; in.s.console_user.Set(false, in.now, "t"); in.s.owner_activity.Set(in.now - Minutes(1), in.now, "t"); }},
    {"UnknownInputFailsClosed", kWaiting, {}, Minutes(30), kNone, kWaiting, "input idle time unknown", [](Inputs& in) { in.s.last_input = {}; }},
    {"UnknownConsoleCountsAsPresent", kWaiting, {}, Minutes(30), kNone, kWaiting, "input idle time unknown",
     [](Inputs& in) { in.s.console_user = {}; in.s.last_input = {}; }},
    {"UnknownPowerFailsClosed", kWaiting, {}, Minutes(30), kNone, kWaiting, "power source unknown", [](Inputs& in) { in.s.on_ac = {}; }},
    {"UnknownThermalFailsClosed", kWaiting, {}, Minutes(30), kNone, kWaiting, "thermal state unknown", [](Inputs& in) { in.s.thermal = {}; }},
    {"UnknownMemoryFailsClosed", kWaiting, {}, Minutes(30), kNone, kWaiting, "memory pressure unknown", [](Inputs& in) { in.s.memory = {}; }},
    {"UnknownCpuFailsClosed", kWaiting, {}, Minutes(30), kNone, kWaiting, "CPU use of other processes unknown",
     [](Inputs& in) { in.s.other_cpu = {}; }},
    {"UnknownGpusFailClosed", kWaiting, {}, Minutes(30), kNone, kWaiting, "GPUs unknown", [](Inputs& in) { in.s.gpu_count = {}; }},
    {"UnknownGpuUseFailsClosed", kWaiting, {}, Minutes(30), kNone, kWaiting, "GPU use of other processes unknown",
     [](Inputs& in) { in.s.other_gpu = {}; }},
    {"NoGpuNeedsNoGpuSignal", kWaiting, {}, Minutes(30), kStart, kRunning, "owner away",
     [](Inputs& in) { in.s.gpu_count.Set(0, in.now, "t"); in.s.other_gpu = {}; }},
    {"UnknownMediaFailsClosed", kWaiting, {}, Minutes(30), kNone, kWaiting, "video and call activity unknown",
     [](Inputs& in) { in.s.media_playing = {}; }},
    {"DedicatedIgnoresUnknowns", kWaiting, {}, {}, kStart, kRunning, "owner away", [](Inputs& in) { in.config.dedicated = true; in.s = Snapshot(); }},
    {"DedicatedStillHonoursReportedActivity", kWaiting, {}, {}, kNone, kWaiting, "owner active 5s ago",
     [](Inputs& in) { in.config.dedicated = true; in.s = Snapshot(); in.s.owner_activity.Set(in.now - Seconds(5), in.now, "t"); }},
    {"NeedsAcPower", kWaiting, {}, Minutes(30), kNone, kWaiting, "on battery",
     [](Inputs& in) { in.s.on_ac.Set(false, in.now, "t"); in.s.battery_percent.Set(100, in.now, "t"); }},
    {"BatteryAllowedStartsAtEightyPercent", kWaiting, {}, Minutes(30), kStart, kRunning, "owner away",
     [](Inputs& in) { in.config.allow_battery = true; in.s.on_ac.Set(false, in.now, "t"); in.s.battery_percent.Set(80, in.now, "t"); }},
    {"BatteryAllowedWaitsBelowEightyPercent", kWaiting, {}, Minutes(30), kNone, kWaiting, "starts at 80 %",
     [](Inputs& in) { in.config.allow_battery = true; in.s.on_ac.Set(false, in.now, "t"); in.s.battery_percent.Set(79, in.now, "t"); }},
    {"LowPowerModeBlocks", kWaiting, {}, Minutes(30), kNone, kWaiting, "Low Power Mode",
     [](Inputs& in) { in.s.low_power_mode.Set(true, in.now, "t"); }},
    {"StartNeedsThermalNominal", kWaiting, {}, Minutes(30), kNone, kWaiting, "thermal state fair",
     [](Inputs& in) { in.s.thermal.Set(Thermal::kFair, in.now, "t"); }},
    {"StartNeedsMemoryNormal", kWaiting, {}, Minutes(30), kNone, kWaiting, "memory pressure warn",
     [](Inputs& in) { in.s.memory.Set(MemoryPressure::kWarn, in.now, "t"); }},
    {"StartBlockedByVideo", kWaiting, {}, Minutes(30), kNone, kWaiting, "video or call",
     [](Inputs& in) { in.s.media_playing.Set(true, in.now, "t"); }},
    {"StartNeedsOtherCpuUnder25", kWaiting, {}, Minutes(30), kNone, kWaiting, "26 % of the CPU",
     [](Inputs& in) { in.s.other_cpu.Set(0.26, in.now, "t"); }},
    {"StartNeedsOtherGpuUnder10", kWaiting, {}, Minutes(30), kNone, kWaiting, "11 % of the GPU",
     [](Inputs& in) { in.s.other_gpu.Set(0.11, in.now, "t"); }},
    {"ProtectedAppBlocks", kWaiting, {}, Minutes(30), kNone, kWaiting, "zoom is running",
     [](Inputs& in) { in.config.protected_apps = {"zoom"}; in.s.protected_app.Set("zoom", in.now, "t"); }},
    {"ProtectedAppsUnknownFailClosed", kWaiting, {}, Minutes(30), kNone, kWaiting, "running apps unknown",
     [](Inputs& in) { in.config.protected_apps = {"zoom"}; in.s.protected_app = {}; }},
    {"OutsideHoursBlocks", kWaiting, {}, Minutes(30), kNone, kWaiting, "outside the allowed hours",
     [](Inputs& in) { int hour = absl::ToCivilHour(in.now, absl::UTCTimeZone()).hour(); in.config.hours = {{(hour + 1) % 24, (hour + 2) % 24}}; }},
    {"InsideWrappingHoursStarts", kWaiting, {}, Minutes(30), kStart, kRunning, "owner away",
     [](Inputs& in) { int hour = absl::ToCivilHour(in.now, absl::UTCTimeZone()).hour(); in.config.hours = {{(hour + 23) % 24, (hour + 1) % 24}}; }},
    {"BackoffDelaysStart", kWaiting, {}, Minutes(30), kNone, kWaiting, "restart backoff: 1m left",
     [](Inputs& in) { in.st.backoff = Minutes(5); in.st.backoff_until = in.now + Minutes(1); }},
    {"ManualPauseBlocksStart", kWaiting, {}, Minutes(30), kNone, kWaiting, "paused by the owner", [](Inputs& in) { in.st.manual_pause = true; }},

    // --- pause ---
    {"AnyInputPauses", kRunning, Minutes(5), Seconds(1), kPause, kPaused, "owner active 1s ago"},
    {"ReportedActivityPauses", kRunning, Minutes(5), Minutes(30), kPause, kPaused, "owner active",
     [](Inputs& in) { in.s.owner_activity.Set(in.now, in.now, "t"); }},
    {"InputBeforeTheStartDoesNotPause", kRunning, Minutes(5), Minutes(12), kNone, kRunning, "owner away"},
    {"UnlockPauses", kRunning, Minutes(1), Minutes(3), kPause, kPaused, "unlocked",
     // idle since before the start, but no longer locked
     [](Inputs& in) { in.st.started_short = true; }},
    {"MediaAssertionPauses", kRunning, Minutes(5), Minutes(30), kPause, kPaused, "video or call",
     [](Inputs& in) { in.s.media_playing.Set(true, in.now, "t"); }},
    {"OtherGpuOver30PercentFor5sPauses", kRunning, Minutes(5), Minutes(30), kPause, kPaused, "30 % of the GPU for 5s",
     [](Inputs& in) { in.st.other_gpu_high_since = in.now - Seconds(5); in.s.other_gpu.Set(0.31, in.now, "t"); }},
    {"OtherGpuOver30PercentFor4sKeepsRunning", kRunning, Minutes(5), Minutes(30), kNone, kRunning, "owner away",
     [](Inputs& in) { in.st.other_gpu_high_since = in.now - Seconds(4); in.s.other_gpu.Set(0.31, in.now, "t"); }},
    {"OtherCpuOver50PercentFor2mPauses", kRunning, Minutes(5), Minutes(30), kPause, kPaused, "50 % of the CPU for 2m",
     [](Inputs& in) { in.st.other_cpu_high_since = in.now - Minutes(2); in.s.other_cpu.Set(0.6, in.now, "t"); }},
    {"OtherCpuDropResetsTheTimer", kRunning, Minutes(5), Minutes(30), kNone, kRunning, "owner away",
     [](Inputs& in) { in.st.other_cpu_high_since = in.now - Minutes(3); in.s.other_cpu.Set(0.4, in.now, "t"); }},
    {"ThermalSeriousPauses", kRunning, Minutes(5), Minutes(30), kPause, kPaused, "thermal state serious",
     [](Inputs& in) { in.s.thermal.Set(Thermal::kSerious, in.now, "t"); }},
    {"SignalLostWhileRunningPauses", kRunning, Minutes(5), Minutes(30), kPause, kPaused, "input idle time unknown",
     [](Inputs& in) { in.s.last_input = {}; }},
    {"ManualPausePauses", kRunning, Minutes(5), Minutes(30), kPause, kPaused, "paused by the owner", [](Inputs& in) { in.st.manual_pause = true; }},
    {"UnpluggedPauses", kRunning, Minutes(5), Minutes(30), kPause, kPaused, "on battery", [](Inputs& in) { in.s.on_ac.Set(false, in.now, "t"); }},

    // --- throttle ---
    {"ThermalFairThrottles", kRunning, Minutes(5), Minutes(30), kThrottle, kRunning, "thermal state fair",
     [](Inputs& in) { in.s.thermal.Set(Thermal::kFair, in.now, "t"); }},
    {"ThermalNominalUnthrottles", kRunning, Minutes(5), Minutes(30), kUnthrottle, kRunning, "nominal", [](Inputs& in) { in.st.throttled = true; }},

    // --- resume ---
    {"ResumesAfterFiveMinutesIdle", kPaused, Seconds(30), Minutes(5), kResume, kRunning, "owner away again"},
    {"ResumeWaitsForFiveMinutesIdle", kPaused, Seconds(30), Minutes(4), kNone, kPaused, "needs 5m idle"},
    {"ResumeWaitsTenSecondsPaused", kPaused, Seconds(9), Minutes(30), kNone, kPaused, "paused 9s ago"},
    {"ResumeNeedsStartConditions", kPaused, Seconds(30), Minutes(30), kNone, kPaused, "30 % of the CPU",
     [](Inputs& in) { in.s.other_cpu.Set(0.3, in.now, "t"); }},
    {"ManualPauseBlocksResume", kPaused, Seconds(30), Minutes(30), kNone, kPaused, "paused by the owner",
     [](Inputs& in) { in.st.manual_pause = true; }},
    {"ReleasedResumes", kReleased, Minutes(2), Minutes(6), kResume, kRunning, "owner away again"},

    // --- release ---
    {"ReleasesAfterSixtySecondsPaused", kPaused, Seconds(60), Seconds(2), kRelease, kReleased, "paused for 1m"},
    {"KeepsMemoryBeforeSixtySeconds", kPaused, Seconds(59), Seconds(2), kNone, kPaused, "owner active"},
    {"MemoryWarnReleasesAPausedRunner", kPaused, Seconds(20), Seconds(2), kRelease, kReleased, "memory pressure warn",
     [](Inputs& in) { in.s.memory.Set(MemoryPressure::kWarn, in.now, "t"); }},
    {"MemoryWarnReleasesARunningRunner", kRunning, Minutes(5), Minutes(30), kRelease, kReleased, "memory pressure warn",
     [](Inputs& in) { in.s.memory.Set(MemoryPressure::kWarn, in.now, "t"); }},

    // --- stop ---
    {"StopsAfterTenMinutesPaused", kReleased, Minutes(10), Seconds(2), kStop, kStopping, "paused for 10m"},
    {"KeepsTasksBeforeTenMinutes", kReleased, Minutes(9), Seconds(2), kNone, kReleased, "owner active"},
    {"LargeTaskStopsAfterTwoMinutes", kPaused, Minutes(2), Seconds(2), kStop, kStopping, "large share of memory",
     [](Inputs& in) { in.st.memory_share = 0.3; }},
    {"NothingToStopWithoutWork", kReleased, Minutes(20), Seconds(2), kNone, kReleased, "owner active", [](Inputs& in) { in.st.holds_work = false; }},
    {"ThermalCriticalStops", kRunning, Minutes(5), Minutes(30), kStop, kStopping, "thermal state critical",
     [](Inputs& in) { in.s.thermal.Set(Thermal::kCritical, in.now, "t"); }},
    {"MemoryCriticalStops", kPaused, Seconds(5), Minutes(30), kStop, kStopping, "memory pressure critical",
     [](Inputs& in) { in.s.memory.Set(MemoryPressure::kCritical, in.now, "t"); }},
    {"BatteryUnderFiftyStops", kRunning, Minutes(5), Minutes(30), kStop, kStopping, "battery at 49 %",
     [](Inputs& in) { in.config.allow_battery = true; in.s.on_ac.Set(false, in.now, "t"); in.s.battery_percent.Set(49, in.now, "t"); }},
    {"BatteryAtFiftyKeepsRunning", kRunning, Minutes(5), Minutes(30), kNone, kRunning, "owner away",
     [](Inputs& in) { in.config.allow_battery = true; in.s.on_ac.Set(false, in.now, "t"); in.s.battery_percent.Set(50, in.now, "t"); }},
    {"MemoryShareOverLimitStops", kRunning, Minutes(5), Minutes(30), kStop, kStopping, "60 % of memory",
     [](Inputs& in) { in.config.max_memory_share = 0.5; in.st.memory_share = 0.6; }},

    // --- kill ---
    {"KillsWhenStopNotAcknowledgedIn30s", kStopping, Seconds(30), Seconds(2), kKill, kStopping, "not acknowledged in 30s"},
    {"WaitsForTheStopBefore30s", kStopping, Seconds(29), Seconds(2), kNone, kStopping, "handing the work back"},
    {"StoppedWaitsWithBackoff", kStopping, Seconds(3), Seconds(2), kNone, kWaiting, "restart backoff 5m",
     [](Inputs& in) { in.st.holds_work = false; in.st.backoff = Minutes(5); }},
};

INSTANTIATE_TEST_SUITE_P(Rules, PolicyTable, ::testing::ValuesIn(kRows),
                         [](const ::testing::TestParamInfo<Row>& info) { return std::string(info.param.name); });

// Sequences that need several decisions: hysteresis timers and restart backoff.

TEST(Policy, OtherGpuHysteresisCountsFromTheFirstHighSample) {
  testing::FakeClock clock;
  PolicyConfig config;
  PolicyState st = InPhase(Phase::kRunning, clock.Now());
  clock.Advance(Minutes(20));
  for (int i = 0; i < 5; ++i) {
    Snapshot s = Away(clock.Now(), Minutes(30));
    s.other_gpu.Set(0.5, clock.Now(), "t");
    Decision d = Decide(config, s, st, clock.Now());
    ASSERT_EQ(d.action, Action::kNone) << "second " << i << ": " << d.reason;
    st = d.next;
    clock.Advance(Seconds(1));
  }
  Snapshot s = Away(clock.Now(), Minutes(30));
  s.other_gpu.Set(0.5, clock.Now(), "t");
  EXPECT_EQ(Decide(config, s, st, clock.Now()).action, Action::kPause);
}

TEST(Policy, BackoffDoublesUpToTheCapAndResetsAfterAnHourOfCleanRunning) {
  testing::FakeClock clock;
  PolicyConfig config;
  PolicyState st;
  std::vector<absl::Duration> backoffs;
  for (int i = 0; i < 6; ++i) {
    st.phase = Phase::kRunning;
    st.phase_since = st.running_since = clock.Now();
    st.holds_work = true;
    clock.Advance(Minutes(1));
    Snapshot s = Away(clock.Now(), Minutes(30));
    s.thermal.Set(Thermal::kCritical, clock.Now(), "t");
    Decision d = Decide(config, s, st, clock.Now());
    ASSERT_EQ(d.action, Action::kStop);
    backoffs.push_back(d.next.backoff);
    st = d.next;
  }
  EXPECT_EQ(backoffs, (std::vector<absl::Duration>{Minutes(5), Minutes(10), Minutes(20), Minutes(40), Minutes(60),
                                                   Minutes(60)}));
  // An hour of clean running forgets them.
  st.phase = Phase::kRunning;
  st.phase_since = st.running_since = clock.Now();
  clock.Advance(Hours(1));
  Decision d = Decide(config, Away(clock.Now(), Minutes(90)), st, clock.Now());
  EXPECT_EQ(d.next.backoff, absl::ZeroDuration());
}

TEST(Policy, StartAfterBackoffEnds) {
  testing::FakeClock clock;
  PolicyConfig config;
  PolicyState st;
  st.backoff = Minutes(5);
  st.backoff_until = clock.Now() + Minutes(5);
  EXPECT_EQ(Decide(config, Away(clock.Now(), Minutes(30)), st, clock.Now()).action, Action::kNone);
  clock.Advance(Minutes(5));
  EXPECT_EQ(Decide(config, Away(clock.Now(), Minutes(35)), st, clock.Now()).action, Action::kStart);
}

TEST(Policy, EveryPauseStartsThePauseClock) {
  testing::FakeClock clock;
  PolicyConfig config;
  PolicyState st = InPhase(Phase::kRunning, clock.Now());
  st.manual_pause = true;
  clock.Advance(Minutes(20));
  Decision d = Decide(config, Away(clock.Now(), Minutes(30)), st, clock.Now());
  ASSERT_EQ(d.action, Action::kPause);
  EXPECT_EQ(d.next.paused_since, clock.Now());
  clock.Advance(Minutes(1));
  EXPECT_EQ(Decide(config, Away(clock.Now(), Minutes(31)), d.next, clock.Now()).action, Action::kRelease)
      << "released after 60 s, not stopped as if paused forever";
}

TEST(Policy, KillRepeatsAfterAnotherGrace) {
  testing::FakeClock clock;
  PolicyConfig config;
  PolicyState st = InPhase(Phase::kStopping, clock.Now());
  clock.Advance(Seconds(30));
  Decision d = Decide(config, Away(clock.Now(), Seconds(1)), st, clock.Now());
  ASSERT_EQ(d.action, Action::kKill);
  clock.Advance(Seconds(10));
  EXPECT_EQ(Decide(config, Away(clock.Now(), Seconds(1)), d.next, clock.Now()).action, Action::kNone);
  clock.Advance(Seconds(20));
  EXPECT_EQ(Decide(config, Away(clock.Now(), Seconds(1)), d.next, clock.Now()).action, Action::kKill);
}

TEST(Policy, ValidateNamesTheSetting) {
  PolicyConfig config;
  config.pause_other_cpu = 1.5;
  EXPECT_NE(config.Validate().message().find("pause_other_cpu"), std::string::npos);
  config = PolicyConfig();
  config.hours = {{25, 3}};
  EXPECT_NE(config.Validate().message().find("hours"), std::string::npos);
  config = PolicyConfig();
  config.battery_stop_percent = 90;
  EXPECT_FALSE(config.Validate().ok());
}

TEST(Policy, FleetStates) {
  EXPECT_STREQ(FleetState(Phase::kRunning, true), "busy");
  EXPECT_STREQ(FleetState(Phase::kRunning, false), "available");
  EXPECT_STREQ(FleetState(Phase::kPaused, true), "owner_active");
  EXPECT_STREQ(FleetState(Phase::kWaiting, false), "owner_active");
}

}  // namespace
}  // namespace minions::availability
