#pragma once
// The devices llama.cpp can compute on in this runner (ggml_backend_dev_count/_get): what
// `minions-llama-runner --devices` prints for the executor, which reports the accelerator in its
// capabilities from it (executor/runner_devices.h). The one place the runner enumerates devices.
//
// Threads: any, after llama.cpp's backends are loaded (LoadLlamaBackends).

#include <string>

#include "common/json_util.h"

namespace minions::llama_runner {

// Registers llama.cpp's backends. A build with dynamically loaded backends (the `vulkan` variant
// links the prebuilt shared libraries of the pinned release: libggml-vulkan.so and the CPU
// variants are loaded at run time) loads them from the folder of the libggml it runs with; a
// static build has them registered already. Idempotent.
void LoadLlamaBackends();

// {"devices": [{"name": "Vulkan0", "description": "llvmpipe (LLVM 15.0.7, 256 bits)",
//   "type": "gpu", "backend": "Vulkan", "memory_total": 8589934592, "memory_free": ...}, ...]}
// type: cpu, gpu, igpu (integrated: shares the machine's memory), accel, other. RPC devices (a
// gang's other machines) are not this machine's and never listed.
Json ListDevices();

}  // namespace minions::llama_runner
