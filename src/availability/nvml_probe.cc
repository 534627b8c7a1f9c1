#include "availability/nvml_probe.h"

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"

namespace minions::availability {
namespace {

// The few NVML types used, as the driver's nvml.h declares them (stable ABI).
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlUtilization_t {
  unsigned int gpu, memory;
};
struct nvmlProcessUtilizationSample_t {
  unsigned int pid;
  unsigned long long timeStamp;
  unsigned int smUtil, memUtil, encUtil, decUtil;
};
struct nvmlProcessInfo_v2_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
};
constexpr nvmlReturn_t NVML_SUCCESS = 0;

}  // namespace

struct NvmlProbe::Api {
  void* handle = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*count)(unsigned int*) = nullptr;
  nvmlReturn_t (*by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*process_utilization)(nvmlDevice_t, nvmlProcessUtilizationSample_t*, unsigned int*,
                                      unsigned long long) = nullptr;
  nvmlReturn_t (*compute_processes)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_v2_t*) = nullptr;
  nvmlReturn_t (*graphics_processes)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_v2_t*) = nullptr;
  ~Api() {
    if (shutdown) shutdown();
    if (handle) dlclose(handle);
  }
};

NvmlProbe::NvmlProbe(std::string root, std::string library, std::function<std::vector<int>()> own_pids)
    : root_(std::move(root)), library_(std::move(library)), own_pids_(std::move(own_pids)) {}
NvmlProbe::~NvmlProbe() = default;

bool NvmlProbe::Load() {
  tried_ = true;
  auto api = std::make_unique<Api>();
  api->handle = dlopen(library_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!api->handle) return false;
  auto sym = [&](auto** fn, const char* name) {
    *reinterpret_cast<void**>(fn) = dlsym(api->handle, name);
    return *fn != nullptr;
  };
  if (!sym(&api->init, "nvmlInit_v2") || !sym(&api->count, "nvmlDeviceGetCount_v2") ||
      !sym(&api->by_index, "nvmlDeviceGetHandleByIndex_v2") ||
      !sym(&api->utilization, "nvmlDeviceGetUtilizationRates")) {
    return false;
  }
  sym(&api->shutdown, "nvmlShutdown");
  sym(&api->process_utilization, "nvmlDeviceGetProcessUtilization");
  sym(&api->compute_processes, "nvmlDeviceGetComputeRunningProcesses_v2");
  sym(&api->graphics_processes, "nvmlDeviceGetGraphicsRunningProcesses_v2");
  if (api->init() != NVML_SUCCESS) {
    api->shutdown = nullptr;
    return false;
  }
  api_ = std::move(api);
  return true;
}

void NvmlProbe::Fill(Snapshot* s, absl::Time now) {
  if (!api_ && !tried_) Load();
  if (!api_) {
    std::error_code ec;
    bool device = std::filesystem::exists(std::filesystem::path(root_) / "dev/nvidia0", ec);
    if (device) {
      s->gpu_count = {};
      s->gpu_count.source = absl::StrCat("an NVIDIA device exists but ", library_, " cannot be used");
    } else {
      s->gpu_count.Set(0, now, "no NVIDIA GPU");
    }
    s->other_gpu = {};
    return;
  }
  unsigned int count = 0;
  if (api_->count(&count) != NVML_SUCCESS) {
    s->gpu_count = {};
    s->gpu_count.source = "nvml: device count failed";
    return;
  }
  std::vector<int> tree = own_pids_ ? own_pids_() : OwnProcessTree(root_);
  std::set<unsigned int> ours(tree.begin(), tree.end());
  double busiest = 0;
  bool ok = true;
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t device;
    nvmlUtilization_t util{};
    if (api_->by_index(i, &device) != NVML_SUCCESS || api_->utilization(device, &util) != NVML_SUCCESS) {
      ok = false;
      continue;
    }
    // Who holds contexts on this GPU besides us?
    bool others = false, known = true;
    for (auto list : {api_->compute_processes, api_->graphics_processes}) {
      if (!list) {
        known = false;
        continue;
      }
      std::vector<nvmlProcessInfo_v2_t> procs(64);
      unsigned int n = procs.size();
      if (list(device, &n, procs.data()) != NVML_SUCCESS) {
        known = false;
        continue;
      }
      for (unsigned int k = 0; k < n && k < procs.size(); ++k) others |= !ours.count(procs[k].pid);
    }
    double other = util.gpu / 100.0;
    // Per-process samples, when the driver keeps them: subtract our own.
    std::vector<nvmlProcessUtilizationSample_t> samples(128);
    unsigned int n = samples.size();
    if (api_->process_utilization &&
        api_->process_utilization(device, samples.data(), &n, last_sample_us_) == NVML_SUCCESS) {
      unsigned int mine = 0;
      for (unsigned int k = 0; k < n && k < samples.size(); ++k) {
        if (ours.count(samples[k].pid)) mine = std::max(mine, samples[k].smUtil);
      }
      other = std::max(0.0, other - mine / 100.0);
    } else if (known && !others) {
      other = 0;  // only our processes use it
    }
    busiest = std::max(busiest, other);
  }
  last_sample_us_ = static_cast<unsigned long long>(absl::ToUnixMicros(now - absl::Seconds(6)));
  s->gpu_count.Set(static_cast<int>(count), now, "nvml");
  if (ok) {
    s->other_gpu.Set(busiest, now, "nvml");
  } else {
    s->other_gpu = {};
    s->other_gpu.source = "nvml: utilisation unreadable";
  }
}

}  // namespace minions::availability
