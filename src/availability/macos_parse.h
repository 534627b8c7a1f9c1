#pragma once
// The portable half of the macOS probes: turns what macOS reports (IORegistry properties, power
// source dictionaries, power assertions, notify states) into Snapshot signals. The Apple-only
// adapter (macos_probes.cc) converts CoreFoundation values to Json and calls these, so every
// interpretation is tested on Linux with captured fixtures (tests/availability/fixtures/macos).
// The text forms are what `ioreg`, `pmset -g assertions` and `pmset -g batt` print.
//
// Threads: pure functions.

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "availability/snapshot.h"
#include "common/json_util.h"

namespace minions::availability::macos {

// `ioreg` text output: every `"Key" = value` line, values parsed (numbers, "strings", Yes/No,
// <hex data>, (arrays), {dictionaries}). Later duplicates win.
Json ParseIoregProperties(const std::string& text);
// One ioreg value ("{...}", "(...)", 123, "s", Yes); an error names the offset.
absl::StatusOr<Json> ParseIoregValue(const std::string& text);

// IOHIDSystem's HIDIdleTime (nanoseconds since the last input event).
std::optional<absl::Duration> HidIdleTime(const Json& properties);

struct ConsoleState {
  bool console_user = false;  // a session is on the console
  bool locked = false;        // that session's screen is locked
};
// The IORegistry root's IOConsoleUsers array.
ConsoleState ReadConsoleUsers(const Json& console_users);

struct PowerState {
  bool on_ac = true;
  std::optional<double> battery_percent;  // internal battery only
};
// IOPSGetPowerSourceDescription dictionaries (an array of them): only InternalBattery counts; a
// UPS never makes the machine "on battery".
PowerState ReadPowerSources(const Json& descriptions);
// `pmset -g batt`.
absl::StatusOr<PowerState> ParsePmsetBatt(const std::string& text);

// Whether a process other than `own_pid` prevents display sleep (video, calls): from
// IOPMCopyAssertionsByProcess converted to {"pid": [ {"AssertType": ...}, ...]} ...
bool OthersPreventDisplaySleep(const Json& assertions_by_process, int own_pid);
// ... or from `pmset -g assertions` text.
bool ParsePmsetAssertionsPreventDisplaySleep(const std::string& text, int own_pid);

// notify key com.apple.system.thermalpressurelevel (0 nominal, 1 moderate, 2 heavy, 3 trapping, 4 sleeping).
Thermal ThermalFromPressureLevel(uint64_t level);
// sysctl kern.memorystatus_vm_pressure_level (1 normal, 2 warn, 4 critical).
std::optional<MemoryPressure> MemoryFromPressureLevel(int level);
// IOAccelerator's PerformanceStatistics: "Device Utilization %" as 0..1.
std::optional<double> AcceleratorUtilization(const Json& performance_statistics);

}  // namespace minions::availability::macos
