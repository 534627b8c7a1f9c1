// The Apple-only half of the macOS probes: reads IOKit, IOPowerSources, IOPM assertions, notify
// and sysctl, converts CoreFoundation values to Json, and leaves every interpretation to
// macos_parse.cc (tested on Linux). Built only on macOS; kept thin on purpose.
#ifdef __APPLE__

#include <CoreFoundation/CoreFoundation.h>
#include <IOKit/IOKitLib.h>
#include <IOKit/ps/IOPowerSources.h>
#include <IOKit/ps/IOPSKeys.h>
#include <IOKit/pwr_mgt/IOPMLib.h>
#include <libproc.h>
#include <mach/mach.h>
#include <mach/mach_time.h>
#include <notify.h>
#include <objc/message.h>
#include <objc/runtime.h>
#include <sys/sysctl.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "availability/macos_parse.h"
#include "availability/probe.h"
#include "availability/sleep_guard.h"

// Metal's C entry point (declared in Objective-C headers; an NSArray<id<MTLDevice>> *, +1).
extern "C" id MTLCopyAllDevices(void);

namespace minions::availability {
namespace {

Json FromCF(CFTypeRef v) {
  if (!v) return nullptr;
  CFTypeID t = CFGetTypeID(v);
  if (t == CFBooleanGetTypeID()) return CFBooleanGetValue(static_cast<CFBooleanRef>(v)) != 0;
  if (t == CFNumberGetTypeID()) {
    double d = 0;
    CFNumberGetValue(static_cast<CFNumberRef>(v), kCFNumberDoubleType, &d);
    return d;
  }
  if (t == CFStringGetTypeID()) {
    char buffer[1024];
    if (CFStringGetCString(static_cast<CFStringRef>(v), buffer, sizeof buffer, kCFStringEncodingUTF8)) {
      return std::string(buffer);
    }
    return "";
  }
  if (t == CFArrayGetTypeID()) {
    Json out = Json::array();
    CFArrayRef a = static_cast<CFArrayRef>(v);
    for (CFIndex i = 0; i < CFArrayGetCount(a); ++i) out.push_back(FromCF(CFArrayGetValueAtIndex(a, i)));
    return out;
  }
  if (t == CFDictionaryGetTypeID()) {
    Json out = Json::object();
    CFDictionaryRef d = static_cast<CFDictionaryRef>(v);
    CFIndex n = CFDictionaryGetCount(d);
    std::vector<const void*> keys(n), values(n);
    CFDictionaryGetKeysAndValues(d, keys.data(), values.data());
    for (CFIndex i = 0; i < n; ++i) {
      Json key = FromCF(static_cast<CFTypeRef>(keys[i]));
      out[key.is_string() ? key.get<std::string>() : key.dump()] = FromCF(static_cast<CFTypeRef>(values[i]));
    }
    return out;
  }
  return nullptr;
}

Json RegistryProperty(io_registry_entry_t entry, const char* key) {
  CFStringRef name = CFStringCreateWithCString(nullptr, key, kCFStringEncodingUTF8);
  CFTypeRef value = IORegistryEntryCreateCFProperty(entry, name, kCFAllocatorDefault, 0);
  CFRelease(name);
  Json out = FromCF(value);
  if (value) CFRelease(value);
  return out;
}

// Input idle, console user and lock: every second (IORegistry reads are cheap).
class HidProbe : public Probe {
 public:
  std::string name() const override { return "IOHIDSystem"; }
  // HIDIdleTime often (a key press is seen within 250 ms); console and display every second.
  absl::Duration cadence() const override { return absl::Milliseconds(250); }
  void Fill(Snapshot* s, absl::Time now) override {
    ReadIdle(s, now);
    if (++calls_ % 4 == 1) ReadConsole(s, now);
  }

