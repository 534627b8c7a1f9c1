#pragma once
// What this machine offers, as reported when an executor registers: its OS, chip, memory, its
// accelerator and the memory a task may use under the owner's limits, the runners it offers and
// the models its cache holds.
//
// The accelerator: on macOS the Metal device and its recommended working-set size (the most a
// process should keep resident for the GPU; unified memory); on Linux an NVIDIA GPU through NVML,
// loaded with dlopen so the build never needs the driver (the devices' total memory); else the
// CPU and the machine's memory. Usable memory is that, times the owner's memory share
// (availability PolicyConfig::max_memory_share).
// Threads: any.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "minions/v1/minions.pb.h"

namespace minions {

struct Accelerator {
  std::string kind = "cpu";  // model/types.h kAccelerator*
  std::string name;          // device name; "" for the CPU
  int64_t memory_bytes = 0;  // what the device may hold (0: unknown)
  // Shares the machine's memory (the CPU, Metal, integrated GPUs): usable memory never exceeds
  // the machine's. False for a discrete GPU with memory of its own.
  bool unified = true;
};

// The Metal device (macOS), else the NVIDIA GPUs NVML reports (`nvml_library`: the shared object
// to dlopen; tests pass a missing one), else the CPU.
Accelerator DetectAccelerator(const std::string& nvml_library = "libnvidia-ml.so.1");

// Memory a task may use: the accelerator's (the machine's for the CPU), times `owner_share`
// (0 < share <= 1), and never more than the machine's memory for unified memory and the CPU.
int64_t UsableMemoryBytes(const Accelerator& accelerator, int64_t physical_bytes, double owner_share);

struct CapabilityOptions {
  std::string name;                           // "" : the host name
  double owner_memory_share = 1.0;            // the owner's cap on the share of memory work may take
  std::vector<std::string> runners = {"llama"};  // the built-in runner and those the config declares
  std::vector<std::string> models_cached;     // digests the model cache holds
  std::string nvml_library = "libnvidia-ml.so.1";
  // The accelerator the runner's llama.cpp reports (executor/runner_devices.h); unset: probed here
  // (Metal, NVML, else the CPU).
  std::optional<Accelerator> accelerator;
};

v1::Capabilities DetectCapabilities(const CapabilityOptions& options);
inline v1::Capabilities DetectCapabilities(const std::string& name) {
  CapabilityOptions options;
  options.name = name;
  return DetectCapabilities(options);
}

}  // namespace minions
