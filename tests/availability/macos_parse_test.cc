// The macOS probes' interpretation, on output captured from macOS (ioreg, pmset, and
// CoreFoundation dictionaries as the adapter converts them to JSON).

#include "availability/macos_parse.h"

#include <gtest/gtest.h>

#include "testing/read_file.h"

namespace minions::availability::macos {
namespace {

std::string Fixture(const std::string& name) {
  return testing::ReadExistingFile(std::string(MINIONS_AVAILABILITY_FIXTURES) + "/macos/" + name);
}

TEST(MacosParse, HidIdleTimeFromIoreg) {
  Json props = ParseIoregProperties(Fixture("ioreg-hidsystem.txt"));
  auto idle = HidIdleTime(props);
  ASSERT_TRUE(idle.has_value());
  EXPECT_EQ(*idle, absl::Nanoseconds(184021543250));
  EXPECT_EQ(JsonField(JsonField(props, "HIDParameters"), "HIDClickSpace")["x"], 4);
  EXPECT_FALSE(HidIdleTime(Json::object()).has_value());
}

TEST(MacosParse, ConsoleUserAndLock) {
  Json props = ParseIoregProperties(Fixture("ioreg-root.txt"));
  ConsoleState state = ReadConsoleUsers(JsonField(props, "IOConsoleUsers"));
  EXPECT_TRUE(state.console_user);
  EXPECT_TRUE(state.locked);
  EXPECT_EQ(JsonString(JsonField(props, "IOConsoleUsers")[0], "kCGSSessionUserNameKey"), "alice");
  ConsoleState none = ReadConsoleUsers(Json::array());
  EXPECT_FALSE(none.console_user);
}

TEST(MacosParse, AcceleratorUtilization) {
  Json props = ParseIoregProperties(Fixture("ioreg-accelerator.txt"));
  auto util = AcceleratorUtilization(JsonField(props, "PerformanceStatistics"));
  ASSERT_TRUE(util.has_value());
  EXPECT_DOUBLE_EQ(*util, 0.37);
  EXPECT_EQ(JsonInt(props, "gpu-core-count"), 10);
}

TEST(MacosParse, IoregValueErrorsSayWhere) {
  auto bad = ParseIoregValue("{\"a\"=1,\"b\"");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("offset"), std::string::npos);
  EXPECT_EQ(*ParseIoregValue("(1,\"x\",Yes,<0a0b>)"), Json::parse(R"([1,"x",true,"0a0b"])"));
}

TEST(MacosParse, PmsetBatt) {
  auto battery = ParsePmsetBatt(Fixture("pmset-batt-battery.txt"));
  ASSERT_TRUE(battery.ok());
  EXPECT_FALSE(battery->on_ac);
  EXPECT_EQ(battery->battery_percent, 64);
  auto ac = ParsePmsetBatt(Fixture("pmset-batt-ac.txt"));
  EXPECT_TRUE(ac->on_ac);
  EXPECT_EQ(ac->battery_percent, 97);
  auto ups = ParsePmsetBatt(Fixture("pmset-batt-ups.txt"));
  EXPECT_TRUE(ups->on_ac) << "a desktop on its UPS is not on battery";
  EXPECT_FALSE(ups->battery_percent.has_value());
  EXPECT_FALSE(ParsePmsetBatt("garbage").ok());
}

TEST(MacosParse, PowerSourceDictionariesCountOnlyTheInternalBattery) {
  Json sources = Json::parse(Fixture("power-sources.json"));
  PowerState state = ReadPowerSources(sources);
  EXPECT_FALSE(state.on_ac);
  EXPECT_EQ(state.battery_percent, 64);
  PowerState ups_only = ReadPowerSources(Json::array({sources[1]}));
  EXPECT_TRUE(ups_only.on_ac);
}

TEST(MacosParse, DisplaySleepAssertionsOfOthers) {
  std::string text = Fixture("pmset-assertions.txt");
  EXPECT_TRUE(ParsePmsetAssertionsPreventDisplaySleep(text, 4242));
  EXPECT_FALSE(ParsePmsetAssertionsPreventDisplaySleep(text, 412)) << "our own assertion never counts";
  Json by_process = Json::parse(Fixture("assertions-by-process.json"));
  EXPECT_TRUE(OthersPreventDisplaySleep(by_process, 4242));
  EXPECT_FALSE(OthersPreventDisplaySleep(by_process, 412));
}

TEST(MacosParse, PressureLevels) {
  EXPECT_EQ(ThermalFromPressureLevel(0), Thermal::kNominal);
  EXPECT_EQ(ThermalFromPressureLevel(1), Thermal::kFair);
  EXPECT_EQ(ThermalFromPressureLevel(2), Thermal::kSerious);
  EXPECT_EQ(ThermalFromPressureLevel(4), Thermal::kCritical);
  EXPECT_EQ(MemoryFromPressureLevel(1), MemoryPressure::kNormal);
  EXPECT_EQ(MemoryFromPressureLevel(2), MemoryPressure::kWarn);
  EXPECT_EQ(MemoryFromPressureLevel(4), MemoryPressure::kCritical);
  EXPECT_FALSE(MemoryFromPressureLevel(3).has_value());
}

}  // namespace
}  // namespace minions::availability::macos
