#include "executor/capabilities.h"

#include <sys/utsname.h>
#include <unistd.h>
#ifdef __APPLE__
#include <sys/sysctl.h>
#endif

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

}  // namespace

v1::Capabilities DetectCapabilities(const std::string& name) {
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
  c.add_runners("llama");
  c.set_max_tasks(1);
  c.set_version(kVersion);
  return c;
}

}  // namespace minions
