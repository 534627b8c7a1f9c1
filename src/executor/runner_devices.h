#pragma once
// The accelerator as llama.cpp sees it: the executor asks its runner program for the devices it
// can compute on (`minions-llama-runner --devices`, started exactly as a real runner is: the same
// command, sandbox and environment) and reports the accelerator they make (kind, device name,
// device memory) in its capabilities. This is what finds a Vulkan device (AMD, Intel, NVIDIA
// through Vulkan, Mesa's lavapipe), CUDA and ROCm devices and Metal alike; the NVML and Metal
// probes in capabilities.cc stay the fallback for runners that cannot say (custom runners,
// older runner builds).
//
// Threads: any. ParseRunnerDevices and AcceleratorFromDevices are pure (the tests feed them the
// device lists of Metal, CUDA and Vulkan machines).

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "executor/capabilities.h"

namespace minions {

// One device of `--devices` (src/runner/llama/devices.h).
struct RunnerDevice {
  std::string name;         // "Vulkan0", "CUDA0", "MTL0", "CPU"
  std::string description;  // "NVIDIA GeForce RTX 4090", "llvmpipe (LLVM 15.0.7, 256 bits)"
  std::string type;         // cpu gpu igpu accel other
  std::string backend;      // "Vulkan", "CUDA", "ROCm", "MTL", "CPU", ...
  int64_t memory_total = 0;
  int64_t memory_free = 0;
};

// Parses `--devices` output ({"devices":[...]}); malformed output is InvalidArgument, saying what
// is wrong (a runner is not trusted to print sense).
absl::StatusOr<std::vector<RunnerDevice>> ParseRunnerDevices(std::string_view json);

// The accelerator kind a backend's name stands for: metal, cuda, rocm, vulkan, sycl, ...; the
// backend's name in lower case for one this code does not know.
std::string AcceleratorKind(const std::string& backend);

// The accelerator these devices make: the GPUs (gpu, igpu; not accel: BLAS, AMX) of the first
// backend that has one; its name is the first device's description (" xN" for N devices), its
// memory their total memory; unified when they are integrated (igpu) or Metal. nullopt when there
// is only the CPU.
std::optional<Accelerator> AcceleratorFromDevices(const std::vector<RunnerDevice>& devices);

// Runs `command` with "--devices" appended (with `environment`, as ProcessRunner does) and parses
// what it prints; an error when it cannot start, fails, prints nothing sensible or takes longer
// than `timeout`.
absl::StatusOr<std::vector<RunnerDevice>> QueryRunnerDevices(const std::vector<std::string>& command,
                                                            const std::vector<std::string>& environment,
                                                            absl::Duration timeout = absl::Seconds(60));

}  // namespace minions
