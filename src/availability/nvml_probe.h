#pragma once
// NvmlProbe: NVIDIA GPUs through NVML, loaded with dlopen so the build never needs the driver.
// Reports the number of GPUs and the busiest GPU's utilisation by processes outside our tree
// (per-process samples when the driver gives them; otherwise the whole GPU when any other
// process holds a context, and none when only ours do). No library and no /dev/nvidia* means no
// NVIDIA GPU (0); a device node without a loadable library is unknown (fail closed).
//
// Threads: called from the sampler's thread only.

#include <memory>
#include <string>

#include "availability/probe.h"

namespace minions::availability {

class NvmlProbe : public Probe {
 public:
  // `library`: the NVML shared object (tests pass a missing path); `root`: where /dev lives.
  explicit NvmlProbe(std::string root = "/", std::string library = "libnvidia-ml.so.1",
                     std::function<std::vector<int>()> own_pids = nullptr);
  ~NvmlProbe() override;
  std::string name() const override { return "nvml"; }
  absl::Duration cadence() const override { return absl::Seconds(5); }
  void Fill(Snapshot* snapshot, absl::Time now) override;

 private:
  struct Api;
  bool Load();
  std::string root_, library_;
  std::function<std::vector<int>()> own_pids_;
  std::unique_ptr<Api> api_;
  bool tried_ = false;
  unsigned long long last_sample_us_ = 0;
};

}  // namespace minions::availability
