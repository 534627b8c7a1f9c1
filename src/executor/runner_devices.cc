#include "executor/runner_devices.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "common/subprocess.h"
#include "model/types.h"

namespace minions {
namespace {

// GPUs with memory of their own or shared. Not "accel": BLAS and AMX, which work beside the CPU.
bool GpuLike(const RunnerDevice& d) { return d.type == "gpu" || d.type == "igpu"; }

}  // namespace

absl::StatusOr<std::vector<RunnerDevice>> ParseRunnerDevices(std::string_view text) {
  auto json = ParseJson(text);
  if (!json.ok()) return absl::InvalidArgumentError(absl::StrCat("runner devices: ", json.status().message()));
  const Json& list = JsonField(*json, "devices");
  if (!list.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat("runner devices: no \"devices\" list in '", Excerpt(text), "'"));
  }
  // A runner reports the devices of one machine: a handful, never thousands.
  if (list.size() > 256) return absl::InvalidArgumentError("runner devices: more than 256 devices");
  std::vector<RunnerDevice> devices;
  for (const Json& entry : list) {
    if (!entry.is_object()) return absl::InvalidArgumentError("runner devices: a device is not an object");
    RunnerDevice d;
    d.name = JsonString(entry, "name");
    d.description = JsonString(entry, "description");
    d.type = JsonString(entry, "type");
    d.backend = JsonString(entry, "backend");
    d.memory_total = std::max<int64_t>(0, JsonInt(entry, "memory_total"));
    d.memory_free = std::max<int64_t>(0, JsonInt(entry, "memory_free"));
    if (d.name.empty() || d.type.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("runner devices: a device without a name or type in '",
                                                     Excerpt(text), "'"));
    }
    devices.push_back(std::move(d));
  }
  return devices;
}

std::string AcceleratorKind(const std::string& backend) {
  std::string b = absl::AsciiStrToLower(backend);
  if (b == "mtl" || b == "metal") return kAcceleratorMetal;
  if (b == "cuda") return kAcceleratorCuda;
  if (b == "rocm" || b == "hip") return "rocm";
  if (b == "vulkan") return "vulkan";  // model/types.h names cpu, metal and cuda
  return b.empty() ? "gpu" : b;
}

std::optional<Accelerator> AcceleratorFromDevices(const std::vector<RunnerDevice>& devices) {
  auto first = std::find_if(devices.begin(), devices.end(), GpuLike);
  if (first == devices.end()) return std::nullopt;
  Accelerator a;
  a.kind = AcceleratorKind(first->backend);
  a.name = first->description.empty() ? first->name : first->description;
  int n = 0;
  bool integrated = false;
  for (const RunnerDevice& d : devices) {
    if (!GpuLike(d) || d.backend != first->backend) continue;
    ++n;
    a.memory_bytes += d.memory_total;
    integrated = integrated || d.type == "igpu";
  }
  if (n > 1) a.name += " x" + std::to_string(n);
  a.unified = integrated || a.kind == kAcceleratorMetal;
  return a;
}

absl::StatusOr<std::vector<RunnerDevice>> QueryRunnerDevices(const std::vector<std::string>& command,
                                                            const std::vector<std::string>& environment,
                                                            absl::Duration timeout) {
  if (command.empty()) return absl::InvalidArgumentError("runner devices: no runner command");
  Subprocess::Options options;
  options.argv = command;
  options.argv.push_back("--devices");
  options.extra_env = environment;
  auto process = Subprocess::Start(options);
  if (!process.ok()) return process.status();
  // A runner that does not know --devices and speaks the protocol instead ends at once.
  (*process)->CloseStdin();
  const absl::Time deadline = absl::Now() + timeout;
  std::string out;
  for (;;) {
    auto line = (*process)->ReadLine(std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (absl::IsOutOfRange(line.status())) break;
    if (!line.ok()) return absl::DeadlineExceededError("runner devices: the runner did not answer --devices in time");
    out += *line;
    if (out.size() > (1 << 20)) return absl::InvalidArgumentError("runner devices: over 1 MiB of output");
  }
  auto exit = (*process)->Wait(std::max(deadline - absl::Now(), absl::Seconds(1)));
  if (!exit.ok()) return exit.status();
  if (!exit->exited || exit->code != 0) {
    return absl::FailedPreconditionError(absl::StrCat("runner devices: the runner ", exit->ToString(),
                                                      " (does it know --devices?)"));
  }
  return ParseRunnerDevices(out);
}

}  // namespace minions
