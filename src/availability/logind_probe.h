#pragma once
// LogindProbe: the owner as systemd-logind sees them, over D-Bus (sd-bus): sessions on a seat
// (console user), their LockedHint, the manager's IdleHint/IdleSinceHint, and "idle" inhibitors
// held by other processes (video players, calls). Not idle-hinted means active now: the desktop
// sets the hint only after its own idle delay, so this errs toward the owner.
//
// Threads: called from the sampler's thread only. The bus connection is opened lazily and
// reopened after errors.

#include <memory>
#include <string>

#include "availability/probe.h"

namespace minions::availability {

class LogindProbe : public Probe {
 public:
  // `bus_address`: empty for the system bus ($DBUS_SYSTEM_BUS_ADDRESS or the default socket);
  // tests pass a private dbus-daemon's address.
  explicit LogindProbe(std::string bus_address = "", int own_pid = 0);
  ~LogindProbe() override;
  std::string name() const override { return "logind"; }
  absl::Duration cadence() const override { return absl::Seconds(1); }
  void Fill(Snapshot* snapshot, absl::Time now) override;

 private:
  struct Bus;
  std::string address_;
  int own_pid_;
  std::unique_ptr<Bus> bus_;
  absl::Time next_connect_ = absl::InfinitePast();
};

}  // namespace minions::availability
