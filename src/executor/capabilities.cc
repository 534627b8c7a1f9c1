#include "executor/capabilities.h"

#include <dlfcn.h>
#include <sys/utsname.h>
#include <unistd.h>
#ifdef __APPLE__
#include <objc/message.h>
#include <objc/runtime.h>
#include <sys/sysctl.h>
#endif

#include <algorithm>

#include <fstream>
#include <string>

#include "minions/version.h"

namespace minions {
namespace {

std::string ChipName() {
#ifdef __APPLE__
  char buf[256];
  size_t size = sizeof(buf);
  if (sysctlbyname("machdep.cpu.brand_string", buf, &size, nullptr, 0) == 0) return std::string(buf);
  return "apple";
#else
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown";
#endif
}

int64_t MemoryBytes() {
#ifdef __APPLE__
  int64_t mem = 0;
  size_t size = sizeof(mem);
  if (sysctlbyname("hw.memsize", &mem, &size, nullptr, 0) == 0) return mem;
  return 0;
#else
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
#endif
}

#ifdef __APPLE__
// The Metal device through the Objective-C runtime's C interface (this file is C++, not
// Objective-C++): MTLCreateSystemDefaultDevice, then -name and -recommendedMaxWorkingSetSize.
// NOT COMPILED on the Linux build machines: keep it this small, and review it on a Mac.
extern "C" void* MTLCreateSystemDefaultDevice(void);

bool MetalDevice(Accelerator* out) {
  void* device = MTLCreateSystemDefaultDevice();
  if (device == nullptr) return false;
  using IdGetter = void* (*)(void*, SEL);
  using U64Getter = uint64_t (*)(void*, SEL);
  using CStringGetter = const char* (*)(void*, SEL);
  using Release = void (*)(void*, SEL);
  void* name = reinterpret_cast<IdGetter>(objc_msgSend)(device, sel_registerName("name"));
  const char* text = name ? reinterpret_cast<CStringGetter>(objc_msgSend)(name, sel_registerName("UTF8String")) : nullptr;
  out->kind = "metal";
  out->name = text ? text : "Apple GPU";
  out->memory_bytes = static_cast<int64_t>(
      reinterpret_cast<U64Getter>(objc_msgSend)(device, sel_registerName("recommendedMaxWorkingSetSize")));
  reinterpret_cast<Release>(objc_msgSend)(device, sel_registerName("release"));
  return true;
}
#endif

// NVIDIA GPUs through NVML (the types as the driver's nvml.h declares them; a stable ABI).
bool NvmlDevices(const std::string& library, Accelerator* out) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return false;
  struct Memory {
    unsigned long long total, free, used;
  };
  using Init = int (*)();
  using Count = int (*)(unsigned int*);
  using ByIndex = int (*)(unsigned int, void**);
  using Name = int (*)(void*, char*, unsigned int);
  using MemoryInfo = int (*)(void*, Memory*);
  auto init = reinterpret_cast<Init>(dlsym(handle, "nvmlInit_v2"));
  auto shutdown = reinterpret_cast<Init>(dlsym(handle, "nvmlShutdown"));
  auto count = reinterpret_cast<Count>(dlsym(handle, "nvmlDeviceGetCount_v2"));
  auto by_index = reinterpret_cast<ByIndex>(dlsym(handle, "nvmlDeviceGetHandleByIndex_v2"));
  auto name = reinterpret_cast<Name>(dlsym(handle, "nvmlDeviceGetName"));
  auto memory = reinterpret_cast<MemoryInfo>(dlsym(handle, "nvmlDeviceGetMemoryInfo"));
  bool found = false;
  unsigned int n = 0;
  if (init && count && by_index && name && memory && init() == 0) {
    if (count(&n) == 0 && n > 0) {
      int64_t total = 0;
      std::string first;
      for (unsigned int i = 0; i < n; ++i) {
        void* device = nullptr;
        if (by_index(i, &device) != 0) continue;
        Memory info{};
        if (memory(device, &info) == 0) total += static_cast<int64_t>(info.total);
        char text[96] = {};
        if (first.empty() && name(device, text, sizeof(text)) == 0) first = text;
      }
      out->kind = "cuda";
      out->name = first.empty() ? "NVIDIA GPU" : first;
      if (n > 1) out->name += " x" + std::to_string(n);
      out->memory_bytes = total;
      out->unified = false;
      found = true;
    }
    if (shutdown) shutdown();
  }
  dlclose(handle);
  return found;
}

}  // namespace

Accelerator DetectAccelerator(const std::string& nvml_library) {
  Accelerator accelerator;
#ifdef __APPLE__
  if (MetalDevice(&accelerator)) return accelerator;
#endif
  if (NvmlDevices(nvml_library, &accelerator)) return accelerator;
  return accelerator;
}

int64_t UsableMemoryBytes(const Accelerator& accelerator, int64_t physical_bytes, double owner_share) {
  const double share = owner_share > 0 && owner_share <= 1 ? owner_share : 1.0;
  int64_t device = accelerator.memory_bytes > 0 ? accelerator.memory_bytes : physical_bytes;
  // Unified memory (Metal, integrated GPUs) and the CPU share the machine's memory with everything else.
  if (accelerator.unified && physical_bytes > 0) device = std::min(device, physical_bytes);
  return static_cast<int64_t>(static_cast<double>(device) * share);
}

v1::Capabilities DetectCapabilities(const CapabilityOptions& options) {
  const std::string& name = options.name;
  v1::Capabilities c;
  struct utsname u;
  std::string host = "unknown";
  if (uname(&u) == 0) host = u.nodename;
  c.set_name(name.empty() ? host : name);
#ifdef __APPLE__
  c.set_os("macos");
#else
  c.set_os("linux");
#endif
  c.set_chip(ChipName());
  c.set_memory_bytes(MemoryBytes());
  const Accelerator accelerator = options.accelerator ? *options.accelerator : DetectAccelerator(options.nvml_library);
  c.set_accelerator(accelerator.kind);
  c.set_gpu(accelerator.name);
  c.set_usable_memory_bytes(UsableMemoryBytes(accelerator, c.memory_bytes(), options.owner_memory_share));
  for (const std::string& runner : options.runners) c.add_runners(runner);
  for (const std::string& digest : options.models_cached) c.add_models(digest);
  c.set_max_tasks(1);
  c.set_version(kVersion);
  return c;
}

}  // namespace minions
