#pragma once
// Linux probes that read files: /proc and /sys under a root directory (tests use fixture trees),
// and /dev/input event devices. logind and NVML are in their own files.
//
// Threads: each probe is called from one thread at a time.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "availability/probe.h"

namespace minions::availability {

// Share of all cores busy with processes outside this process tree, from /proc/stat deltas minus
// the utime+stime deltas of our own tree (/proc/<pid>/stat). The first call only takes a baseline.
class ProcCpuProbe : public Probe {
 public:
  // `own_pids`: our processes; null: `own_pid` and its descendants (a /proc scan).
  ProcCpuProbe(std::string root, int own_pid, std::function<std::vector<int>()> own_pids = nullptr);
  std::string name() const override { return "/proc/stat"; }
  absl::Duration cadence() const override { return absl::Seconds(5); }
  void Fill(Snapshot* snapshot, absl::Time now) override;

 private:
  std::string root_;
  int own_pid_;
  std::function<std::vector<int>()> own_pids_;
  bool have_baseline_ = false;
  int64_t last_total_ = 0, last_busy_ = 0;
  std::map<int, int64_t> last_ours_;  // pid -> utime+stime ticks
};

// AC and battery from /sys/class/power_supply (Mains/USB online, Battery capacity and status;
// scope=Device supplies such as mice are ignored; a UPS never makes a desktop "on battery").
class PowerSupplyProbe : public Probe {
 public:
  explicit PowerSupplyProbe(std::string root) : root_(std::move(root)) {}
  std::string name() const override { return "power_supply"; }
  absl::Duration cadence() const override { return absl::Seconds(30); }
  void Fill(Snapshot* snapshot, absl::Time now) override;

 private:
  std::string root_;
};

// Thermal level from /sys/class/thermal/thermal_zone*: temperature against the zone's own trip
// points (passive: fair, hot: serious, critical: critical), or 80/90/100 °C without trip points.
class ThermalZoneProbe : public Probe {
 public:
  explicit ThermalZoneProbe(std::string root) : root_(std::move(root)) {}
  std::string name() const override { return "thermal_zone"; }
  absl::Duration cadence() const override { return absl::Seconds(30); }
  void Fill(Snapshot* snapshot, absl::Time now) override;

 private:
  std::string root_;
};

// Memory pressure from /proc/pressure/memory (PSI) and /proc/meminfo: warn when less than 10 %
// is available or tasks stall on memory (some avg10 > 20 %), critical under 5 % or full avg10 > 10 %.
class MemoryProbe : public Probe {
 public:
  explicit MemoryProbe(std::string root) : root_(std::move(root)) {}
  std::string name() const override { return "memory"; }
  absl::Duration cadence() const override { return absl::Seconds(5); }
  void Fill(Snapshot* snapshot, absl::Time now) override;

 private:
  std::string root_;
};

// Input activity from /dev/input/event* (readable by root or the `input` group): any event is
// owner activity. Until the first event the last input counts as "when we started watching".
// `defer_to_logind`: while logind answers for a console session (the snapshot's console_user
// comes from logind and says someone is there), its idle time is the owner's activity and no
// device is opened, so an executor needs no `input` group where logind can tell.
class InputDeviceProbe : public Probe {
 public:
  explicit InputDeviceProbe(std::string root, bool defer_to_logind = false)
      : root_(std::move(root)), defer_to_logind_(defer_to_logind) {}
  ~InputDeviceProbe() override;
  std::string name() const override { return "/dev/input"; }
  // Often while there are devices to watch: this is how fast a key press is seen (one poll() of
  // the open devices per call). Without any, only the rescan for hot-plugged ones.
  absl::Duration cadence() const override {
    return fds_.empty() ? absl::Seconds(30) : absl::Milliseconds(250);
  }
  void Fill(Snapshot* snapshot, absl::Time now) override;

 private:
  void Rescan(absl::Time now);
  void CloseAll();
  std::string root_;
  bool defer_to_logind_;
  std::map<std::string, int> fds_;  // device path -> fd
  absl::Time last_scan_ = absl::InfinitePast();
  absl::Time watching_since_ = absl::InfinitePast();
  absl::Time last_event_ = absl::InfinitePast();
};

// Whether an app the owner listed is running (/proc/<pid>/comm).
class ProtectedAppProbe : public Probe {
 public:
  ProtectedAppProbe(std::string root, std::vector<std::string> names) : root_(std::move(root)), names_(std::move(names)) {}
  std::string name() const override { return "protected apps"; }
  absl::Duration cadence() const override { return absl::Seconds(5); }
  void Fill(Snapshot* snapshot, absl::Time now) override;

 private:
  std::string root_;
  std::vector<std::string> names_;
};

// Total memory in bytes (/proc/meminfo MemTotal), 0 if unknown.
int64_t MemTotalBytes(const std::string& root);
// Resident memory of one process in bytes (/proc/<pid>/status VmRSS), 0 if gone.
int64_t ProcessRssBytes(const std::string& root, int pid);

}  // namespace minions::availability
