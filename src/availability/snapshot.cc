#include "availability/snapshot.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace minions::availability {
namespace {

template <typename T, typename F>
void Line(std::string* out, const char* name, const Signal<T>& s, absl::Time now, F format) {
  absl::StrAppend(out, absl::StrFormat("  %-16s ", name));
  if (!s.known()) {
    absl::StrAppend(out, "unknown", s.source.empty() ? "" : absl::StrCat(" (", s.source, ")"), "\n");
    return;
  }
  absl::StrAppend(out, format(*s.value), "  [", s.source, ", ",
                  absl::FormatDuration(absl::Trunc(now - s.at, absl::Milliseconds(100))), " ago]\n");
}

}  // namespace

std::string DescribeSnapshot(const Snapshot& s, absl::Time now) {
  std::string out;
  auto yes = [](bool b) { return std::string(b ? "yes" : "no"); };
  auto since = [&](absl::Time t) {
    return absl::StrCat(absl::FormatDuration(absl::Trunc(now - t, absl::Seconds(1))), " ago");
  };
  auto share = [](double v) { return absl::StrFormat("%.1f %%", v * 100); };
  Line(&out, "last input", s.last_input, now, since);
  Line(&out, "owner activity", s.owner_activity, now, since);
  Line(&out, "console user", s.console_user, now, yes);
  Line(&out, "screen locked", s.screen_locked, now, yes);
  Line(&out, "display asleep", s.display_asleep, now, yes);
  Line(&out, "media playing", s.media_playing, now, yes);
  Line(&out, "protected app", s.protected_app, now, [](const std::string& v) { return v.empty() ? "none" : v; });
  Line(&out, "on AC power", s.on_ac, now, yes);
  Line(&out, "battery", s.battery_percent, now, [](double v) { return absl::StrFormat("%.0f %%", v); });
  Line(&out, "low power mode", s.low_power_mode, now, yes);
  Line(&out, "thermal", s.thermal, now, [](Thermal t) { return std::string(ThermalName(t)); });
  Line(&out, "memory pressure", s.memory, now, [](MemoryPressure m) { return std::string(MemoryPressureName(m)); });
  Line(&out, "other CPU", s.other_cpu, now, share);
  Line(&out, "GPUs", s.gpu_count, now, [](int n) { return absl::StrCat(n); });
  Line(&out, "other GPU", s.other_gpu, now, share);
  Line(&out, "GPU budget", s.gpu_memory_budget_gb, now, [](double v) { return absl::StrFormat("%.1f GB", v); });
  return out;
}

}  // namespace minions::availability
