#pragma once
// Snapshot: what the probes know about the machine's owner and the machine at one moment. Every
// signal is optional: a probe that cannot read something leaves it unknown, and the policy reads
// unknown as "the owner may be there" (fail closed). Each signal says when and where it was read,
// so `minions executor status` can explain a decision.
//
// Threads: a plain value; copy it freely.

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace minions::availability {

enum class Thermal { kNominal, kFair, kSerious, kCritical };
enum class MemoryPressure { kNormal, kWarn, kCritical };

const char* ThermalName(Thermal t);
const char* MemoryPressureName(MemoryPressure m);

template <typename T>
struct Signal {
  std::optional<T> value;  // nullopt: unknown
  absl::Time at = absl::InfinitePast();
  std::string source;      // e.g. "logind", "/proc/stat", "ioreg HIDIdleTime"

  bool known() const { return value.has_value(); }
  void Set(T v, absl::Time when, std::string from) {
    value = std::move(v);
    at = when;
    source = std::move(from);
  }
};

struct Snapshot {
  // The owner.
  Signal<absl::Time> last_input;       // the last keyboard/mouse/touch event the OS saw
  Signal<absl::Time> owner_activity;   // activity reported by hand (`minions executor activity`)
  Signal<bool> console_user;           // someone is logged in at the machine's screen
  Signal<bool> screen_locked;
  Signal<bool> display_asleep;
  Signal<bool> media_playing;          // another process keeps the display awake (video, a call)
  Signal<std::string> protected_app;   // a running app the owner listed as never to be disturbed; "" none
  // The machine.
  Signal<bool> on_ac;                  // false: running on the internal battery
  Signal<double> battery_percent;      // internal battery charge; unknown/absent on desktops
  Signal<bool> low_power_mode;
  Signal<Thermal> thermal;
  Signal<MemoryPressure> memory;
  Signal<double> other_cpu;            // share of all cores used by processes other than ours, 0..1
  Signal<int> gpu_count;               // 0: no GPU whose use we must watch
  Signal<double> other_gpu;            // busiest GPU's utilisation by other processes, 0..1
  Signal<double> gpu_memory_budget_gb; // macOS: Metal recommended working set (informational)
};

// One line per signal, for `minions executor status` and dry runs.
std::string DescribeSnapshot(const Snapshot& s, absl::Time now);

}  // namespace minions::availability
