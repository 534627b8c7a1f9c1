// The probes of a Linux (or other non-Apple) machine, and the SleepGuard that does nothing there.
#ifndef __APPLE__

#include <unistd.h>

#include "availability/linux_probes.h"
#include "availability/logind_probe.h"
#include "availability/nvml_probe.h"
#include "availability/sleep_guard.h"

namespace minions::availability {

std::vector<std::unique_ptr<Probe>> PlatformProbes(const ProbeOptions& options) {
  std::vector<std::unique_ptr<Probe>> probes;
  if (options.logind) probes.push_back(std::make_unique<LogindProbe>("", getpid()));
  if (options.input_devices) {
    probes.push_back(std::make_unique<InputDeviceProbe>(options.root, options.logind && options.input_devices_defer_to_logind));
  }
  probes.push_back(std::make_unique<ProcCpuProbe>(options.root, getpid(), options.own_pids));
  probes.push_back(std::make_unique<MemoryProbe>(options.root));
  probes.push_back(std::make_unique<PowerSupplyProbe>(options.root));
  probes.push_back(std::make_unique<ThermalZoneProbe>(options.root));
  if (options.nvml) {
    probes.push_back(std::make_unique<NvmlProbe>(options.root, "libnvidia-ml.so.1", options.own_pids));
  } else {
    // Told not to look: a machine whose GPUs are not the owner's concern.
    struct NoGpu : Probe {
      std::string name() const override { return "no GPU probe"; }
      absl::Duration cadence() const override { return absl::Hours(1); }
      void Fill(Snapshot* s, absl::Time now) override { s->gpu_count.Set(0, now, "GPU probe disabled"); }
    };
    probes.push_back(std::make_unique<NoGpu>());
  }
  if (!options.protected_apps.empty()) {
    probes.push_back(std::make_unique<ProtectedAppProbe>(options.root, options.protected_apps));
  }
  return probes;
}

struct SleepGuard::Impl {};
SleepGuard::SleepGuard() = default;
SleepGuard::~SleepGuard() = default;
void SleepGuard::Set(bool, bool) {}

}  // namespace minions::availability

#endif  // !__APPLE__