 private:
  int calls_ = 0;
  void ReadIdle(Snapshot* s, absl::Time now) {
    io_service_t hid = IOServiceGetMatchingService(kIOMainPortDefault, IOServiceMatching("IOHIDSystem"));
    if (hid) {
      Json props = {{"HIDIdleTime", RegistryProperty(hid, "HIDIdleTime")}};
      IOObjectRelease(hid);
      if (auto idle = macos::HidIdleTime(props)) s->last_input.Set(now - *idle, now, "IOHIDSystem HIDIdleTime");
    }
  }
  void ReadConsole(Snapshot* s, absl::Time now) {
    io_registry_entry_t root = IORegistryGetRootEntry(kIOMainPortDefault);
    macos::ConsoleState console = macos::ReadConsoleUsers(RegistryProperty(root, "IOConsoleUsers"));
    IOObjectRelease(root);
    s->console_user.Set(console.console_user, now, "IOConsoleUsers");
    s->screen_locked.Set(console.locked, now, "IOConsoleUsers");
    // Display sleep: the display wrangler's power state below "on" (4).
    io_service_t wrangler = IOServiceGetMatchingService(kIOMainPortDefault, IOServiceMatching("IODisplayWrangler"));
    if (wrangler) {
      Json pm = RegistryProperty(wrangler, "IOPowerManagement");
      IOObjectRelease(wrangler);
      if (pm.is_object() && JsonField(pm, "CurrentPowerState").is_number()) {
        s->display_asleep.Set(JsonDouble(pm, "CurrentPowerState") < 4, now, "IODisplayWrangler");
      }
    }
  }
};

// Power, assertions, thermal and memory pressure, GPU: every 5 s.
class SystemProbe : public Probe {
 public:
  std::string name() const override { return "IOKit"; }
  absl::Duration cadence() const override { return absl::Seconds(5); }
  void Fill(Snapshot* s, absl::Time now) override {
    CFTypeRef info = IOPSCopyPowerSourcesInfo();
    if (info) {
      CFArrayRef list = IOPSCopyPowerSourcesList(info);
      Json descriptions = Json::array();
      for (CFIndex i = 0; list && i < CFArrayGetCount(list); ++i) {
        descriptions.push_back(FromCF(IOPSGetPowerSourceDescription(info, CFArrayGetValueAtIndex(list, i))));
      }
      if (list) CFRelease(list);
      CFRelease(info);
      macos::PowerState power = macos::ReadPowerSources(descriptions);
      s->on_ac.Set(power.on_ac, now, "IOPowerSources");
      if (power.battery_percent) s->battery_percent.Set(*power.battery_percent, now, "IOPowerSources");
    }
    CFDictionaryRef by_process = nullptr;
    if (IOPMCopyAssertionsByProcess(&by_process) == kIOReturnSuccess && by_process) {
      Json converted = Json::object();
      CFIndex n = CFDictionaryGetCount(by_process);
      std::vector<const void*> keys(n), values(n);
      CFDictionaryGetKeysAndValues(by_process, keys.data(), values.data());
      for (CFIndex i = 0; i < n; ++i) {
        int pid = 0;
        CFNumberGetValue(static_cast<CFNumberRef>(keys[i]), kCFNumberIntType, &pid);
        converted[std::to_string(pid)] = FromCF(static_cast<CFTypeRef>(values[i]));
      }
      CFRelease(by_process);
      s->media_playing.Set(macos::OthersPreventDisplaySleep(converted, getpid()), now, "IOPMAssertionsByProcess");
    }
    int token;
    if (notify_register_check("com.apple.system.thermalpressurelevel", &token) == NOTIFY_STATUS_OK) {
      uint64_t level = 0;
      if (notify_get_state(token, &level) == NOTIFY_STATUS_OK) {
        s->thermal.Set(macos::ThermalFromPressureLevel(level), now, "thermalpressurelevel");
      }
      notify_cancel(token);
    }
    int pressure = 0;
    size_t size = sizeof pressure;
    if (sysctlbyname("kern.memorystatus_vm_pressure_level", &pressure, &size, nullptr, 0) == 0) {
      if (auto m = macos::MemoryFromPressureLevel(pressure)) s->memory.Set(*m, now, "memorystatus_vm_pressure_level");
    }
    // Low Power Mode: -[NSProcessInfo isLowPowerModeEnabled], through the Objective-C runtime.
    id info = reinterpret_cast<id (*)(Class, SEL)>(objc_msgSend)(objc_getClass("NSProcessInfo"),
                                                                 sel_registerName("processInfo"));
    SEL low_power = sel_registerName("isLowPowerModeEnabled");
    if (info && class_respondsToSelector(object_getClass(info), low_power)) {
      bool low = reinterpret_cast<BOOL (*)(id, SEL)>(objc_msgSend)(info, low_power);
      s->low_power_mode.Set(low, now, "NSProcessInfo");
    }
    if (metal_budget_gb_ < 0) metal_budget_gb_ = MetalWorkingSetGb();
    if (metal_budget_gb_ > 0) s->gpu_memory_budget_gb.Set(metal_budget_gb_, now, "MTLDevice");
    // GPU: the accelerator's utilisation (Apple silicon has one GPU).
    io_service_t accel = IOServiceGetMatchingService(kIOMainPortDefault, IOServiceMatching("IOAccelerator"));
    if (accel) {
      Json stats = RegistryProperty(accel, "PerformanceStatistics");
      IOObjectRelease(accel);
      s->gpu_count.Set(1, now, "IOAccelerator");
      if (auto util = macos::AcceleratorUtilization(stats)) {
        // Our own runner's share cannot be split out cheaply; while we run, the policy's pause
        // rule watches only the time before we started (see docs/availability.md).
        s->other_gpu.Set(*util, now, "IOAccelerator");
      }
    } else {
      s->gpu_count.Set(0, now, "no IOAccelerator");
    }
    ReadCpu(s, now);
  }

