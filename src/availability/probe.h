#pragma once
// Probe: reads some signals of the machine into a Snapshot. Probes never decide anything; the
// policy does. A probe that cannot read a signal leaves it unknown and says why in its source.
//
// Threads: a probe is called from one thread at a time (the sampler's).

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "availability/snapshot.h"

namespace minions::availability {

class Probe {
 public:
  virtual ~Probe() = default;
  virtual std::string name() const = 0;
  // How often the sampler calls Fill (input idle every second, CPU/GPU every 5 s, power, thermal
  // and memory every 30 s unless they push).
  virtual absl::Duration cadence() const = 0;
  virtual void Fill(Snapshot* snapshot, absl::Time now) = 0;
};

// Where the probes of this platform look, and what they must not count as someone else's use.
struct ProbeOptions {
  std::string root = "/";                  // tests point this at a fixture tree
  std::vector<std::string> protected_apps; // process names the owner never wants disturbed
  bool logind = true;                      // Linux: ask systemd-logind over the system bus
  bool input_devices = true;               // Linux: watch /dev/input/event*
  // ... only when logind cannot tell the owner's idle time (no console session): setting
  // probe_input_devices = auto (the default); "true" watches them whatever logind says.
  bool input_devices_defer_to_logind = true;
  bool nvml = true;                        // Linux: NVIDIA GPUs through libnvidia-ml
  // The pids whose CPU and GPU use is ours (the executor and its runner). Empty: this process
  // and its descendants, found by scanning /proc (costly on a busy machine, every 5 s).
  std::function<std::vector<int>()> own_pids;
};

// The probes of the platform this binary was built for.
std::vector<std::unique_ptr<Probe>> PlatformProbes(const ProbeOptions& options);

// The pids this process and its children use (their CPU and GPU use is not "other").
std::vector<int> OwnProcessTree(const std::string& root);

}  // namespace minions::availability
