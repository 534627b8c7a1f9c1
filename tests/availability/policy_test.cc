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

struct Row {
  const char* name;
  // Builds the inputs at `now` (the fake clock's time).
  std::function<void(absl::Time now, PolicyConfig&, Snapshot&, PolicyState&)> setup;
  Action action;
  Phase phase;
  const char* reason;  // a substring of the reason
};

class PolicyTable : public ::testing::TestWithParam<Row> {};

TEST_P(PolicyTable, Decides) {
  const Row& row = GetParam();
  testing::FakeClock clock;
  absl::Time now = clock.Now();
  PolicyConfig config;
  config.time_zone = absl::UTCTimeZone();
  Snapshot s;
  PolicyState st;
  row.setup(now, config, s, st);
  ASSERT_TRUE(config.Validate().ok()) << config.Validate();
  Decision d = Decide(config, s, st, now);
  EXPECT_EQ(ActionName(d.action), std::string(ActionName(row.action))) << d.reason;
  EXPECT_EQ(PhaseName(d.next.phase), std::string(PhaseName(row.phase))) << d.reason;
  EXPECT_NE(d.reason.find(row.reason), std::string::npos) << "reason: " << d.reason;
}

const Row kRows[] = {
    // --- start ---
    {"StartsAfterTenMinutesIdle", [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) { s = Away(n, Minutes(10)); },
     Action::kStart, Phase::kRunning, "owner away"},
    {"WaitsBeforeTenMinutes", [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) { s = Away(n, Minutes(9)); },
     Action::kNone, Phase::kWaiting, "needs 10m idle"},
    {"StartsAfterTwoMinutesWhenLocked",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) {
       s = Away(n, Minutes(2));
       s.screen_locked.Set(true, n, "t");
     },
     Action::kStart, Phase::kRunning, "locked"},
    {"StartsAfterTwoMinutesWhenDisplayAsleep",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) {
       s = Away(n, Minutes(2));
       s.display_asleep.Set(true, n, "t");
     },
     Action::kStart, Phase::kRunning, "owner away"},
    {"NoConsoleUserNeedsNoInputSignal",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) {
       s = Away(n, Minutes(1));
       s.last_input = {};
       s.media_playing = {};
       s.console_user.Set(false, n, "t");
     },
     Action::kStart, Phase::kRunning, "no console user"},
    {"NoConsoleUserStillHonoursReportedActivity",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) {
       s = Away(n, Minutes(30));
       s.last_input = {};
       s.console_user.Set(false, n, "t");
       s.owner_activity.Set(n - Minutes(1), n, "t");
     },
     Action::kNone, Phase::kWaiting, "needs 2m idle"},
    {"UnknownInputFailsClosed",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) {
       s = Away(n, Minutes(30));
       s.last_input = {};
     },
     Action::kNone, Phase::kWaiting, "input idle time unknown"},
    {"UnknownConsoleCountsAsPresent",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) {
       s = Away(n, Minutes(30));
       s.console_user = {};
       s.last_input = {};
     },
     Action::kNone, Phase::kWaiting, "input idle time unknown"},
    {"UnknownPowerFailsClosed", [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) { s = Away(n, Minutes(30)); s.on_ac = {}; },
     Action::kNone, Phase::kWaiting, "power source unknown"},
    {"UnknownThermalFailsClosed", [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) { s = Away(n, Minutes(30)); s.thermal = {}; },
     Action::kNone, Phase::kWaiting, "thermal state unknown"},
    {"UnknownMemoryFailsClosed", [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) { s = Away(n, Minutes(30)); s.memory = {}; },
     Action::kNone, Phase::kWaiting, "memory pressure unknown"},
    {"UnknownCpuFailsClosed", [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) { s = Away(n, Minutes(30)); s.other_cpu = {}; },
     Action::kNone, Phase::kWaiting, "CPU use of other processes unknown"},
    {"UnknownGpusFailClosed", [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) { s = Away(n, Minutes(30)); s.gpu_count = {}; },
     Action::kNone, Phase::kWaiting, "GPUs unknown"},
    {"UnknownGpuUseFailsClosed", [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) { s = Away(n, Minutes(30)); s.other_gpu = {}; },
     Action::kNone, Phase::kWaiting, "GPU use of other processes unknown"},
    {"NoGpuNeedsNoGpuSignal",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) {
       s = Away(n, Minutes(30));
       s.gpu_count.Set(0, n, "t");
       s.other_gpu = {};
     },
     Action::kStart, Phase::kRunning, "owner away"},
    {"UnknownMediaFailsClosed", [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) { s = Away(n, Minutes(30)); s.media_playing = {}; },
     Action::kNone, Phase::kWaiting, "video and call activity unknown"},
    {"DedicatedIgnoresUnknowns",
     [](absl::Time n, PolicyConfig& c, Snapshot& s, PolicyState&) {
       c.dedicated = true;
       s = Snapshot();
     },
     Action::kStart, Phase::kRunning, "owner away"},
    {"DedicatedStillHonoursReportedActivity",
     [](absl::Time n, PolicyConfig& c, Snapshot& s, PolicyState&) {
       c.dedicated = true;
       s = Snapshot();
       s.owner_activity.Set(n - Seconds(5), n, "t");
     },
     Action::kNone, Phase::kWaiting, "owner active 5s ago"},
    {"NeedsAcPower", [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) { s = Away(n, Minutes(30)); s.on_ac.Set(false, n, "t"); s.battery_percent.Set(100, n, "t"); },
     Action::kNone, Phase::kWaiting, "on battery"},
    {"BatteryAllowedStartsAtEightyPercent",
     [](absl::Time n, PolicyConfig& c, Snapshot& s, PolicyState&) {
       c.allow_battery = true;
       s = Away(n, Minutes(30));
       s.on_ac.Set(false, n, "t");
       s.battery_percent.Set(80, n, "t");
     },
     Action::kStart, Phase::kRunning, "owner away"},
    {"BatteryAllowedWaitsBelowEightyPercent",
     [](absl::Time n, PolicyConfig& c, Snapshot& s, PolicyState&) {
       c.allow_battery = true;
       s = Away(n, Minutes(30));
       s.on_ac.Set(false, n, "t");
       s.battery_percent.Set(79, n, "t");
     },
     Action::kNone, Phase::kWaiting, "starts at 80 %"},
    {"LowPowerModeBlocks", [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) { s = Away(n, Minutes(30)); s.low_power_mode.Set(true, n, "t"); },
     Action::kNone, Phase::kWaiting, "Low Power Mode"},
    {"StartNeedsThermalNominal", [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) { s = Away(n, Minutes(30)); s.thermal.Set(Thermal::kFair, n, "t"); },
     Action::kNone, Phase::kWaiting, "thermal state fair"},
    {"StartNeedsMemoryNormal", [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) { s = Away(n, Minutes(30)); s.memory.Set(MemoryPressure::kWarn, n, "t"); },
     Action::kNone, Phase::kWaiting, "memory pressure warn"},
    {"StartBlockedByVideo", [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) { s = Away(n, Minutes(30)); s.media_playing.Set(true, n, "t"); },
     Action::kNone, Phase::kWaiting, "video or call"},
    {"StartNeedsOtherCpuUnder25", [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) { s = Away(n, Minutes(30)); s.other_cpu.Set(0.26, n, "t"); },
     Action::kNone, Phase::kWaiting, "26 % of the CPU"},
    {"StartNeedsOtherGpuUnder10", [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState&) { s = Away(n, Minutes(30)); s.other_gpu.Set(0.11, n, "t"); },
     Action::kNone, Phase::kWaiting, "11 % of the GPU"},
    {"ProtectedAppBlocks",
     [](absl::Time n, PolicyConfig& c, Snapshot& s, PolicyState&) {
       c.protected_apps = {"zoom"};
       s = Away(n, Minutes(30));
       s.protected_app.Set("zoom", n, "t");
     },
     Action::kNone, Phase::kWaiting, "zoom is running"},
    {"ProtectedAppsUnknownFailClosed",
     [](absl::Time n, PolicyConfig& c, Snapshot& s, PolicyState&) {
       c.protected_apps = {"zoom"};
       s = Away(n, Minutes(30));
       s.protected_app = {};
     },
     Action::kNone, Phase::kWaiting, "running apps unknown"},
    {"OutsideHoursBlocks",
     [](absl::Time n, PolicyConfig& c, Snapshot& s, PolicyState&) {
       int hour = absl::ToCivilHour(n, absl::UTCTimeZone()).hour();
       c.hours = {{(hour + 1) % 24, (hour + 2) % 24}};
       s = Away(n, Minutes(30));
     },
     Action::kNone, Phase::kWaiting, "outside the allowed hours"},
    {"InsideWrappingHoursStarts",
     [](absl::Time n, PolicyConfig& c, Snapshot& s, PolicyState&) {
       int hour = absl::ToCivilHour(n, absl::UTCTimeZone()).hour();
       c.hours = {{(hour + 23) % 24, (hour + 1) % 24}};
       s = Away(n, Minutes(30));
     },
     Action::kStart, Phase::kRunning, "owner away"},
    {"BackoffDelaysStart",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       s = Away(n, Minutes(30));
       st.backoff = Minutes(5);
       st.backoff_until = n + Minutes(1);
     },
     Action::kNone, Phase::kWaiting, "restart backoff: 1m left"},
    {"ManualPauseBlocksStart",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       s = Away(n, Minutes(30));
       st.manual_pause = true;
     },
     Action::kNone, Phase::kWaiting, "paused by the owner"},

    // --- pause ---
    {"AnyInputPauses",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(5));
       s = Away(n, Seconds(1));
     },
     Action::kPause, Phase::kPaused, "owner active 1s ago"},
    {"ReportedActivityPauses",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(5));
       s = Away(n, Minutes(30));
       s.owner_activity.Set(n, n, "t");
     },
     Action::kPause, Phase::kPaused, "owner active"},
    {"InputBeforeTheStartDoesNotPause",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(5));
       s = Away(n, Minutes(12));
     },
     Action::kNone, Phase::kRunning, "owner away"},
    {"UnlockPauses",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(1));
       st.started_short = true;
       s = Away(n, Minutes(3));  // idle since before the start, but no longer locked
     },
     Action::kPause, Phase::kPaused, "unlocked"},
    {"MediaAssertionPauses",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(5));
       s = Away(n, Minutes(30));
       s.media_playing.Set(true, n, "t");
     },
     Action::kPause, Phase::kPaused, "video or call"},
    {"OtherGpuOver30PercentFor5sPauses",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(5));
       st.other_gpu_high_since = n - Seconds(5);
       s = Away(n, Minutes(30));
       s.other_gpu.Set(0.31, n, "t");
     },
     Action::kPause, Phase::kPaused, "30 % of the GPU for 5s"},
    {"OtherGpuOver30PercentFor4sKeepsRunning",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(5));
       st.other_gpu_high_since = n - Seconds(4);
       s = Away(n, Minutes(30));
       s.other_gpu.Set(0.31, n, "t");
     },
     Action::kNone, Phase::kRunning, "owner away"},
    {"OtherCpuOver50PercentFor2mPauses",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(5));
       st.other_cpu_high_since = n - Minutes(2);
       s = Away(n, Minutes(30));
       s.other_cpu.Set(0.6, n, "t");
     },
     Action::kPause, Phase::kPaused, "50 % of the CPU for 2m"},
    {"OtherCpuDropResetsTheTimer",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(5));
       st.other_cpu_high_since = n - Minutes(3);
       s = Away(n, Minutes(30));
       s.other_cpu.Set(0.4, n, "t");
     },
     Action::kNone, Phase::kRunning, "owner away"},
    {"ThermalSeriousPauses",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(5));
       s = Away(n, Minutes(30));
       s.thermal.Set(Thermal::kSerious, n, "t");
     },
     Action::kPause, Phase::kPaused, "thermal state serious"},
    {"SignalLostWhileRunningPauses",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(5));
       s = Away(n, Minutes(30));
       s.last_input = {};
     },
     Action::kPause, Phase::kPaused, "input idle time unknown"},
    {"ManualPausePauses",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(5));
       st.manual_pause = true;
       s = Away(n, Minutes(30));
     },
     Action::kPause, Phase::kPaused, "paused by the owner"},
    {"UnpluggedPauses",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(5));
       s = Away(n, Minutes(30));
       s.on_ac.Set(false, n, "t");
     },
     Action::kPause, Phase::kPaused, "on battery"},

    // --- throttle ---
    {"ThermalFairThrottles",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(5));
       s = Away(n, Minutes(30));
       s.thermal.Set(Thermal::kFair, n, "t");
     },
     Action::kThrottle, Phase::kRunning, "thermal state fair"},
    {"ThermalNominalUnthrottles",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(5));
       st.throttled = true;
       s = Away(n, Minutes(30));
     },
     Action::kUnthrottle, Phase::kRunning, "nominal"},

    // --- resume ---
    {"ResumesAfterFiveMinutesIdle",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kPaused, n - Seconds(30));
       s = Away(n, Minutes(5));
     },
     Action::kResume, Phase::kRunning, "owner away again"},
    {"ResumeWaitsForFiveMinutesIdle",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kPaused, n - Seconds(30));
       s = Away(n, Minutes(4));
     },
     Action::kNone, Phase::kPaused, "needs 5m idle"},
    {"ResumeWaitsTenSecondsPaused",
     [](absl::Time n, PolicyConfig& c, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kPaused, n - Seconds(9));
       s = Away(n, Minutes(30));
     },
     Action::kNone, Phase::kPaused, "paused 9s ago"},
    {"ResumeNeedsStartConditions",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kPaused, n - Seconds(30));
       s = Away(n, Minutes(30));
       s.other_cpu.Set(0.3, n, "t");
     },
     Action::kNone, Phase::kPaused, "30 % of the CPU"},
    {"ManualPauseBlocksResume",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kPaused, n - Seconds(30));
       st.manual_pause = true;
       s = Away(n, Minutes(30));
     },
     Action::kNone, Phase::kPaused, "paused by the owner"},
    {"ReleasedResumes",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kReleased, n - Minutes(2));
       s = Away(n, Minutes(6));
     },
     Action::kResume, Phase::kRunning, "owner away again"},

    // --- release ---
    {"ReleasesAfterSixtySecondsPaused",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kPaused, n - Seconds(60));
       s = Away(n, Seconds(2));
     },
     Action::kRelease, Phase::kReleased, "paused for 1m"},
    {"KeepsMemoryBeforeSixtySeconds",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kPaused, n - Seconds(59));
       s = Away(n, Seconds(2));
     },
     Action::kNone, Phase::kPaused, "owner active"},
    {"MemoryWarnReleasesAPausedRunner",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kPaused, n - Seconds(20));
       s = Away(n, Seconds(2));
       s.memory.Set(MemoryPressure::kWarn, n, "t");
     },
     Action::kRelease, Phase::kReleased, "memory pressure warn"},
    {"MemoryWarnReleasesARunningRunner",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(5));
       s = Away(n, Minutes(30));
       s.memory.Set(MemoryPressure::kWarn, n, "t");
     },
     Action::kRelease, Phase::kReleased, "memory pressure warn"},

    // --- stop ---
    {"StopsAfterTenMinutesPaused",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kReleased, n - Minutes(10));
       s = Away(n, Seconds(2));
     },
     Action::kStop, Phase::kStopping, "paused for 10m"},
    {"KeepsTasksBeforeTenMinutes",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kReleased, n - Minutes(9));
       s = Away(n, Seconds(2));
     },
     Action::kNone, Phase::kReleased, "owner active"},
    {"LargeTaskStopsAfterTwoMinutes",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kPaused, n - Minutes(2));
       st.memory_share = 0.3;
       s = Away(n, Seconds(2));
     },
     Action::kStop, Phase::kStopping, "large share of memory"},
    {"NothingToStopWithoutWork",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kReleased, n - Minutes(20), /*holds_work=*/false);
       s = Away(n, Seconds(2));
     },
     Action::kNone, Phase::kReleased, "owner active"},
    {"ThermalCriticalStops",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kRunning, n - Minutes(5));
       s = Away(n, Minutes(30));
       s.thermal.Set(Thermal::kCritical, n, "t");
     },
     Action::kStop, Phase::kStopping, "thermal state critical"},
    {"MemoryCriticalStops",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kPaused, n - Seconds(5));
       s = Away(n, Minutes(30));
       s.memory.Set(MemoryPressure::kCritical, n, "t");
     },
     Action::kStop, Phase::kStopping, "memory pressure critical"},
    {"BatteryUnderFiftyStops",
     [](absl::Time n, PolicyConfig& c, Snapshot& s, PolicyState& st) {
       c.allow_battery = true;
       st = InPhase(Phase::kRunning, n - Minutes(5));
       s = Away(n, Minutes(30));
       s.on_ac.Set(false, n, "t");
       s.battery_percent.Set(49, n, "t");
     },
     Action::kStop, Phase::kStopping, "battery at 49 %"},
    {"BatteryAtFiftyKeepsRunning",
     [](absl::Time n, PolicyConfig& c, Snapshot& s, PolicyState& st) {
       c.allow_battery = true;
       st = InPhase(Phase::kRunning, n - Minutes(5));
       s = Away(n, Minutes(30));
       s.on_ac.Set(false, n, "t");
       s.battery_percent.Set(50, n, "t");
     },
     Action::kNone, Phase::kRunning, "owner away"},
    {"MemoryShareOverLimitStops",
     [](absl::Time n, PolicyConfig& c, Snapshot& s, PolicyState& st) {
       c.max_memory_share = 0.5;
       st = InPhase(Phase::kRunning, n - Minutes(5));
       st.memory_share = 0.6;
       s = Away(n, Minutes(30));
     },
     Action::kStop, Phase::kStopping, "60 % of memory"},

    // --- kill ---
    {"KillsWhenStopNotAcknowledgedIn30s",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kStopping, n - Seconds(30));
       s = Away(n, Seconds(2));
     },
     Action::kKill, Phase::kStopping, "not acknowledged in 30s"},
    {"WaitsForTheStopBefore30s",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kStopping, n - Seconds(29));
       s = Away(n, Seconds(2));
     },
     Action::kNone, Phase::kStopping, "handing the work back"},
    {"StoppedWaitsWithBackoff",
     [](absl::Time n, PolicyConfig&, Snapshot& s, PolicyState& st) {
       st = InPhase(Phase::kStopping, n - Seconds(3), /*holds_work=*/false);
       st.backoff = Minutes(5);
       s = Away(n, Seconds(2));
     },
     Action::kNone, Phase::kWaiting, "restart backoff 5m"},
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
