// The Linux probes on fixture trees: each test writes the /proc and /sys files a kernel would,
// under a temporary root, and checks the signals the probe reads from them.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "availability/linux_probes.h"
#include "availability/nvml_probe.h"
#include "testing/fake_clock.h"

namespace minions::availability {
namespace {

namespace fs = std::filesystem;

class FixtureRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (fs::temp_directory_path() / absl::StrCat("minions-probes-", getpid(), "-",
                                                      ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& rel, const std::string& content) {
    fs::path p = fs::path(root_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::trunc) << content;
  }
  // The first reading of `probe`, into an empty snapshot.
  Snapshot FillOnce(Probe& probe) {
    Snapshot s;
    probe.Fill(&s, clock_.Now());
    return s;
  }
  Snapshot FillOnce(Probe&& probe) { return FillOnce(probe); }
  std::string root_;
  testing::FakeClock clock_;
};

std::string ProcStat(int pid, int ppid, int64_t utime, int64_t stime) {
  // pid (comm with spaces) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
  return absl::StrCat(pid, " (a (weird) name) S ", ppid, " 1 1 0 -1 0 0 0 0 0 ", utime, " ", stime, " 0 0 20 0 1 0\n");
}

TEST_F(FixtureRoot, CpuOfOtherProcessesExcludesOurTree) {
  int me = 4242;
  Write("proc/stat", "cpu  1000 0 1000 8000 0 0 0 0 0 0\ncpu0 1 2 3 4\n");
  Write("proc/4242/stat", ProcStat(me, 1, 100, 0));
  Write("proc/4300/stat", ProcStat(4300, me, 100, 0));   // our runner
  Write("proc/4400/stat", ProcStat(4400, 4300, 0, 0));   // its child
  Write("proc/999/stat", ProcStat(999, 1, 500, 0));      // someone else
  ProcCpuProbe probe(root_, me);
  Snapshot s = FillOnce(probe);
  EXPECT_FALSE(s.other_cpu.known()) << "the first sample is only a baseline";
  // 1000 more ticks: 600 busy, of which ours 100 + 150 + 50.
  Write("proc/stat", "cpu  1400 0 1200 8400 0 0 0 0 0 0\n");
  Write("proc/4242/stat", ProcStat(me, 1, 150, 50));
  Write("proc/4300/stat", ProcStat(4300, me, 250, 0));
  Write("proc/4400/stat", ProcStat(4400, 4300, 50, 0));
  Write("proc/999/stat", ProcStat(999, 1, 800, 0));
  clock_.Advance(absl::Seconds(5));
  probe.Fill(&s, clock_.Now());
  ASSERT_TRUE(s.other_cpu.known());
  EXPECT_NEAR(*s.other_cpu.value, 0.3, 1e-9);
  EXPECT_EQ(s.other_cpu.at, clock_.Now());
}

TEST_F(FixtureRoot, CpuWithOurPidsGiven) {
  // The executor names its processes (itself and its runner): no scan of every process.
  Write("proc/stat", "cpu  0 0 0 1000 0 0 0 0 0 0\n");
  Write("proc/10/stat", ProcStat(10, 1, 0, 0));
  Write("proc/20/stat", ProcStat(20, 10, 0, 0));
  ProcCpuProbe probe(root_, 10, [] { return std::vector<int>{10, 20, 0}; });
  Snapshot s;
  probe.Fill(&s, clock_.Now());
  Write("proc/stat", "cpu  500 0 0 1500 0 0 0 0 0 0\n");
  Write("proc/20/stat", ProcStat(20, 10, 400, 0));
  probe.Fill(&s, clock_.Now());
  ASSERT_TRUE(s.other_cpu.known());
  EXPECT_NEAR(*s.other_cpu.value, 0.1, 1e-9);
}

TEST_F(FixtureRoot, CpuUnreadableIsUnknown) {
  ProcCpuProbe probe(root_, 1);
  Snapshot s;
  s.other_cpu.Set(0.1, clock_.Now(), "old");
  probe.Fill(&s, clock_.Now());
  EXPECT_FALSE(s.other_cpu.known());
}

TEST_F(FixtureRoot, LaptopOnBatteryIgnoresDeviceBatteries) {
  Write("sys/class/power_supply/AC/type", "Mains\n");
  Write("sys/class/power_supply/AC/online", "0\n");
  Write("sys/class/power_supply/BAT0/type", "Battery\n");
  Write("sys/class/power_supply/BAT0/capacity", "64\n");
  Write("sys/class/power_supply/BAT0/status", "Discharging\n");
  Write("sys/class/power_supply/hidpp_battery_0/type", "Battery\n");
  Write("sys/class/power_supply/hidpp_battery_0/scope", "Device\n");
  Write("sys/class/power_supply/hidpp_battery_0/capacity", "100\n");
  PowerSupplyProbe probe(root_);
  Snapshot s = FillOnce(probe);
  ASSERT_TRUE(s.on_ac.known());
  EXPECT_FALSE(*s.on_ac.value);
  EXPECT_EQ(*s.battery_percent.value, 64);
  Write("sys/class/power_supply/AC/online", "1\n");
  Write("sys/class/power_supply/BAT0/status", "Charging\n");
  probe.Fill(&s, clock_.Now());
  EXPECT_TRUE(*s.on_ac.value);
}

TEST_F(FixtureRoot, DesktopWithUpsIsOnAc) {
  Write("sys/class/power_supply/ups/type", "UPS\n");
  Write("sys/class/power_supply/ups/online", "0\n");
  Snapshot s = FillOnce(PowerSupplyProbe(root_));
  ASSERT_TRUE(s.on_ac.known());
  EXPECT_TRUE(*s.on_ac.value);
  EXPECT_FALSE(s.battery_percent.known());
}

TEST_F(FixtureRoot, PowerUnreadableIsUnknown) {
  Snapshot s = FillOnce(PowerSupplyProbe(root_ + "/nowhere"));
  EXPECT_FALSE(s.on_ac.known());
}

TEST_F(FixtureRoot, ThermalAgainstTripPoints) {
  Write("sys/class/thermal/thermal_zone0/temp", "45000\n");
  Write("sys/class/thermal/thermal_zone0/trip_point_0_type", "passive\n");
  Write("sys/class/thermal/thermal_zone0/trip_point_0_temp", "85000\n");
  Write("sys/class/thermal/thermal_zone0/trip_point_1_type", "hot\n");
  Write("sys/class/thermal/thermal_zone0/trip_point_1_temp", "95000\n");
  Write("sys/class/thermal/thermal_zone0/trip_point_2_type", "critical\n");
  Write("sys/class/thermal/thermal_zone0/trip_point_2_temp", "105000\n");
  Write("sys/class/thermal/cooling_device0/type", "Processor\n");
  ThermalZoneProbe probe(root_);
  Snapshot s;
  for (auto [temp, want] : {std::pair{"45000", Thermal::kNominal}, {"86000", Thermal::kFair},
                            {"96000", Thermal::kSerious}, {"105000", Thermal::kCritical}}) {
    Write("sys/class/thermal/thermal_zone0/temp", temp);
    probe.Fill(&s, clock_.Now());
    ASSERT_TRUE(s.thermal.known());
    EXPECT_EQ(ThermalName(*s.thermal.value), std::string(ThermalName(want))) << temp;
  }
}

TEST_F(FixtureRoot, ThermalHottestZoneWinsAndDefaultsWithoutTrips) {
  Write("sys/class/thermal/thermal_zone0/temp", "40000\n");
  Write("sys/class/thermal/thermal_zone1/temp", "92000\n");  // no trip points: 80/90/100 C
  Snapshot s = FillOnce(ThermalZoneProbe(root_));
  EXPECT_EQ(*s.thermal.value, Thermal::kSerious);
  EXPECT_NE(s.thermal.source.find("thermal_zone1"), std::string::npos) << s.thermal.source;
}

TEST_F(FixtureRoot, NoThermalZonesIsNominalAndUnreadableIsUnknown) {
  fs::create_directories(root_ + "/sys/class/thermal");
  Snapshot s = FillOnce(ThermalZoneProbe(root_));
  EXPECT_EQ(*s.thermal.value, Thermal::kNominal);
  ThermalZoneProbe missing(root_ + "/nowhere");
  missing.Fill(&s, clock_.Now());
  EXPECT_FALSE(s.thermal.known());
}

TEST_F(FixtureRoot, MemoryPressureFromMeminfoAndPsi) {
  // Each step writes /proc/meminfo and, where given, /proc/pressure/memory, then reads again.
  struct Step {
    const char* meminfo;
    const char* psi;
    MemoryPressure want;
  };
  const std::string plenty = "MemTotal:       1000000 kB\nMemAvailable:    500000 kB\n";
  auto psi = [](const char* full_avg10) {
    return absl::StrCat("some avg10=25.00 avg60=1.00 avg300=0.00 total=1\nfull avg10=", full_avg10,
                        " avg60=0 avg300=0 total=1\n");
  };
  const std::string psi_warn = psi("2.00"), psi_critical = psi("12.00");
  MemoryProbe probe(root_);
  Snapshot s;
  for (const Step& step : {Step{"MemTotal:       1000000 kB\nMemFree:  1000 kB\nMemAvailable:    500000 kB\n", nullptr,
                                MemoryPressure::kNormal},
                           Step{"MemTotal:       1000000 kB\nMemAvailable:    80000 kB\n", nullptr, MemoryPressure::kWarn},
                           Step{"MemTotal:       1000000 kB\nMemAvailable:    40000 kB\n", nullptr, MemoryPressure::kCritical},
                           Step{plenty.c_str(), psi_warn.c_str(), MemoryPressure::kWarn},
                           Step{plenty.c_str(), psi_critical.c_str(), MemoryPressure::kCritical}}) {
    Write("proc/meminfo", step.meminfo);
    if (step.psi != nullptr) Write("proc/pressure/memory", step.psi);
    probe.Fill(&s, clock_.Now());
    EXPECT_EQ(*s.memory.value, step.want) << step.meminfo << (step.psi ? step.psi : "");
  }
  EXPECT_EQ(MemTotalBytes(root_), 1000000 * 1024LL);
}

TEST_F(FixtureRoot, InputDeviceActivity) {
  fs::create_directories(root_ + "/dev/input");
  std::string device = root_ + "/dev/input/event3";
  ASSERT_EQ(mkfifo(device.c_str(), 0600), 0);
  InputDeviceProbe probe(root_);
  Snapshot s;
  absl::Time started = clock_.Now();
  probe.Fill(&s, started);
  ASSERT_TRUE(s.last_input.known());
  EXPECT_EQ(*s.last_input.value, started) << "no event yet: counts from when watching began";
  int writer = open(device.c_str(), O_WRONLY | O_NONBLOCK);
  ASSERT_GE(writer, 0);
  clock_.Advance(absl::Seconds(7));
  probe.Fill(&s, clock_.Now());
  EXPECT_EQ(*s.last_input.value, started) << "no event in 7 s";
  char event[24] = {1};
  ASSERT_EQ(write(writer, event, sizeof event), 24);
  clock_.Advance(absl::Seconds(1));
  probe.Fill(&s, clock_.Now());
  EXPECT_EQ(*s.last_input.value, clock_.Now());
  close(writer);
}

// Where logind answers for a console session, no input device is opened (the executor needs no
// `input` group there); when it stops answering, the devices are watched again.
TEST_F(FixtureRoot, InputDevicesAreLeftAloneWhileLogindAnswers) {
  fs::create_directories(root_ + "/dev/input");
  std::string device = root_ + "/dev/input/event3";
  ASSERT_EQ(mkfifo(device.c_str(), 0600), 0);
  InputDeviceProbe probe(root_, /*defer_to_logind=*/true);
  Snapshot s;
  s.console_user.Set(true, clock_.Now(), "logind");
  s.last_input.Set(clock_.Now() - absl::Minutes(20), clock_.Now(), "logind");
  probe.Fill(&s, clock_.Now());
  // A FIFO opened for writing without blocking fails with ENXIO unless someone has it open to read.
  EXPECT_LT(open(device.c_str(), O_WRONLY | O_NONBLOCK), 0) << "the probe opened the device";
  EXPECT_EQ(errno, ENXIO);
  EXPECT_EQ(s.last_input.source, "logind");
  EXPECT_EQ(*s.last_input.value, clock_.Now() - absl::Minutes(20));
  // logind goes away: the device is watched.
  s.console_user = {};
  clock_.Advance(absl::Seconds(1));
  probe.Fill(&s, clock_.Now());
  int writer = open(device.c_str(), O_WRONLY | O_NONBLOCK);
  EXPECT_GE(writer, 0) << "the probe did not open the device";
  if (writer >= 0) close(writer);
}

TEST_F(FixtureRoot, NoInputDevicesIsUnknown) {
  Snapshot s = FillOnce(InputDeviceProbe(root_));
  EXPECT_FALSE(s.last_input.known());
}

TEST_F(FixtureRoot, ProtectedApps) {
  Write("proc/100/comm", "bash\n");
  Write("proc/200/comm", "zoom\n");
  Snapshot s;
  ProtectedAppProbe({root_, {"obs", "zoom"}}).Fill(&s, clock_.Now());
  EXPECT_EQ(*s.protected_app.value, "zoom");
  ProtectedAppProbe({root_, {"obs"}}).Fill(&s, clock_.Now());
  EXPECT_EQ(*s.protected_app.value, "");
}

TEST_F(FixtureRoot, NvmlAbsentWithoutDeviceMeansNoGpu) {
  Snapshot s = FillOnce(NvmlProbe(root_, "libnvidia-ml-missing.so.1"));
  ASSERT_TRUE(s.gpu_count.known());
  EXPECT_EQ(*s.gpu_count.value, 0);
}

TEST_F(FixtureRoot, NvmlAbsentWithADeviceIsUnknown) {
  Write("dev/nvidia0", "");
  Snapshot s = FillOnce(NvmlProbe(root_, "libnvidia-ml-missing.so.1"));
  EXPECT_FALSE(s.gpu_count.known());
  EXPECT_NE(s.gpu_count.source.find("cannot be used"), std::string::npos);
}

TEST_F(FixtureRoot, ProcessRss) {
  Write("proc/77/status", "Name:\tx\nVmRSS:\t  2048 kB\n");
  EXPECT_EQ(ProcessRssBytes(root_, 77), 2048 * 1024);
  EXPECT_EQ(ProcessRssBytes(root_, 78), 0);
}

}  // namespace
}  // namespace minions::availability
