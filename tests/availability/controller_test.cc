// The executor's owner side: the availability controller's modes over a fake clock and a fake
// agent, its settings parser, the control socket, and the service files `minions executor
// install` writes (the copies shipped under deploy/ must be exactly these).

#include "executor/availability_controller.h"

#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "executor/control_channel.h"
#include "executor/owner_controls.h"
#include "testing/fake_clock.h"
#include "testing/read_file.h"

namespace minions {
namespace {

using availability::Phase;

struct FakeAgent : WorkTarget {
  bool holds = true;
  int kills = 0;
  bool HoldsWork() const override { return holds; }
  int RunnerPid() const override { return 0; }
  void KillRunner(const char*) override { ++kills; }
};

AvailabilityOptions Fast() {
  AvailabilityOptions o;
  for (auto [k, v] : {std::pair{"mode", "dedicated"}, {"start_idle", "10s"}, {"resume_idle", "20s"},
                      {"min_paused", "0s"}, {"release_after", "30s"}, {"stop_after", "60s"}, {"kill_after", "5s"},
                      {"backoff_initial", "1m"}}) {
    EXPECT_TRUE(ApplyAvailabilitySetting(k, v, &o).ok()) << k;
  }
  return o;
}

TEST(AvailabilityController, FollowsTheOwnerThroughPauseReleaseStopAndBack) {
  testing::FakeClock clock;
  FakeAgent agent;
  AvailabilityController controller(Fast(), {}, &clock);
  controller.Attach(&agent);
  int changes = 0;
  controller.OnChange([&] { ++changes; });
  controller.Tick();
  EXPECT_EQ(controller.mode(), WorkMode::kRun) << controller.Reason();
  EXPECT_EQ(controller.FleetState(true), "busy");
  EXPECT_EQ(controller.FleetState(false), "available");

  clock.Advance(absl::Seconds(1));
  controller.ReportActivity();  // decides at once
  EXPECT_EQ(controller.mode(), WorkMode::kPause);
  EXPECT_EQ(controller.FleetState(true), "owner_active");
  EXPECT_NE(controller.Reason().find("owner active"), std::string::npos) << controller.Reason();
  EXPECT_EQ(controller.mode_since(), clock.Now());

  // The owner keeps working: released after 30 s, handed back after 60 s.
  clock.Advance(absl::Seconds(30));
  controller.ReportActivity();
  EXPECT_EQ(controller.mode(), WorkMode::kRelease);
  clock.Advance(absl::Seconds(30));
  controller.ReportActivity();
  EXPECT_EQ(controller.mode(), WorkMode::kStop);
  EXPECT_NE(controller.Status().find("stop: paused for 1m"), std::string::npos) << controller.Status();

  clock.Advance(absl::Seconds(5));
  controller.Tick();
  EXPECT_EQ(agent.kills, 1) << "a stop not acknowledged in kill_after kills the runner";
  agent.holds = false;
  controller.Tick();
  EXPECT_EQ(controller.phase(), Phase::kWaiting);
  EXPECT_EQ(controller.mode(), WorkMode::kRelease);
  EXPECT_NE(controller.Reason().find("restart backoff"), std::string::npos) << controller.Reason();

  clock.Advance(absl::Minutes(1));  // the backoff is over and the owner away for over 10 s
  controller.Tick();
  EXPECT_EQ(controller.mode(), WorkMode::kRun) << controller.Reason();
  EXPECT_EQ(changes, 6);  // run, pause, release, stop, waiting (release), run
}

// release_after=0: the owner's activity ends the runner in the same decision as the pause, not at
// the next periodic tick (that wait was most of the release latency minions-bench-availability
// measured; docs/benchmarks.md).
TEST(AvailabilityController, ReleaseAfterZeroReleasesOnTheActivityItself) {
  testing::FakeClock clock;
  FakeAgent agent;
  AvailabilityOptions options = Fast();
  ASSERT_TRUE(ApplyAvailabilitySetting("release_after", "0s", &options).ok());
  AvailabilityController controller(options, {}, &clock);
  controller.Attach(&agent);
  std::vector<WorkMode> seen;
  controller.OnChange([&] { seen.push_back(controller.mode()); });
  controller.Tick();
  ASSERT_EQ(controller.mode(), WorkMode::kRun) << controller.Reason();

  clock.Advance(absl::Seconds(1));
  controller.ReportActivity();  // no Tick(), no time passes
  EXPECT_EQ(controller.mode(), WorkMode::kRelease) << controller.Reason();
  EXPECT_EQ(controller.phase(), Phase::kReleased);
  EXPECT_EQ(controller.mode_since(), clock.Now());
  // Both steps are in the owner's history, and the agent was woken once, for the release.
  std::string status = controller.Status();
  EXPECT_NE(status.find("pause: owner active"), std::string::npos) << status;
  EXPECT_NE(status.find("release: paused for 0s"), std::string::npos) << status;
  EXPECT_EQ(seen, (std::vector<WorkMode>{WorkMode::kRun, WorkMode::kRelease}));

  // stop_after=0 as well: the same activity hands the work back at once.
  FakeAgent agent2;
  ASSERT_TRUE(ApplyAvailabilitySetting("stop_after", "0s", &options).ok());
  AvailabilityController stopping(options, {}, &clock);
  stopping.Attach(&agent2);
  stopping.Tick();
  ASSERT_EQ(stopping.mode(), WorkMode::kRun) << stopping.Reason();
  clock.Advance(absl::Seconds(1));
  stopping.ReportActivity();
  EXPECT_EQ(stopping.mode(), WorkMode::kStop) << stopping.Reason();
}

// Deciding again at once only moves away from running: a pause never becomes a resume within the
// same decision, however short resume_idle and min_paused are.
TEST(AvailabilityController, ChainedDecisionsNeverResumeInTheSameTick) {
  testing::FakeClock clock;
  FakeAgent agent;
  AvailabilityOptions options = Fast();
  ASSERT_TRUE(ApplyAvailabilitySetting("resume_idle", "0s", &options).ok());
  ASSERT_TRUE(ApplyAvailabilitySetting("min_paused", "0s", &options).ok());
  AvailabilityController controller(options, {}, &clock);
  controller.Attach(&agent);
  controller.Tick();
  ASSERT_EQ(controller.mode(), WorkMode::kRun);
  clock.Advance(absl::Seconds(1));
  controller.ReportActivity();
  EXPECT_EQ(controller.mode(), WorkMode::kPause) << controller.Reason();
  EXPECT_EQ(controller.Status().find("resume:"), std::string::npos) << controller.Status();
}

TEST(AvailabilityController, HandControls) {
  testing::FakeClock clock;
  FakeAgent agent;
  AvailabilityController controller(Fast(), {}, &clock);
  controller.Attach(&agent);
  controller.Tick();
  ASSERT_EQ(controller.mode(), WorkMode::kRun);
  EXPECT_NE(controller.HandleCommand("pause\n").find("paused"), std::string::npos);
  EXPECT_EQ(controller.mode(), WorkMode::kPause);
  EXPECT_NE(controller.Reason().find("paused by the owner"), std::string::npos);
  clock.Advance(absl::Seconds(25));
  controller.Tick();
  EXPECT_EQ(controller.mode(), WorkMode::kPause) << "a hand pause holds however idle the machine is";
  controller.HandleCommand("resume");
  EXPECT_EQ(controller.mode(), WorkMode::kRun) << controller.Reason();
  EXPECT_NE(controller.HandleCommand("status").find("phase     running"), std::string::npos);
  EXPECT_EQ(controller.HandleCommand("dance").rfind("error: unknown command 'dance'", 0), 0u);
}

TEST(AvailabilityController, OwnerModeFailsClosedWithoutProbes) {
  testing::FakeClock clock;
  AvailabilityController controller(AvailabilityOptions(), {}, &clock);
  controller.Tick();
  EXPECT_EQ(controller.mode(), WorkMode::kRelease);
  EXPECT_EQ(controller.FleetState(false), "owner_active");
  EXPECT_NE(controller.Reason().find("unknown"), std::string::npos) << controller.Reason();
}

TEST(AvailabilitySettings, ParseAndExplainErrors) {
  AvailabilityOptions o;
  ASSERT_TRUE(ApplyAvailabilitySetting("start_idle", "90s", &o).ok());
  EXPECT_EQ(o.policy.start_idle, absl::Seconds(90));
  ASSERT_TRUE(ApplyAvailabilitySetting("hours", "22-7, 12-13", &o).ok());
  EXPECT_EQ(o.policy.hours, (std::vector<std::pair<int, int>>{{22, 7}, {12, 13}}));
  ASSERT_TRUE(ApplyAvailabilitySetting("protected_apps", "zoom, obs", &o).ok());
  EXPECT_EQ(o.probes.protected_apps, (std::vector<std::string>{"zoom", "obs"}));
  ASSERT_TRUE(ApplyAvailabilitySetting("allow_battery", "yes", &o).ok());
  EXPECT_TRUE(o.policy.allow_battery);
  ASSERT_TRUE(ApplyAvailabilitySetting("mode", "off", &o).ok());
  EXPECT_EQ(o.mode, AvailabilityOptions::Mode::kOff);

  auto bad = ApplyAvailabilitySetting("start_idle", "soon", &o);
  EXPECT_NE(bad.message().find("a duration like 90s"), std::string::npos) << bad;
  bad = ApplyAvailabilitySetting("pause_other_cpu", "2", &o);
  EXPECT_NE(bad.message().find("between 0 and 1"), std::string::npos) << bad;
  bad = ApplyAvailabilitySetting("hours", "late", &o);
  EXPECT_NE(bad.message().find("22-7"), std::string::npos) << bad;
  bad = ApplyAvailabilitySetting("idle", "1m", &o);
  EXPECT_NE(bad.message().find("known: mode, start_idle"), std::string::npos) << bad;
  bad = ApplyAvailabilitySetting("mode", "always", &o);
  EXPECT_NE(bad.message().find("owner, dedicated or off"), std::string::npos) << bad;
}

TEST(ControlChannel, AnswersCommandsAndRefusesASecondOwner) {
  std::string dir = absl::StrCat(std::filesystem::temp_directory_path().string(), "/minions-ctl-", getpid());
  std::filesystem::remove_all(dir);
  std::string path = ControlSocketPath(dir);
  {
    auto channel = ControlChannel::Listen(path, [](const std::string& c) { return "got " + c; });
    ASSERT_TRUE(channel.ok()) << channel.status();
    auto answer = SendControlCommand(path, "status");
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(*answer, "got status\n");
    auto second = ControlChannel::Listen(path, [](const std::string&) { return ""; });
    EXPECT_TRUE(absl::IsAlreadyExists(second.status())) << second.status();
    EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::others_all,
              std::filesystem::perms::none);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  auto gone = SendControlCommand(path, "status");
  EXPECT_TRUE(absl::IsUnavailable(gone.status()));
  EXPECT_NE(gone.status().message().find("--state-dir"), std::string::npos);
  std::filesystem::remove_all(dir);
}

std::string ReadShipped(const std::string& rel) {
  return testing::ReadExistingFile(std::string(MINIONS_SOURCE_DIR) + "/" + rel);
}

TEST(Install, ShippedServiceFilesAreWhatInstallWrites) {
  InstallOptions linux_options;
  linux_options.platform = "linux";
  EXPECT_EQ(*ServiceFile(linux_options), ReadShipped("deploy/linux/minions-executor.service"));
  InstallOptions mac;
  mac.platform = "macos";
  EXPECT_EQ(*ServiceFile(mac), ReadShipped("deploy/macos/com.minions.executor.plist"));
  mac.server = "gpu<&>.internal:7070";
  EXPECT_NE(ServiceFile(mac)->find("<string>gpu&lt;&amp;&gt;.internal:7070</string>"), std::string::npos);
  InstallOptions bad;
  bad.platform = "windows";
  EXPECT_FALSE(ServiceFile(bad).ok());
}

}  // namespace
}  // namespace minions
