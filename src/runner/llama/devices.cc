#include "runner/llama/devices.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "common/logging.h"
#include "ggml-backend.h"

namespace minions::llama_runner {
namespace {

const char* TypeName(enum ggml_backend_dev_type type) {
  switch (type) {
    case GGML_BACKEND_DEVICE_TYPE_CPU: return "cpu";
    case GGML_BACKEND_DEVICE_TYPE_GPU: return "gpu";
    case GGML_BACKEND_DEVICE_TYPE_IGPU: return "igpu";
    case GGML_BACKEND_DEVICE_TYPE_ACCEL: return "accel";
    default: return "other";
  }
}

#ifdef MINIONS_GGML_DYNAMIC_BACKENDS
// The folder of the loaded libggml: the backends ship beside it.
std::string GgmlFolder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ggml_backend_load_all_from_path), &info) == 0 || info.dli_fname == nullptr) {
    return ".";
  }
  std::string path = info.dli_fname;
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}
#endif

}  // namespace

void LoadLlamaBackends() {
#ifdef MINIONS_GGML_DYNAMIC_BACKENDS
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string dir = GgmlFolder();
    if (ggml_backend_load((dir + "/libggml-vulkan.so").c_str()) == nullptr) {
      MINIONS_LOG(Warning) << "no Vulkan backend in " << dir << " (is libvulkan1 installed?): the CPU alone";
    }
    // The RPC backend (built from the pinned source beside the package's): a gang's leader
    // reaches its members through it. Without it this runner cannot lead a gang (llama_engine.cc says so).
    (void)ggml_backend_load((dir + "/libggml-rpc.so").c_str());
    // One CPU variant, the first this CPU runs, best first; never the AMX one (sapphirerapids):
    // its kernels crash where the CPU reports AMX without granting its tile state, and compute
    // other bits than the CPU build's (scripts/lib/llama.sh builds that without AMX too).
    for (const char* variant : {"zen4", "icelake", "cooperlake", "cascadelake", "cannonlake", "skylakex", "alderlake",
                                "haswell", "ivybridge", "sandybridge", "piledriver", "sse42", "x64"}) {
      if (ggml_backend_load((dir + "/libggml-cpu-" + variant + ".so").c_str()) != nullptr) return;
    }
    MINIONS_LOG(Warning) << "no CPU backend in " << dir << " runs on this CPU";
  });
#endif
}

Json ListDevices() {
  LoadLlamaBackends();
  ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
  Json devices = Json::array();
  for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
    ggml_backend_dev_t dev = ggml_backend_dev_get(i);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    if (rpc != nullptr && reg == rpc) continue;
    size_t free = 0, total = 0;
    ggml_backend_dev_memory(dev, &free, &total);
    const char* description = ggml_backend_dev_description(dev);
    devices.push_back({{"name", ggml_backend_dev_name(dev)},
                       {"description", description ? description : ""},
                       {"type", TypeName(ggml_backend_dev_type(dev))},
                       {"backend", reg ? ggml_backend_reg_name(reg) : ""},
                       {"memory_total", static_cast<int64_t>(total)},
                       {"memory_free", static_cast<int64_t>(free)}});
  }
  return Json{{"devices", devices}};
}

std::vector<ggml_backend_dev_t> LocalAccelerators() {
  ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
  std::vector<ggml_backend_dev_t> local;
  for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
    ggml_backend_dev_t dev = ggml_backend_dev_get(i);
    auto type = ggml_backend_dev_type(dev);
    if ((type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU) &&
        (rpc == nullptr || ggml_backend_dev_backend_reg(dev) != rpc)) {
      local.push_back(dev);
    }
  }
  return local;
}

namespace {
std::mutex g_facts_mu;
Json g_load_facts;  // guarded by g_facts_mu
}  // namespace

void NoteLoadLine(const char* text) {
  if (std::strncmp(text, "load_tensors: ", 14) != 0) return;
  int done = 0, total = 0;
  char buffer[128] = {};
  double mib = 0;
  std::lock_guard<std::mutex> lock(g_facts_mu);
  if (std::sscanf(text, "load_tensors: offloaded %d/%d layers", &done, &total) == 2) {
    g_load_facts["offloaded_layers"] = done;
    g_load_facts["layers"] = total;
  } else if (std::sscanf(text, "load_tensors: %127s model buffer size = %lf MiB", buffer, &mib) == 2) {
    g_load_facts["model_buffers"][buffer] = static_cast<int64_t>(mib * 1024 * 1024);
  }
}

Json TakeLoadFacts() {
  std::lock_guard<std::mutex> lock(g_facts_mu);
  Json facts = std::move(g_load_facts);
  g_load_facts = Json();
  return facts;
}

}  // namespace minions::llama_runner