 private:
  // Others' CPU share: host ticks minus this process's and its children's CPU time.
  void ReadCpu(Snapshot* s, absl::Time now) {
    host_cpu_load_info_data_t load;
    mach_msg_type_number_t count = HOST_CPU_LOAD_INFO_COUNT;
    if (host_statistics(mach_host_self(), HOST_CPU_LOAD_INFO, reinterpret_cast<host_info_t>(&load), &count) !=
        KERN_SUCCESS) {
      return;
    }
    double busy = 0, total = 0;
    for (int i = 0; i < CPU_STATE_MAX; ++i) total += load.cpu_ticks[i];
    busy = total - load.cpu_ticks[CPU_STATE_IDLE];
    double hz = sysconf(_SC_CLK_TCK);
    mach_timebase_info_data_t timebase;
    mach_timebase_info(&timebase);
    double ours = 0;
    std::vector<pid_t> pids = {getpid()};
    pid_t children[256];
    int n = proc_listchildpids(getpid(), children, sizeof children);
    for (int i = 0; i < n && i < 256; ++i) pids.push_back(children[i]);
    for (pid_t pid : pids) {
      rusage_info_v2 info;
      if (proc_pid_rusage(pid, RUSAGE_INFO_V2, reinterpret_cast<rusage_info_t*>(&info)) == 0) {
        double ns = static_cast<double>(info.ri_user_time + info.ri_system_time) * timebase.numer / timebase.denom;
        ours += ns / 1e9 * hz;
      }
    }
    if (last_total_ > 0 && total > last_total_) {
      double other = (busy - last_busy_ - std::max(0.0, ours - last_ours_)) / (total - last_total_);
      s->other_cpu.Set(std::clamp(other, 0.0, 1.0), now, "host_statistics");
    }
    last_total_ = total;
    last_busy_ = busy;
    last_ours_ = ours;
  }
  // MTLDevice.recommendedMaxWorkingSetSize of the first device (MTLCopyAllDevices works in a
  // daemon, MTLCreateSystemDefaultDevice may not); 0 when there is none.
  static double MetalWorkingSetGb() {
    id devices = MTLCopyAllDevices();
    if (!devices) return 0;
    id device = reinterpret_cast<id (*)(id, SEL)>(objc_msgSend)(devices, sel_registerName("firstObject"));
    double gb = 0;
    if (device) {
      uint64_t bytes = reinterpret_cast<uint64_t (*)(id, SEL)>(objc_msgSend)(
          device, sel_registerName("recommendedMaxWorkingSetSize"));
      gb = static_cast<double>(bytes) / (1ull << 30);
    }
    reinterpret_cast<void (*)(id, SEL)>(objc_msgSend)(devices, sel_registerName("release"));
    return gb;
  }
  double last_total_ = 0, last_busy_ = 0, last_ours_ = 0;
  double metal_budget_gb_ = -1;
};

// Protected apps by process name (proc_listallpids + proc_name).
class PsProtectedAppProbe : public Probe {
 public:
  explicit PsProtectedAppProbe(std::vector<std::string> names) : names_(std::move(names)) {}
  std::string name() const override { return "protected apps"; }
  absl::Duration cadence() const override { return absl::Seconds(5); }
  void Fill(Snapshot* s, absl::Time now) override {
    std::vector<pid_t> pids(4096);
    int n = proc_listallpids(pids.data(), static_cast<int>(pids.size() * sizeof(pid_t)));
    for (int i = 0; i < n && i < static_cast<int>(pids.size()); ++i) {
      char name[256] = {0};
      if (proc_name(pids[i], name, sizeof name) <= 0) continue;
      for (const auto& wanted : names_) {
        if (wanted == name) return s->protected_app.Set(wanted, now, "proc_name");
      }
    }
    s->protected_app.Set("", now, "proc_name");
  }

 private:
  std::vector<std::string> names_;
};

}  // namespace

std::vector<std::unique_ptr<Probe>> PlatformProbes(const ProbeOptions& options) {
  std::vector<std::unique_ptr<Probe>> probes;
  probes.push_back(std::make_unique<HidProbe>());
  probes.push_back(std::make_unique<SystemProbe>());
  if (!options.protected_apps.empty()) {
    probes.push_back(std::make_unique<PsProtectedAppProbe>(options.protected_apps));
  }
  return probes;
}

// --- SleepGuard ---

struct SleepGuard::Impl {
  IOPMAssertionID id = 0;
};
SleepGuard::SleepGuard() : impl_(std::make_unique<Impl>()) {}
SleepGuard::~SleepGuard() { Set(false, true); }
void SleepGuard::Set(bool running, bool on_ac) {
  bool want = running && on_ac;
  if (want && !impl_->id) {
    IOPMAssertionCreateWithName(kIOPMAssertionTypePreventUserIdleSystemSleep, kIOPMAssertionLevelOn,
                                CFSTR("Minions executor running a batch task on AC power"), &impl_->id);
  } else if (!want && impl_->id) {
    IOPMAssertionRelease(impl_->id);
    impl_->id = 0;
  }
  held_ = impl_->id != 0;
}

}  // namespace minions::availability

#endif  // __APPLE__
